"""Paged KV-cache write through a slot mapping (vLLM reshape_and_cache_flash; Llama-3-8B: 8 KV heads, d 128).

In place: for each token t with slot_mapping[t] >= 0, key_cache[slot // block_size, slot % block_size] = key[t]
and likewise for values; tokens with slot -1 (padding) write nothing, and no other cache entry may change.
solve must modify key_cache and value_cache in place and return those same two tensor objects; key, value and
slot_mapping must be left unchanged. Cache layout: [num_blocks, block_size, kv_heads, head_dim].
"""
import torch

FAMILY = "kv_cache"
SOURCE_MODEL = "Llama-3-8B"
DTYPE = "bf16"
DEMO = True  # one of the problems `mkb demo` runs
SIZES = {
    "full": dict(tokens=8192, kv_heads=8, head_dim=128, block_size=16, num_blocks=8192),
    "odd": dict(tokens=1531, kv_heads=8, head_dim=128, block_size=16, num_blocks=1024),
    "cpu": dict(tokens=64, kv_heads=2, head_dim=64, block_size=16, num_blocks=16),
    "cpu_odd": dict(tokens=29, kv_heads=2, head_dim=64, block_size=16, num_blocks=8),
}
OUTPUTS = ("key_cache", "value_cache")
COMPARE = {"key_cache": "exact", "value_cache": "exact"}
INPLACE = {"key_cache": 2, "value_cache": 3}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    t, h, d = s["tokens"], s["kv_heads"], s["head_dim"]
    cache_shape = (s["num_blocks"], s["block_size"], h, d)
    key = torch.randn((t, h, d), generator=gen, device=device).bfloat16()
    value = torch.randn((t, h, d), generator=gen, device=device).bfloat16()
    key_cache = torch.randn(cache_shape, generator=gen, device=device).bfloat16()
    value_cache = torch.randn(cache_shape, generator=gen, device=device).bfloat16()
    slots = torch.randperm(s["num_blocks"] * s["block_size"], generator=gen, device=device)[:t]
    padding = torch.rand(t, generator=gen, device=device) < 0.05
    slot_mapping = torch.where(padding, -1, slots).to(torch.int64)
    return key, value, key_cache, value_cache, slot_mapping


def reference(key, value, key_cache, value_cache, slot_mapping):
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    key_cache.view(-1, *key_cache.shape[2:])[slots] = key[valid]
    value_cache.view(-1, *value_cache.shape[2:])[slots] = value[valid]
    return key_cache, value_cache


def flops(key, value, key_cache, value_cache, slot_mapping):
    return 0


def bytes_moved(key, value, key_cache, value_cache, slot_mapping):
    return 4 * key.numel() * key.element_size() + slot_mapping.numel() * 8
