import json


def summary(items, limit=None):
    if limit is None:
        limit = len(items)
    return json.dumps(items[:limit])
