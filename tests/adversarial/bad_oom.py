"""Bad input: allocate and touch memory in 256 MB chunks (up to 12 GB) until the allocation fails."""
import torch

CHUNK = 256 << 20
_hoard = []


def solve(x, residual, weight):
    for _ in range(48):
        _hoard.append(torch.ones(CHUNK, dtype=torch.uint8))
    return x
