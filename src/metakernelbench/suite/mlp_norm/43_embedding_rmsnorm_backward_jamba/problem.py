"""Backward of an embedding lookup followed by RMSNorm (Jamba: vocab 65 536, hidden 4 096), into the table gradient.

Inputs: grad_output bf16 [B, S, H] (the gradient of y = RMSNorm(h) * w), input_ids int64 [B, S] in [0, 65 536),
hidden_states_fp32 fp32 [B, S, H] (the embedded rows h), rstd fp32 [B, S, 1] (the saved 1 / rms of each row) and
norm_weight bf16 [H]. All arithmetic is fp32, per token: x = h * rstd, g = grad_output * w,
d_h = rstd * (g - x * mean(g * x)) with the mean over H. Outputs, both rounded to bf16 once at the end:
grad_embedding [65 536, H], the fp32 sum of d_h over every token whose id is that row (a repeated id accumulates;
rows no token names are 0), and grad_weight [H] = the fp32 sum over all tokens of grad_output * x. rstd is drawn as
its own input (not recomputed from h), as saved statistics are. Inputs must not be modified.
Inferred where the SOL-ExecBench recipe hides it (inf.): the reference's operation order above, the output order
(table gradient, then weight gradient), bf16 norm_weight, rstd = rsqrt(U[0.5, 2) + 1e-6) (Jamba's rms_norm_eps),
the weight draw N(1, 0.1^2).
"""
import torch

FAMILY = "mlp_norm"
SOURCE_MODEL = "Jamba"
DTYPE = "bf16"
VOCAB_SIZE = 65536
EPS = 1e-6
SIZES = {
    "full": dict(batch=64, seq_len=256, hidden=4096),
    "odd": dict(batch=17, seq_len=293, hidden=4096),
    # The vocabulary is the model's at every size: the table gradient is the output. The CPU sizes shrink the hidden
    # size and keep a few thousand tokens, so repeated ids (and a 5% share of touched rows) still occur.
    "cpu": dict(batch=16, seq_len=256, hidden=128),
    "cpu_odd": dict(batch=13, seq_len=269, hidden=96),
}
OUTPUTS = ("grad_embedding", "grad_weight")
COMPARE = {"grad_embedding": "float", "grad_weight": "float"}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    b, t, h = s["batch"], s["seq_len"], s["hidden"]
    grad_output = torch.randn((b, t, h), generator=gen, device=device, dtype=torch.bfloat16)
    input_ids = torch.randint(0, VOCAB_SIZE, (b, t), generator=gen, device=device, dtype=torch.int64)
    hidden_states_fp32 = torch.randn((b, t, h), generator=gen, device=device, dtype=torch.float32)
    variance = torch.rand((b, t, 1), generator=gen, device=device, dtype=torch.float32) * 1.5 + 0.5
    rstd = torch.rsqrt(variance + EPS)
    norm_weight = torch.randn((h,), generator=gen, device=device, dtype=torch.bfloat16) * 0.1 + 1.0
    return grad_output, input_ids, hidden_states_fp32, rstd, norm_weight


@torch.no_grad()
def reference(grad_output, input_ids, hidden_states_fp32, rstd, norm_weight):
    hidden = grad_output.shape[-1]
    compute_dtype = torch.promote_types(grad_output.dtype, torch.float32)
    grad = grad_output.to(compute_dtype)
    x_hat = hidden_states_fp32.to(compute_dtype) * rstd.to(compute_dtype)
    grad_weight = (grad * x_hat).sum(dim=(0, 1))
    g = grad * norm_weight.to(compute_dtype)
    mean = (g * x_hat).mean(dim=-1, keepdim=True)
    grad_hidden = rstd.to(compute_dtype) * (g - x_hat * mean)
    grad_embedding = torch.zeros((VOCAB_SIZE, hidden), dtype=compute_dtype, device=grad_output.device)
    grad_embedding.index_add_(0, input_ids.reshape(-1), grad_hidden.reshape(-1, hidden))
    return grad_embedding.to(grad_output.dtype), grad_weight.to(grad_output.dtype)


def flops(grad_output, input_ids, hidden_states_fp32, rstd, norm_weight):
    """Per element: x, g, the g*x dot (2), the weight-gradient term (2), d_h (3), the accumulation (1)."""
    return 10 * grad_output.numel()


def bytes_moved(grad_output, input_ids, hidden_states_fp32, rstd, norm_weight):
    """Every input once and every output once: the whole table gradient is written (untouched rows are zeros)."""
    hidden = grad_output.shape[-1]
    inputs = sum(t.numel() * t.element_size() for t in (grad_output, input_ids, hidden_states_fp32, rstd, norm_weight))
    return inputs + (VOCAB_SIZE + 1) * hidden * grad_output.element_size()
