

def widths(boxes: list[tuple[int, int]]) -> list[int]:
    return [width for width, _ in boxes]
