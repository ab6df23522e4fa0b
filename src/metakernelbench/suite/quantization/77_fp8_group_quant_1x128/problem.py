"""Per-group 1x128 dynamic FP8 (e4m3) quantisation of activations (DeepSeek-V3 act_quant).

For each row and each group of 128 consecutive columns: scale = max(amax, 1e-10) / 448 in fp32, and
q = e4m3(clamp(x / scale, -448, 448)) rounded to nearest. Outputs: q (float8_e4m3fn, same shape as x) and scales
(fp32, one per group). q is compared after dequantisation (q * scale) with a budget of one e4m3 step; scales as
floats. Activations carry outlier channels, as real ones do.
"""
import torch

FAMILY = "quantization"
SOURCE_MODEL = "DeepSeek-V3"
DTYPE = "fp8"
DEMO = True  # one of the problems `mkb demo` runs
GROUP = 128
FP8_MAX = 448.0
SIZES = {
    "full": dict(tokens=4096, hidden=7168),
    "odd": dict(tokens=777, hidden=7168),
    "cpu": dict(tokens=32, hidden=1024),
    "cpu_odd": dict(tokens=19, hidden=384),
}
OUTPUTS = ("q", "scales")
COMPARE = {"q": {"rule": "fp8_dequant", "scales": "scales", "group": GROUP}, "scales": "float"}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((s["tokens"], s["hidden"]), generator=gen, device=device)
    outliers = torch.randint(0, s["hidden"], (max(1, s["hidden"] // 256),), generator=gen, device=device)
    x[:, outliers] *= 50.0
    x *= torch.exp(torch.randn((s["tokens"], 1), generator=gen, device=device))
    return (x.bfloat16(),)


def reference(x):
    m, k = x.shape
    groups = x.to(torch.float32).view(m, k // GROUP, GROUP)
    scales = groups.abs().amax(-1).clamp(min=1e-10) / FP8_MAX
    q = (groups / scales[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(m, k), scales


def flops(x):
    return 3 * x.numel()


def bytes_moved(x):
    return x.numel() * (x.element_size() + 1) + (x.numel() // GROUP) * 4
