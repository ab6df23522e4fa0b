"""GQA decode attention over a paged KV cache with page size 1 (Llama-3-8B: 32 query / 8 KV heads, head dim 128).

One query token per sequence attends to its first seq_lens[b] cached tokens. Token j of sequence b lives in cache
page block_table[b, j] (page size 1: one token per page); entries of block_table at j >= seq_lens[b] are padding
and must not be read. Query head h uses KV head h // (q_heads // kv_heads). o = softmax(q·Kᵀ / sqrt(d)) · V per
head, accumulated in fp32, returned in bf16. Context lengths are heavy-tailed: most sequences are long, a quarter
are short, and one always has the maximum length.
"""
import math

import torch

FAMILY = "attention"
SOURCE_MODEL = "Llama-3-8B"
DTYPE = "bf16"
SIZES = {
    "full": dict(batch=32, q_heads=32, kv_heads=8, head_dim=128, max_context=4096),
    "odd": dict(batch=7, q_heads=32, kv_heads=8, head_dim=128, max_context=3001),
    "cpu": dict(batch=4, q_heads=8, kv_heads=2, head_dim=64, max_context=96),
    "cpu_odd": dict(batch=3, q_heads=8, kv_heads=2, head_dim=64, max_context=45),
}
OUTPUTS = ("o",)
COMPARE = {"o": "float"}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    batch, ctx, d = s["batch"], s["max_context"], s["head_dim"]
    long = torch.randint(ctx // 2, ctx + 1, (batch,), generator=gen, device=device)
    short = torch.exp(torch.rand(batch, generator=gen, device=device) * math.log(ctx)).long().clamp(1, ctx)
    is_short = torch.rand(batch, generator=gen, device=device) < 0.25
    seq_lens = torch.where(is_short, short, long)
    seq_lens[0] = ctx
    total = int(seq_lens.sum())
    num_pages = total + batch * 8
    pages = torch.randperm(num_pages, generator=gen, device=device)[:total].to(torch.int32)
    block_table = torch.zeros((batch, ctx), dtype=torch.int32, device=device)
    valid = torch.arange(ctx, device=device)[None, :] < seq_lens[:, None]
    block_table[valid] = pages
    q = torch.randn((batch, s["q_heads"], d), generator=gen, device=device)
    k_cache = torch.randn((num_pages, s["kv_heads"], d), generator=gen, device=device)
    k_cache *= 1.0 + 3.0 * (torch.rand(d, generator=gen, device=device) < 0.05)
    v_cache = torch.randn((num_pages, s["kv_heads"], d), generator=gen, device=device)
    return q.bfloat16(), k_cache.bfloat16(), v_cache.bfloat16(), block_table, seq_lens.to(torch.int32)


def reference(q, k_cache, v_cache, block_table, seq_lens):
    acc = torch.promote_types(q.dtype, torch.float32)
    batch, q_heads, d = q.shape
    kv_heads = k_cache.shape[1]
    ctx = block_table.shape[1]
    valid = torch.arange(ctx, device=q.device)[None, :] < seq_lens[:, None].long()
    pages = torch.where(valid, block_table.long(), 0)
    k = k_cache[pages].to(acc)
    v = v_cache[pages].to(acc)
    qg = q.to(acc).view(batch, kv_heads, q_heads // kv_heads, d)
    scores = torch.einsum("bhgd,blhd->bhgl", qg, k) / math.sqrt(d)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    o = torch.einsum("bhgl,blhd->bhgd", torch.softmax(scores, dim=-1), v)
    return o.reshape(batch, q_heads, d).to(q.dtype)


def flops(q, k_cache, v_cache, block_table, seq_lens):
    return 4 * int(seq_lens.sum()) * q.shape[1] * q.shape[2]


def bytes_moved(q, k_cache, v_cache, block_table, seq_lens):
    kv_row = k_cache.shape[1] * k_cache.shape[2] * k_cache.element_size()
    return 2 * int(seq_lens.sum()) * (kv_row + 4) + 2 * q.numel() * q.element_size()
