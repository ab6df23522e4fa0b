"""Bad input: a file that does not parse."""
import torch


def solve(x, residual, weight)
    return x
