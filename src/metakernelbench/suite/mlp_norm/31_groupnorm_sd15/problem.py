"""GroupNorm with affine over Stable Diffusion 1.5's deepest UNet feature maps (1280 channels at 8x8), fp32.

x [N, C, H, W] fp32 (contiguous NCHW) is split into 32 groups of C/32 consecutive channels (inf.: SD-1.5's
norm_num_groups). For each sample n and group g, over its C/32 * H * W values: mean, and the biased variance
(mean of squared deviations, unbiased=False); then out = (x - mean) / sqrt(var + eps) * weight[c] + bias[c], all in
fp32, with eps the fourth input (a Python float, 1e-5 as the recipe captured it). weight and bias are [C] fp32.
Output fp32 [N, C, H, W]; no input is modified.
"""
import torch

FAMILY = "mlp_norm"
SOURCE_MODEL = "SD-1.5"
DTYPE = "fp32"
NUM_GROUPS = 32
EPS = 1e-5
SIZES = {
    "full": dict(batch=32, channels=1280, height=8, width=8),
    "odd": dict(batch=3, channels=1280, height=9, width=7),
    "cpu": dict(batch=2, channels=128, height=8, width=8),
    "cpu_odd": dict(batch=3, channels=96, height=5, width=7),
}
OUTPUTS = ("out",)
COMPARE = {"out": "float"}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((s["batch"], s["channels"], s["height"], s["width"]), generator=gen, device=device)
    weight = 1.0 + 0.1 * torch.randn(s["channels"], generator=gen, device=device)
    bias = 0.1 * torch.randn(s["channels"], generator=gen, device=device)
    return x, weight, bias, EPS


def reference(x, weight, bias, eps):
    n, c, h, w = x.shape
    compute_dtype = torch.promote_types(x.dtype, torch.float32)
    groups = x.view(n, NUM_GROUPS, c // NUM_GROUPS, h, w).to(compute_dtype)
    mean = groups.mean(dim=(2, 3, 4), keepdim=True)
    var = groups.var(dim=(2, 3, 4), keepdim=True, unbiased=False)
    normalized = ((groups - mean) / torch.sqrt(var + eps)).view(n, c, h, w)
    out = normalized * weight.view(1, c, 1, 1) + bias.view(1, c, 1, 1)
    return out.to(x.dtype)


def flops(x, weight, bias, eps):
    return 8 * x.numel()


def bytes_moved(x, weight, bias, eps):
    return 2 * x.numel() * x.element_size() + (weight.numel() + bias.numel()) * weight.element_size()
