"""Bad input: lift the recursion limit and recurse in C (repr of a deeply nested list) until the C stack overflows (SIGSEGV)."""
import typing

import torch


def solve(x, residual, weight):
    typing.sys.setrecursionlimit(1 << 30)
    nested = []
    for _ in range(1 << 20):
        nested = [nested]
    return repr(nested)
