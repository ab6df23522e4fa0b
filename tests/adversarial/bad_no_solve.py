"""Bad input: a file without a `solve` function."""
import torch


def solver(x, residual, weight):
    return x
