"""Bad input: solve never returns (endless loop)."""
import torch


def solve(x, residual, weight):
    while True:
        pass
