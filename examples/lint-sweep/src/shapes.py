from typing import List


def widths(boxes: List[tuple[int, int]]) -> List[int]:
    return [width for width, _ in boxes]
