"""A stand-in third kernel DSL for tests: a "kernel" is a Python function over CPU tensors, launched by calling it.

It exists to prove that registering a DSL takes one adapter file and one registry row (an entry point), nothing
else in the benchmark. Like a real DSL, it lives outside site-packages here (on PYTHONPATH) and imports part of
itself only at the first launch, relatively, inside the graded child."""


class Kernel:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        from . import _launch

        return _launch.launch(self.fn, args)


def kernel(fn):
    return Kernel(fn)
