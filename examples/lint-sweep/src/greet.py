def greet(name):
    return f"Hello, {name}!"


def shout(name):
    return "HEY %s" % name
