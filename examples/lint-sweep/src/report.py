import json


def summary(items, limit=None):
    if limit == None:
        limit = len(items)
    unused = 42
    return json.dumps(items[:limit])
