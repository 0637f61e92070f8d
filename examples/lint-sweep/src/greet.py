def greet(name):
    return "Hello, {}!".format(name)


def shout(name):
    return "HEY %s" % name
