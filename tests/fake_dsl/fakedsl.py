"""A stand-in third kernel DSL for tests: a "kernel" is a Python function over CPU tensors, launched by calling it.

It exists to prove that registering a DSL takes one adapter file and one registry row (an entry point), nothing
else in the benchmark."""


class Kernel:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)


def kernel(fn):
    return Kernel(fn)
