"""Fused residual add + RMSNorm over Llama-3.1-8B's hidden state (hidden 4096): one output, the normalised row.

y = bf16((x + r) * rsqrt(mean((x + r)²) + eps) * w) with eps 1e-5, where the sum x + r is kept in fp32 (never
rounded to bf16) and the mean is taken over that fp32 sum, as upstream's FlashInfer-Trace definition
`fused_add_rmsnorm_h4096` does. Inputs hidden_states, residual and weight must not be modified.
"""
import torch

FAMILY = "mlp_norm"
SOURCE_MODEL = "Llama-3.1-8B"
DTYPE = "bf16"
DEMO = True  # one of the problems `mkb demo` runs
EPS = 1e-5
SIZES = {
    "full": dict(tokens=14509, hidden=4096),
    "odd": dict(tokens=997, hidden=4096),
    "cpu": dict(tokens=64, hidden=512),
    "cpu_odd": dict(tokens=37, hidden=384),
}
OUTPUTS = ("y",)
COMPARE = {"y": "float"}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (s["tokens"], s["hidden"])
    hidden_states = torch.randn(shape, generator=gen, device=device)
    # Outlier channels, as real activations have: a closed-form guess of the row norm must fail.
    outlier_channels = torch.randint(0, s["hidden"], (max(1, s["hidden"] // 512),), generator=gen, device=device)
    hidden_states[:, outlier_channels] *= 20.0
    residual = torch.randn(shape, generator=gen, device=device) * 4.0
    weight = 1.0 + 0.1 * torch.randn(s["hidden"], generator=gen, device=device)
    return hidden_states.bfloat16(), residual.bfloat16(), weight.bfloat16()


def reference(hidden_states, residual, weight):
    acc = torch.promote_types(hidden_states.dtype, torch.float32)
    x = hidden_states.to(acc) + residual.to(acc)
    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return ((x * inv_rms) * weight.to(acc)).to(hidden_states.dtype)


def flops(hidden_states, residual, weight):
    return 5 * hidden_states.numel()


def bytes_moved(hidden_states, residual, weight):
    return 3 * hidden_states.numel() * hidden_states.element_size() + weight.numel() * weight.element_size()
