"""Bad input: solve raises an exception."""
import torch


def solve(x, residual, weight):
    raise ValueError("deliberate failure inside solve")
