

def totals(rows: list[dict[str, int]]) -> dict[str, int]:
    result: dict[str, int] = {}
    for row in rows:
        for key, value in row.items():
            result[key] = result.get(key, 0) + value
    return result
