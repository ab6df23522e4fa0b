"""Dynamic per-(token, head) FP8 quantisation of keys and values, appended to a paged cache (vLLM, 8 KV heads × 128).

For every token t and head h, separately for key and value: amax = max |x[t, h, :]| over the head dimension in fp32,
scale = max(amax * fp32(1 / 448), 1e-6) in fp32 (what upstream's `amax / 448` computes on CUDA, where torch divides by
a scalar as a product with its fp32 reciprocal; a true division differs in more than half the scales and moves about
0.2% of the codes by one step), and codes = e4m3(clamp(x * (1 / scale), -448, 448)), rounded to nearest even, where
1/scale is the fp32 reciprocal and x * (1 / scale) a fp32 product. A slot s = slot_mapping[t] >= 0 addresses block s
div block_size, offset s mod block_size: key_cache[block, offset, h, :] receives the key's e4m3 bit patterns (the
caches are uint8), k_scale_cache[block, offset, h] its fp32 scale, and likewise value_cache and v_scale_cache for the
value. Slots are distinct; the trailing 1-128 tokens are padding with slot -1 and write nothing, and no other cache
entry may change (the caches start out holding arbitrary bytes and scales). solve must update the four caches in place
and return those same four tensor objects; key, value and slot_mapping must stay unchanged. Layouts: key/value
[tokens, heads, head_dim] bf16; caches [num_blocks, block_size, heads, head_dim] uint8; scale caches [num_blocks,
block_size, heads] fp32. Codes are compared after dequantisation (code × scale) within one e4m3 step, scales as
floats.
"""
import torch

FAMILY = "kv_cache"
SOURCE_MODEL = "— (8 KV heads × 128)"
DTYPE = "fp8"
FP8_MAX = 448.0
MIN_SCALE = 1e-6
SIZES = {
    "full": dict(tokens=2048, heads=8, head_dim=128, block_size=16, num_blocks=256, max_pad=128),
    "odd": dict(tokens=1237, heads=8, head_dim=128, block_size=16, num_blocks=97, max_pad=128),
    "cpu": dict(tokens=64, heads=2, head_dim=128, block_size=16, num_blocks=8, max_pad=8),
    "cpu_odd": dict(tokens=37, heads=2, head_dim=128, block_size=16, num_blocks=5, max_pad=8),
}
OUTPUTS = ("key_cache", "value_cache", "k_scale_cache", "v_scale_cache")
# One scale per (slot, head) covers that head's head_dim codes: the group is the whole last axis of the cache.
COMPARE = {
    "key_cache": {"rule": "fp8_dequant", "scales": "k_scale_cache", "group": 128},
    "value_cache": {"rule": "fp8_dequant", "scales": "v_scale_cache", "group": 128},
    "k_scale_cache": "float",
    "v_scale_cache": "float",
}
INPLACE = {"key_cache": 3, "value_cache": 4, "k_scale_cache": 5, "v_scale_cache": 6}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    t, h, d = s["tokens"], s["heads"], s["head_dim"]
    key = torch.randn((t, h, d), generator=gen, device=device, dtype=torch.bfloat16)
    value = torch.randn((t, h, d), generator=gen, device=device, dtype=torch.bfloat16)
    slot_mapping = torch.randperm(s["num_blocks"] * s["block_size"], generator=gen, device=device)[:t]
    num_pads = int(torch.randint(1, s["max_pad"] + 1, (1,), generator=gen, device=device))
    slot_mapping[t - num_pads:] = -1
    cache_shape = (s["num_blocks"], s["block_size"], h, d)
    key_cache = torch.randint(0, 256, cache_shape, generator=gen, device=device, dtype=torch.uint8)
    value_cache = torch.randint(0, 256, cache_shape, generator=gen, device=device, dtype=torch.uint8)
    k_scale_cache = torch.rand(cache_shape[:3], generator=gen, device=device) + 0.5
    v_scale_cache = torch.rand(cache_shape[:3], generator=gen, device=device) + 0.5
    return key, value, slot_mapping, key_cache, value_cache, k_scale_cache, v_scale_cache


def _quantize(x):
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    scale = (wide.abs().amax(dim=-1) * (1.0 / FP8_MAX)).clamp(min=MIN_SCALE)
    codes = (wide * (1.0 / scale.unsqueeze(-1))).clamp(-FP8_MAX, FP8_MAX).to(torch.float32).to(torch.float8_e4m3fn)
    return codes, scale


def reference(key, value, slot_mapping, key_cache, value_cache, k_scale_cache, v_scale_cache):
    key_codes, key_scale = _quantize(key)
    value_codes, value_scale = _quantize(value)
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    blocks = torch.div(slots, key_cache.shape[1], rounding_mode="floor")
    offsets = torch.remainder(slots, key_cache.shape[1])
    key_cache[blocks, offsets] = key_codes[valid].view(torch.uint8)
    value_cache[blocks, offsets] = value_codes[valid].view(torch.uint8)
    k_scale_cache[blocks, offsets] = key_scale[valid]
    v_scale_cache[blocks, offsets] = value_scale[valid]
    return key_cache, value_cache, k_scale_cache, v_scale_cache


def flops(key, value, slot_mapping, key_cache, value_cache, k_scale_cache, v_scale_cache):
    valid = int((slot_mapping >= 0).sum())
    return 3 * 2 * valid * key.shape[1] * key.shape[2]  # |x| and max for the scale, one multiply per code


def bytes_moved(key, value, slot_mapping, key_cache, value_cache, k_scale_cache, v_scale_cache):
    valid = int((slot_mapping >= 0).sum())
    rows = 2 * valid * key.shape[1]  # (token, head) rows of key and value that land in a slot
    return (rows * key.shape[2] * (key.element_size() + key_cache.element_size())
            + rows * k_scale_cache.element_size() + slot_mapping.numel() * slot_mapping.element_size())
