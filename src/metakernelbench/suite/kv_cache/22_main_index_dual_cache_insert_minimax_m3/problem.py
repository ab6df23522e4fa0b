"""MiniMax-M3 attention prologue: main and index q/k normalisation, partial NeoX RoPE, and a dual cache insert.

vLLM's fused MiniMax-M3 qk-norm + rope + kv-insert op. qkv [T, 29·128] splits, in order, into q (16 heads), k (4),
v (4), index q (4) and index k (1 head) of 128. Every head but v's: x in fp32, n = bf16(x · rsqrt(mean(x²) + 1e-6)
· (1 + w)) with its own weight w (q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight; 1 + w in
fp32), then NeoX RoPE on dims 0–63 in fp32: with c, s = cos_sin_cache[positions[t]] halves [0:32], [32:64] (bf16
values, θ = 5e6), x1 = n[0:32], x2 = n[32:64]: n[0:32] = bf16(x1·c − x2·s), n[32:64] = bf16(x2·c + x1·s); dims
64–127 keep n. Outputs: q [T, 16, 128] and index_q [T, 4, 128] (normed, rotated); kv_cache [blocks, 4, 64, 256]
updated in place with kv_cache[slot // 64, h, slot % 64] = [rotated k[t, h], v[t, h]] (v unnormalised) for
slot = slot_mapping[t] and each KV head h; index_cache [blocks, 64, 128] updated in place with
index_cache[i // 64, i % 64] = rotated index k[t] for i = index_slot_mapping[t]. Each slot mapping holds distinct,
valid slots (no padding). solve must update both caches in place and return those same tensors; every other input
stays unchanged.
"""
import torch

FAMILY = "kv_cache"
SOURCE_MODEL = "MiniMax-M3"
DTYPE = "bf16"
Q_HEADS, KV_HEADS, INDEX_Q_HEADS, HEAD_DIM = 16, 4, 4, 128
EPS = 1e-6
ROPE_BASE = 5_000_000.0
# The head layout is the model's at every size (q and index-q heads are told apart only by their count).
SIZES = {
    "full": dict(tokens=513, rotary_dim=64, block_size=64, num_blocks=10, max_position=4096),
    "odd": dict(tokens=203, rotary_dim=64, block_size=64, num_blocks=7, max_position=4096),
    "cpu": dict(tokens=40, rotary_dim=64, block_size=64, num_blocks=2, max_position=512),
    "cpu_odd": dict(tokens=29, rotary_dim=64, block_size=64, num_blocks=3, max_position=512),
}
OUTPUTS = ("q", "index_q", "kv_cache", "index_cache")
COMPARE = {"q": "float", "index_q": "float", "kv_cache": "float", "index_cache": "float"}
INPLACE = {"kv_cache": 9, "index_cache": 10}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    tokens, slots = s["tokens"], s["num_blocks"] * s["block_size"]
    width = (Q_HEADS + 2 * KV_HEADS + INDEX_Q_HEADS + 1) * HEAD_DIM
    qkv = torch.randn((tokens, width), generator=gen, device=device).bfloat16()
    weights = [(torch.randn(HEAD_DIM, generator=gen, device=device) * 0.1).bfloat16() for _ in range(4)]
    positions = torch.randint(0, s["max_position"], (tokens,), generator=gen, device=device)
    cos_sin_cache = _cos_sin_cache(s["max_position"], s["rotary_dim"], device)
    slot_mapping = torch.randperm(slots, generator=gen, device=device)[:tokens]
    index_slot_mapping = torch.randperm(slots, generator=gen, device=device)[:tokens]
    kv_cache = torch.randn((s["num_blocks"], KV_HEADS, s["block_size"], 2 * HEAD_DIM), generator=gen,
                           device=device).bfloat16()
    index_cache = torch.randn((s["num_blocks"], s["block_size"], HEAD_DIM), generator=gen, device=device).bfloat16()
    return (qkv, *weights, positions, cos_sin_cache, slot_mapping, index_slot_mapping, kv_cache, index_cache)


