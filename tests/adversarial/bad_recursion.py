"""Bad input: unbounded recursion in solve (RecursionError at Python's default limit)."""
import torch


def _descend(n):
    return _descend(n + 1) + 1


def solve(x, residual, weight):
    return _descend(0)
