"""Problem 28 in the fake DSL: the kernel computes the whole fused add + RMSNorm."""
import torch

import fakedsl


@fakedsl.kernel
def _fused_add_rmsnorm(x, r, w, out):
    h = x.float() + r.float()
    out.copy_((h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()).to(out.dtype))


def solve(hidden_states, residual, weight):
    out = torch.empty_like(hidden_states)
    _fused_add_rmsnorm(hidden_states, residual, weight, out)
    return out
