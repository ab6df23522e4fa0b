"""Gated delta rule, single-token decode step (Qwen3-Next GatedDeltaNet: 16 QK heads, 32 V heads, dk = dv = 128).

Per sequence b and value head h (query/key head h // 2), with q and k L2-normalised over dk (eps 1e-6) and
scale = dk^-0.5, the recurrent state S (dk x dv, fp32) advances by one token:
    S ← exp(g[b,h]) · S;   u = beta[b,h] · (v − Sᵀk);   S ← S + k ⊗ u;   o = scale · Sᵀq.
Outputs: o (bf16, [batch, v_heads, dv]) and the new state (fp32, a new tensor; the input state must not change).
g is the log decay (negative), beta the write strength in (0, 1).
"""
import torch

FAMILY = "linear_attention"
SOURCE_MODEL = "Qwen3-Next-80B-A3B"
DTYPE = "bf16"
L2_EPS = 1e-6
SIZES = {
    "full": dict(batch=64, qk_heads=16, v_heads=32, dk=128, dv=128),
    "odd": dict(batch=13, qk_heads=16, v_heads=32, dk=128, dv=128),
    "cpu": dict(batch=2, qk_heads=2, v_heads=4, dk=32, dv=32),
    "cpu_odd": dict(batch=3, qk_heads=1, v_heads=2, dk=64, dv=32),
}
OUTPUTS = ("o", "new_state")
COMPARE = {"o": "float", "new_state": "float"}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    b, hk, hv, dk, dv = s["batch"], s["qk_heads"], s["v_heads"], s["dk"], s["dv"]
    q = torch.randn((b, hk, dk), generator=gen, device=device).bfloat16()
    k = torch.randn((b, hk, dk), generator=gen, device=device).bfloat16()
    v = torch.randn((b, hv, dv), generator=gen, device=device).bfloat16()
    g = -torch.nn.functional.softplus(torch.randn((b, hv), generator=gen, device=device) * 2.0)
    beta = torch.sigmoid(torch.randn((b, hv), generator=gen, device=device) * 2.0)
    head_scale = torch.exp(torch.randn((b, hv, 1, 1), generator=gen, device=device))
    state = torch.randn((b, hv, dk, dv), generator=gen, device=device) * 0.1 * head_scale
    return q, k, v, g, beta, state


def _l2norm(x):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)


def reference(q, k, v, g, beta, state):
    acc = torch.promote_types(state.dtype, torch.float32)
    repeat = v.shape[1] // q.shape[1]
    scale = q.shape[-1] ** -0.5
    qf = _l2norm(q.to(acc)).repeat_interleave(repeat, dim=1)
    kf = _l2norm(k.to(acc)).repeat_interleave(repeat, dim=1)
    s = state.to(acc) * torch.exp(g.to(acc))[..., None, None]
    u = beta.to(acc)[..., None] * (v.to(acc) - torch.einsum("bhk,bhkv->bhv", kf, s))
    s = s + kf[..., :, None] * u[..., None, :]
    o = torch.einsum("bhk,bhkv->bhv", qf * scale, s)
    return o.to(v.dtype), s.to(state.dtype)


def flops(q, k, v, g, beta, state):
    return 6 * state.numel()


def bytes_moved(q, k, v, g, beta, state):
    small = sum(t.numel() * t.element_size() for t in (q, k, v, g, beta))
    return 2 * state.numel() * state.element_size() + small + v.numel() * v.element_size()
