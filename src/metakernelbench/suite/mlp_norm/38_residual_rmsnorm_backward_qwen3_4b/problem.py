"""Backward of a residual RMSNorm, y = RMSNorm(h + r) * w, over Qwen3-4B's hidden state (hidden 2560).

Inputs (inf.: dtypes as the recipe's input generator draws them): grad_output [B, S, H] bf16, the saved forward
values normalized = (h + r) * rstd [B, S, H] fp32 and rstd [B, S, 1] fp32, and weight [H] fp32. In fp32, with
g = grad_output widened: grad_weight = sum over all B·S rows of g * normalized; per row, with gn = g * weight,
grad_x = rstd * (gn - normalized * mean(gn * normalized)), the mean over H. Outputs (inf.): grad_hidden =
bf16(grad_x) [B, S, H], grad_residual equal to it but its own tensor (h and r share the gradient of their sum), and
grad_weight [H] fp32. No input is modified.
"""
import torch

FAMILY = "mlp_norm"
SOURCE_MODEL = "Qwen3-4B"
DTYPE = "bf16"
RSTD_EPS = 1e-6  # only the input generator's forward pass uses it
ROW_BLOCK = 16384  # rows per slice of the reference: bounds the fp64 anchor's temporaries at full size
SIZES = {
    "full": dict(batch=64, seq=8192, hidden=2560),
    "odd": dict(batch=3, seq=1111, hidden=2560),
    "cpu": dict(batch=2, seq=64, hidden=512),
    "cpu_odd": dict(batch=3, seq=37, hidden=384),
}
OUTPUTS = ("grad_hidden", "grad_residual", "grad_weight")
COMPARE = {"grad_hidden": "float", "grad_residual": "float", "grad_weight": "float"}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (s["batch"], s["seq"], s["hidden"])
    x = torch.randn(shape, generator=gen, device=device)
    x *= torch.rand((s["batch"], s["seq"], 1), generator=gen, device=device) * 1.5 + 0.5
    rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + RSTD_EPS)
    normalized = x.mul_(rstd)  # in place: at full size each fp32 temporary is 5.4 GB
    weight = torch.randn((s["hidden"],), generator=gen, device=device) * 0.1 + 1.0
    grad_output = torch.randn(shape, generator=gen, device=device)
    grad_output += 0.5 * normalized * weight
    return grad_output.to(torch.bfloat16), normalized, rstd, weight


def reference(grad_output, normalized, rstd, weight):
    compute_dtype = torch.promote_types(grad_output.dtype, torch.float32)
    hidden = grad_output.shape[-1]
    g_rows, n_rows, r_rows = grad_output.reshape(-1, hidden), normalized.reshape(-1, hidden), rstd.reshape(-1, 1)
    grad_x = torch.empty(g_rows.shape, dtype=grad_output.dtype, device=grad_output.device)
    grad_weight = torch.zeros(hidden, dtype=compute_dtype, device=grad_output.device)
    for start in range(0, g_rows.shape[0], ROW_BLOCK):
        rows = slice(start, start + ROW_BLOCK)
        g, n = g_rows[rows].to(compute_dtype), n_rows[rows]
        grad_weight += (g * n).sum(dim=0)
        grad_normalized = g * weight
        mean = (grad_normalized * n).mean(dim=-1, keepdim=True)
        grad_x[rows] = (r_rows[rows] * (grad_normalized - n * mean)).to(grad_output.dtype)
    grad_hidden = grad_x.view(grad_output.shape)
    return grad_hidden, grad_hidden.clone(), grad_weight


def flops(grad_output, normalized, rstd, weight):
    return 8 * grad_output.numel()


def bytes_moved(grad_output, normalized, rstd, weight):
    rows = grad_output.numel() // grad_output.shape[-1]
    per_element = 3 * grad_output.element_size() + normalized.element_size()  # read g and n, write two gradients
    return (grad_output.numel() * per_element + rows * rstd.element_size()
            + 2 * weight.numel() * weight.element_size())
