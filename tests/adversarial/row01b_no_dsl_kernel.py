"""Row 1 (variant): pure eager PyTorch, no DSL kernel at all."""
import torch


def solve(x, residual, weight):
    h = x.float() + residual.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
