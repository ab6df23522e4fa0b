"""RMSNorm of Qwen3-30B-A3B's flattened per-head query/key rows (head dim 128), as in its QK-norm.

y = bf16((x * rsqrt(mean(x²) + eps)) * w) per row of 128, with eps 1e-6, where x and w are widened to fp32 and the
mean, the product and the scaling stay in fp32 (upstream's FlashInfer-Trace definition `rmsnorm_h128`). Input
hidden_states [rows, 128] bf16 and weight [128] bf16, neither modified; output bf16 of the same shape.
"""
import torch

FAMILY = "mlp_norm"
SOURCE_MODEL = "Qwen3-30B-A3B"
DTYPE = "bf16"
EPS = 1e-6
SIZES = {
    "full": dict(rows=520128, hidden=128),
    "odd": dict(rows=3001, hidden=128),
    "cpu": dict(rows=256, hidden=128),
    "cpu_odd": dict(rows=37, hidden=128),
}
OUTPUTS = ("y",)
COMPARE = {"y": "float"}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    hidden_states = torch.randn((s["rows"], s["hidden"]), generator=gen, device=device).bfloat16()
    weight = (1.0 + 0.1 * torch.randn(s["hidden"], generator=gen, device=device)).bfloat16()
    return hidden_states, weight


def reference(hidden_states, weight):
    compute_dtype = torch.promote_types(hidden_states.dtype, torch.float32)
    x = hidden_states.to(compute_dtype)
    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return ((x * inv_rms) * weight.to(compute_dtype)).to(hidden_states.dtype)


def flops(hidden_states, weight):
    return 4 * hidden_states.numel()


def bytes_moved(hidden_states, weight):
    return 2 * hidden_states.numel() * hidden_states.element_size() + weight.numel() * weight.element_size()
