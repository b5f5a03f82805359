"""A package installed into a workspace's image (examples/images)."""


def greet():
    return "hello from a package installed before the suspend"
