import sys
import os
from typing import List, Dict


def totals(rows: List[Dict[str, int]]) -> Dict[str, int]:
    result: Dict[str, int] = {}
    for row in rows:
        for key, value in row.items():
            result[key] = result.get(key, 0) + value
    return result
