"""Fused residual add + RMSNorm (Llama-3.1-8B, hidden 4096): two outputs, the normalised row and the new residual.

residual_out = bf16(x + residual); out = bf16(residual_out * rsqrt(mean(residual_out²) + eps) * weight), where the
norm is taken over the bf16-rounded sum (as vLLM's fused_add_rms_norm does) and accumulated in fp32.
Inputs x and residual must not be modified: both results are new tensors.
"""
import torch

FAMILY = "mlp_norm"
SOURCE_MODEL = "Llama-3.1-8B"
EPS = 1e-5
SIZES = {
    "full": dict(tokens=16384, hidden=4096),
    "odd": dict(tokens=1000, hidden=4096),
    "cpu": dict(tokens=64, hidden=512),
    "cpu_odd": dict(tokens=37, hidden=384),
}
OUTPUTS = ("out", "residual_out")
COMPARE = {"out": "float", "residual_out": "float"}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (s["tokens"], s["hidden"])
    x = torch.randn(shape, generator=gen, device=device)
    outlier_channels = torch.randint(0, s["hidden"], (max(1, s["hidden"] // 512),), generator=gen, device=device)
    x[:, outlier_channels] *= 20.0
    residual = torch.randn(shape, generator=gen, device=device) * 4.0
    weight = 1.0 + 0.1 * torch.randn(s["hidden"], generator=gen, device=device)
    return x.bfloat16(), residual.bfloat16(), weight.bfloat16()


def reference(x, residual, weight):
    acc = torch.promote_types(x.dtype, torch.float32)
    # The bf16 rounding of the sum is part of the semantics, so it stays in the fp64 anchor too.
    residual_out = (x.to(acc) + residual.to(acc)).to(torch.bfloat16)
    h = residual_out.to(acc)
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * weight.to(acc)
    return out.to(x.dtype), residual_out.to(x.dtype)


def flops(x, residual, weight):
    return 5 * x.numel()


def bytes_moved(x, residual, weight):
    return 4 * x.numel() * x.element_size() + weight.numel() * weight.element_size()
