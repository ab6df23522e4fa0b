"""GLM-4.5 attention prologue: per-head Q/K RMSNorm, partial NeoX RoPE, and a paged KV-cache update.

vLLM's fused qk-norm + rope + cache op for GLM-4.5 (32 query / 8 KV heads of 128, rotary dim 64, cache blocks of 16
slots). qkv [T, (Hq + 2·Hkv)·128] splits into q [T, Hq, 128], k and v [T, Hkv, 128]. For q and k, per head:
n = bf16(bf16(x · rsqrt(mean(x²) + eps)) · w), with x, the mean and rsqrt in fp32 and w = q_norm_weight resp.
k_norm_weight. RoPE (NeoX, on the first 64 dims only): with c, s = cos_sin_cache[positions[t]] split into halves
[0:32], [32:64] (bf16), x1 = n[0:32], x2 = n[32:64]: n[0:32] = bf16(bf16(x1·c) − bf16(x2·s)) and
n[32:64] = bf16(bf16(x2·c) + bf16(x1·s)), each product and sum rounded to bf16; dims 64–127 pass through. Outputs:
q [T, Hq, 128] (normed, rotated), and kv_cache [2, blocks, 16, Hkv, 128] updated in place: for each token t with
slot = slot_mapping[t] ≥ 0, kv_cache[0, slot // 16, slot % 16] = rotated k[t] and kv_cache[1, slot // 16, slot % 16]
= v[t] (unnormalised). A trailing run of 1–128 padding tokens has slot −1 and writes nothing (their q is still
computed); slots are distinct. solve must update kv_cache in place and return that same tensor; every other input
(eps = 1e-5 is passed as a float) stays unchanged.
"""
import torch

FAMILY = "kv_cache"
SOURCE_MODEL = "GLM-4.5"
DTYPE = "bf16"
EPS = 1e-5
ROPE_BASE = 10000.0
SIZES = {
    "full": dict(tokens=2048, max_pad=128, q_heads=32, kv_heads=8, head_dim=128, rotary_dim=64, block_size=16,
                 num_blocks=256, max_position=4096),
    "odd": dict(tokens=333, max_pad=128, q_heads=32, kv_heads=8, head_dim=128, rotary_dim=64, block_size=16,
                num_blocks=29, max_position=4096),
    "cpu": dict(tokens=48, max_pad=8, q_heads=8, kv_heads=2, head_dim=128, rotary_dim=64, block_size=16,
                num_blocks=8, max_position=512),
    "cpu_odd": dict(tokens=29, max_pad=5, q_heads=4, kv_heads=1, head_dim=128, rotary_dim=64, block_size=16,
                    num_blocks=3, max_position=512),
}
OUTPUTS = ("q", "kv_cache")
COMPARE = {"q": "float", "kv_cache": "float"}
INPLACE = {"kv_cache": 6}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    tokens, head_dim = s["tokens"], s["head_dim"]
    width = (s["q_heads"] + 2 * s["kv_heads"]) * head_dim
    qkv = torch.randn((tokens, width), generator=gen, device=device).bfloat16()
    positions = torch.randint(0, s["max_position"], (tokens,), generator=gen, device=device)
    q_norm_weight = torch.randn(head_dim, generator=gen, device=device).bfloat16()
    k_norm_weight = torch.randn(head_dim, generator=gen, device=device).bfloat16()
    cos_sin_cache = _cos_sin_cache(s["max_position"], s["rotary_dim"], device)
    slot_mapping = torch.randperm(s["num_blocks"] * s["block_size"], generator=gen, device=device)[:tokens]
    num_pads = int(torch.randint(1, s["max_pad"] + 1, (1,), generator=gen, device=device))
    slot_mapping[tokens - num_pads:] = -1
    kv_cache = torch.randn((2, s["num_blocks"], s["block_size"], s["kv_heads"], head_dim), generator=gen,
                           device=device).bfloat16()
    return qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, EPS


def _cos_sin_cache(max_position: int, rotary_dim: int, device) -> torch.Tensor:
    inv_freq = 1.0 / (ROPE_BASE ** (torch.arange(0, rotary_dim, 2, device=device, dtype=torch.float32) / rotary_dim))
    angles = torch.outer(torch.arange(max_position, device=device, dtype=torch.float32), inv_freq)
    return torch.cat((angles.cos(), angles.sin()), dim=-1).bfloat16()


def _rms_norm_per_head(x, weight, eps):
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    normalized = wide * torch.rsqrt(wide.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normalized.to(weight.dtype) * weight).to(x.dtype)


def _partial_neox_rope(x, cos, sin):
    rotary_dim = 2 * cos.shape[-1]
    x1, x2 = x[..., :rotary_dim].chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., rotary_dim:]), dim=-1)


@torch.no_grad()
def reference(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, eps):
    tokens = qkv.shape[0]
    kv_heads, head_dim = kv_cache.shape[3:]
    q_heads = qkv.shape[1] // head_dim - 2 * kv_heads
    q, k, v = qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
    q = _partial_neox_rope(_rms_norm_per_head(q.view(tokens, q_heads, head_dim), q_norm_weight, eps), cos, sin)
    k = _partial_neox_rope(_rms_norm_per_head(k.view(tokens, kv_heads, head_dim), k_norm_weight, eps), cos, sin)
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    kv_cache[0].view(-1, kv_heads, head_dim)[slots] = k[valid]
    kv_cache[1].view(-1, kv_heads, head_dim)[slots] = v.view(tokens, kv_heads, head_dim)[valid]
    return q, kv_cache


def flops(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, eps):
    """Norm: square, add, two scalings per element; RoPE: two products and a sum per rotated element."""
    kv_heads, head_dim = kv_cache.shape[3:]
    normed_heads = qkv.shape[1] // head_dim - kv_heads
    return qkv.shape[0] * normed_heads * (4 * head_dim + 3 * cos_sin_cache.shape[1])


def bytes_moved(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, eps):
    """q read and written for every token; k and v read and written to the cache for tokens with a slot only; one
    cos/sin row per distinct position; the index vectors and the two weights."""
    kv_heads, head_dim = kv_cache.shape[3:]
    row = head_dim * qkv.element_size()
    q_heads = qkv.shape[1] // head_dim - 2 * kv_heads
    valid = int((slot_mapping >= 0).sum())
    cos_sin = positions.unique().numel() * cos_sin_cache.shape[1] * cos_sin_cache.element_size()
    small = (positions.numel() + slot_mapping.numel()) * 8 + 2 * row
    return 2 * qkv.shape[0] * q_heads * row + 4 * valid * kv_heads * row + cos_sin + small
