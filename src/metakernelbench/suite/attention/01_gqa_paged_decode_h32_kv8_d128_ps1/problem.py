"""GQA decode attention over a paged KV cache with page size 1 (Llama-3.1-8B: 32 query / 8 KV heads, head dim 128).

Sequence b has one query token q[b] ([batch, 32, 128]) and kv_len_b = kv_indptr[b+1] - kv_indptr[b] >= 1 cached
tokens; its j-th token lives in page kv_indices[kv_indptr[b] + j] of k_cache / v_cache ([num_pages, 1, 8, 128]: page
size 1, one token per page). kv_indptr (int32, [batch + 1]) starts at 0 and ends at kv_indices.numel(); pages not
listed in kv_indices are never read. Query head h uses KV head h // 4. With logits = sm_scale · q·kᵀ in fp32
(sm_scale a Python float), the outputs are o = softmax(logits) · V, accumulated in fp32 and returned in bf16
([batch, 32, 128]), and lse = logsumexp(logits) / ln 2, the base-2 log-sum-exp in fp32 ([batch, 32]). The full size
is upstream's captured FlashInfer-Trace workload (64 sequences of 509 to 3 172 tokens, 58 966 in all, over a 68 237
page pool, sm_scale = fp32(1/√128)); every draw places the tokens on fresh random pages. The held-out size has
heavy-tailed lengths: most sequences long, a quarter short, one at the maximum.
"""
import math

import torch

FAMILY = "attention"
SOURCE_MODEL = "Llama-3.1-8B"
DTYPE = "bf16"
NUM_PAGES = 68237
KV_INDPTR = (0, 542, 1067, 1637, 2236, 3014, 3538, 4063, 4576, 5134, 5652, 6168, 6723, 7234, 7754, 8281, 9129, 9707,
             12277, 15364, 16907, 19227, 21549, 23026, 24599, 26116, 26643, 27348, 27869, 28398, 28921, 29459, 29975,
             30499, 31031, 31549, 32469, 33110, 33799, 34316, 34832, 35354, 35905, 36437, 36974, 39857, 43029, 43851,
             44373, 45273, 45915, 46427, 46950, 47501, 49996, 50527, 52650, 54239, 55046, 55603, 56118, 56966, 57882,
             58391, 58966)
SM_SCALE = 0.0883883461356163  # as captured: 1/sqrt(128) rounded to fp32
SIZES = {
    "full": dict(q_heads=32, kv_heads=8, head_dim=128, kv_indptr=KV_INDPTR, num_pages=NUM_PAGES),
    "odd": dict(q_heads=32, kv_heads=8, head_dim=128, batch=7, max_context=3001),
    "cpu": dict(q_heads=8, kv_heads=2, head_dim=64, batch=4, max_context=96),
    "cpu_odd": dict(q_heads=8, kv_heads=2, head_dim=64, batch=3, max_context=45),
}
OUTPUTS = ("o", "lse")
COMPARE = {"o": "float", "lse": "float"}


def _heavy_tailed_indptr(batch, max_context, gen, device):
    """Most sequences in [max/2, max], a quarter log-uniform in [1, max], one (at a random place) at the maximum."""
    long = torch.randint(max_context // 2, max_context + 1, (batch,), generator=gen, device=device)
    short = torch.exp(torch.rand(batch, generator=gen, device=device) * math.log(max_context)).long()
    is_short = torch.rand(batch, generator=gen, device=device) < 0.25
    lens = torch.where(is_short, short.clamp(1, max_context), long)
    lens[torch.randint(0, batch, (1,), generator=gen, device=device)] = max_context
    return torch.cat([lens.new_zeros(1), lens.cumsum(0)]).to(torch.int32)


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    if "kv_indptr" in s:
        kv_indptr = torch.tensor(s["kv_indptr"], dtype=torch.int32, device=device)
        num_pages = s["num_pages"]
        sm_scale = SM_SCALE
    else:
        kv_indptr = _heavy_tailed_indptr(s["batch"], s["max_context"], gen, device)
        total = int(kv_indptr[-1])
        num_pages = total + total // 6 + 1  # a pool about as much larger than the tokens as upstream's
        sm_scale = float(torch.tensor(s["head_dim"] ** -0.5, dtype=torch.float32))
    batch, total = kv_indptr.numel() - 1, int(kv_indptr[-1])
    cache = (num_pages, 1, s["kv_heads"], s["head_dim"])
    q = torch.randn((batch, s["q_heads"], s["head_dim"]), generator=gen, device=device).bfloat16()
    k_cache = torch.randn(cache, generator=gen, device=device).bfloat16()
    v_cache = torch.randn(cache, generator=gen, device=device).bfloat16()
    kv_indices = torch.randperm(num_pages, generator=gen, device=device)[:total].to(torch.int32)
    return q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale


def reference(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    acc = torch.promote_types(q.dtype, torch.float32)
    batch, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    # Sequences padded to the longest one; padding slots are masked out of the softmax.
    starts, lens = kv_indptr[:-1].long(), (kv_indptr[1:] - kv_indptr[:-1]).long()
    j = torch.arange(int(lens.max()), device=q.device)
    valid = j[None, :] < lens[:, None]
    pages = kv_indices.long()[torch.where(valid, starts[:, None] + j[None, :], 0)]
    k = k_cache[:, 0][pages].to(acc)  # [batch, max_len, kv_heads, head_dim]
    v = v_cache[:, 0][pages].to(acc)
    qg = q.to(acc).view(batch, kv_heads, q_heads // kv_heads, head_dim)
    logits = torch.einsum("bhgd,blhd->bhgl", qg, k) * sm_scale
    logits = logits.masked_fill(~valid[:, None, None, :], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1) / math.log(2.0)
    o = torch.einsum("bhgl,blhd->bhgd", torch.softmax(logits, dim=-1), v)
    return o.reshape(batch, q_heads, head_dim).to(q.dtype), lse.reshape(batch, q_heads)


def flops(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    return 4 * kv_indices.numel() * q.shape[1] * q.shape[2]


def bytes_moved(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    """Each token's K and V rows and its page index, the index pointers, q, and the outputs o and lse."""
    kv_row = k_cache.shape[2] * k_cache.shape[3] * k_cache.element_size()
    per_token = 2 * kv_row + kv_indices.element_size()
    lse_bytes = q.shape[0] * q.shape[1] * 4
    return (kv_indices.numel() * per_token + kv_indptr.numel() * kv_indptr.element_size()
            + 2 * q.numel() * q.element_size() + lse_bytes)
