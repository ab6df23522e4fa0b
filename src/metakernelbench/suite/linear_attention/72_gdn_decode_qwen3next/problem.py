"""Gated delta rule, one decode step with a k-last recurrent state (Qwen3-Next-80B-A3B at TP=2: 8 QK heads, 16 V heads,
head size 128; upstream's FlashInfer-Trace `gdn_decode_qk8_v16_d128_k_last`).

Gates from raw projections, in fp32: g = exp(−exp(A_log[h]) · softplus(a[b,h] + dt_bias[h])) (torch's softplus,
threshold 20) and β = sigmoid(b[b,h]). V head h reads QK head h // 2; q and k are used as given (no normalisation).
The state is stored k-last: state[b, h] is [V, K], so S = state[b, h]ᵀ is [K, V]. Per (b, h):
    S₀ = g·S;  old_v = kᵀS₀;  new_v = β·v + (1 − β)·old_v;  S₁ = S₀ − k ⊗ old_v + k ⊗ new_v;  o = scale · qᵀS₁,
all in fp32. Outputs: output [B, 1, 16, 128] (o rounded to bf16) and new_state [B, 16, 128, 128] fp32, k-last, a new
tensor (the input state must not change).
"""
import torch
import torch.nn.functional as F

FAMILY = "linear_attention"
SOURCE_MODEL = "Qwen3-Next-80B-A3B"
DTYPE = "bf16"
# Captured gate parameters of the 16 V heads of one TP=2 shard, and the scales of upstream's redraws.
A_LOG = (-0.169921875, 2.34375, 1.3359375, 2.1875, -0.9375, -1.09375, 1.765625, -0.443359375, 0.91015625, -0.8125,
         2.328125, 0.205078125, 1.375, 2.796875, -0.88671875, -1.3046875)
DT_BIAS = (-2.078125, -5.625, -4.3125, -3.421875, -3.796875, -3.296875, -4.375, -6.25, -3.703125, -0.2890625,
           -5.21875, -6.1875, -3.046875, -5.0625, -4.875, -5.34375)
A_MEAN, A_STD, B_MEAN, B_STD = 1.33, 1.56, 0.4, 1.38
Q_STD, K_STD, V_STD, STATE_STD = 0.18, 0.13, 0.073, 0.009
SCALE = 0.08838834764831843
SIZES = {
    "full": dict(batch=64, qk_heads=8, v_heads=16, head=128),
    "odd": dict(batch=13, qk_heads=8, v_heads=16, head=128),
    "cpu": dict(batch=3, qk_heads=2, v_heads=4, head=32),
    "cpu_odd": dict(batch=5, qk_heads=1, v_heads=2, head=64),
}
OUTPUTS = ("output", "new_state")
COMPARE = {"output": "float", "new_state": "float"}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    batch, hk, hv, d = s["batch"], s["qk_heads"], s["v_heads"], s["head"]

    def normal(*shape, std=1.0, mean=0.0):
        return mean + std * torch.randn(shape, generator=gen, device=device, dtype=torch.float32)

    q = normal(batch, 1, hk, d, std=Q_STD).bfloat16()
    k = normal(batch, 1, hk, d, std=K_STD).bfloat16()
    v = normal(batch, 1, hv, d, std=V_STD).bfloat16()
    state = normal(batch, hv, d, d, std=STATE_STD)
    A_log = torch.tensor(A_LOG[:hv], device=device, dtype=torch.float32)
    a = normal(batch, 1, hv, std=A_STD, mean=A_MEAN).bfloat16()
    dt_bias = torch.tensor(DT_BIAS[:hv], device=device, dtype=torch.float32)
    b = normal(batch, 1, hv, std=B_STD, mean=B_MEAN).bfloat16()
    scale = SCALE if d == 128 else d ** -0.5
    return q, k, v, state, A_log, a, dt_bias, b, scale


def reference(q, k, v, state, A_log, a, dt_bias, b, scale):
    acc = torch.promote_types(q.dtype, torch.float32)
    hv = v.shape[2]
    g = torch.exp(-torch.exp(A_log.to(acc)) * F.softplus(a.to(acc) + dt_bias.to(acc)))[:, 0]  # [B, Hv]
    beta = torch.sigmoid(b.to(acc))[:, 0]
    q_exp = q[:, 0].to(acc).repeat_interleave(hv // q.shape[2], dim=1)  # [B, Hv, K]
    k_exp = k[:, 0].to(acc).repeat_interleave(hv // k.shape[2], dim=1)
    old_state = g[..., None, None] * state.to(acc).transpose(-1, -2)  # [B, Hv, K, V]
    old_v = torch.einsum("bhk,bhkv->bhv", k_exp, old_state)
    new_v = beta[..., None] * v[:, 0].to(acc) + (1 - beta[..., None]) * old_v
    h = old_state - k_exp[..., :, None] * old_v[..., None, :] + k_exp[..., :, None] * new_v[..., None, :]
    output = scale * torch.einsum("bhk,bhkv->bhv", q_exp, h)
    return output[:, None].to(q.dtype), h.transpose(-1, -2).contiguous().to(state.dtype)


def flops(q, k, v, state, A_log, a, dt_bias, b, scale):
    return 8 * state.numel()


def bytes_moved(q, k, v, state, A_log, a, dt_bias, b, scale):
    small = sum(t.numel() * t.element_size() for t in (q, k, v, A_log, a, dt_bias, b))
    return 2 * state.numel() * state.element_size() + small + v.numel() * v.element_size()