def _cos_sin_cache(max_position: int, rotary_dim: int, device) -> torch.Tensor:
    inv_freq = 1.0 / (ROPE_BASE ** (torch.arange(0, rotary_dim, 2, device=device, dtype=torch.float32) / rotary_dim))
    angles = torch.outer(torch.arange(max_position, device=device, dtype=torch.float32), inv_freq)
    return torch.cat((angles.cos(), angles.sin()), dim=-1).bfloat16()


def _norm_rope(x, weight, cos, sin):
    """(1 + w) RMSNorm rounded to x's dtype, then NeoX RoPE in the wide dtype on the first rotary dims."""
    wide_dtype = cos.dtype
    wide = x.to(wide_dtype)
    wide = wide * torch.rsqrt(wide.pow(2).mean(dim=-1, keepdim=True) + EPS)
    normed = (wide * (1.0 + weight.to(wide_dtype))).to(x.dtype)
    half = cos.shape[-1]
    x1, x2 = normed[..., :half].to(wide_dtype), normed[..., half:2 * half].to(wide_dtype)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
    return torch.cat((rotated, normed[..., 2 * half:]), dim=-1)


@torch.no_grad()
def reference(qkv, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight, positions, cos_sin_cache,
              slot_mapping, index_slot_mapping, kv_cache, index_cache):
    tokens = qkv.shape[0]
    sizes = [Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, INDEX_Q_HEADS * HEAD_DIM, HEAD_DIM]
    q, k, v, iq, ik = qkv.split(sizes, dim=-1)
    wide_dtype = torch.promote_types(qkv.dtype, torch.float32)
    cos, sin = cos_sin_cache.index_select(0, positions).to(wide_dtype).chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q = _norm_rope(q.view(tokens, Q_HEADS, HEAD_DIM), q_norm_weight, cos, sin)
    k = _norm_rope(k.view(tokens, KV_HEADS, HEAD_DIM), k_norm_weight, cos, sin)
    iq = _norm_rope(iq.view(tokens, INDEX_Q_HEADS, HEAD_DIM), index_q_norm_weight, cos, sin)
    ik = _norm_rope(ik.view(tokens, 1, HEAD_DIM), index_k_norm_weight, cos, sin).squeeze(1)
    block_size = kv_cache.shape[2]
    blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
    kv_cache[blocks, :, offsets, :HEAD_DIM] = k
    kv_cache[blocks, :, offsets, HEAD_DIM:] = v.view(tokens, KV_HEADS, HEAD_DIM)
    index_cache.view(-1, HEAD_DIM)[index_slot_mapping] = ik
    return q, iq, kv_cache, index_cache


def flops(qkv, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight, positions, cos_sin_cache,
          slot_mapping, index_slot_mapping, kv_cache, index_cache):
    """Norm: square, add, two scalings per element; RoPE: two products and a sum per rotated element."""
    normed_heads = Q_HEADS + KV_HEADS + INDEX_Q_HEADS + 1
    return qkv.shape[0] * normed_heads * (4 * HEAD_DIM + 3 * cos_sin_cache.shape[1])


def bytes_moved(qkv, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight, positions, cos_sin_cache,
                slot_mapping, index_slot_mapping, kv_cache, index_cache):
    """qkv read once and each of its heads written once (q, index q, k and v into the cache, index k into the index
    cache); one cos/sin row per distinct position; the three index vectors and the four weights."""
    tokens = qkv.shape[0]
    cos_sin = positions.unique().numel() * cos_sin_cache.shape[1] * cos_sin_cache.element_size()
    small = 3 * tokens * 8 + 4 * HEAD_DIM * q_norm_weight.element_size()
    return 2 * qkv.numel() * qkv.element_size() + cos_sin + small
