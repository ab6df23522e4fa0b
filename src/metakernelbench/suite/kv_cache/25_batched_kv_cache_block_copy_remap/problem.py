"""Batched K/V cache block copy under one block mapping (vLLM swap_blocks, as its test_swap_blocks drives it).

Inputs src_k, src_v, dst_k, dst_v are uint8 pools [num_blocks, block_size, num_heads, head_dim] (opaque cache bytes,
e.g. fp8 codes); block_mapping is int64 [num_mappings, 2], row i a pair (source block, destination block), the
destination blocks distinct (upstream draws the source and destination ids from one permutation, so the two sets are
disjoint). In place, for every pair i: dst_k[block_mapping[i, 1]] = src_k[block_mapping[i, 0]] and
dst_v[block_mapping[i, 1]] = src_v[block_mapping[i, 0]], whole blocks (block_size * num_heads * head_dim bytes each);
no other block of dst_k or dst_v changes, and src_k, src_v and block_mapping stay unchanged. solve must modify dst_k
and dst_v in place and return those same two tensor objects.
"""
import torch

FAMILY = "kv_cache"
SOURCE_MODEL = "none (vLLM test_swap_blocks workload)"
DTYPE = "uint8"
SIZES = {
    "full": dict(num_blocks=1024, num_mappings=256, block_size=32, num_heads=8, head_dim=256),
    "odd": dict(num_blocks=613, num_mappings=77, block_size=32, num_heads=8, head_dim=256),
    "cpu": dict(num_blocks=64, num_mappings=16, block_size=32, num_heads=2, head_dim=16),
    "cpu_odd": dict(num_blocks=37, num_mappings=9, block_size=32, num_heads=2, head_dim=24),
}
OUTPUTS = ("dst_k", "dst_v")
COMPARE = {"dst_k": "exact", "dst_v": "exact"}
INPLACE = {"dst_k": 2, "dst_v": 3}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (s["num_blocks"], s["block_size"], s["num_heads"], s["head_dim"])
    src_k, src_v, dst_k, dst_v = (
        torch.randint(0, 256, shape, generator=gen, device=device, dtype=torch.uint8) for _ in range(4))
    mappings = s["num_mappings"]
    permutation = torch.randperm(s["num_blocks"], generator=gen, device=device)
    block_mapping = torch.stack((permutation[:mappings], permutation[mappings:2 * mappings]), dim=1)
    return src_k, src_v, dst_k, dst_v, block_mapping


@torch.no_grad()
def reference(src_k, src_v, dst_k, dst_v, block_mapping):
    src_blocks = block_mapping[:, 0].long()
    dst_blocks = block_mapping[:, 1].long()
    dst_k[dst_blocks] = src_k[src_blocks]
    dst_v[dst_blocks] = src_v[src_blocks]
    return dst_k, dst_v


def flops(src_k, src_v, dst_k, dst_v, block_mapping):
    return 0


def bytes_moved(src_k, src_v, dst_k, dst_v, block_mapping):
    """Each mapped block is read once from a source pool and written once to a destination pool, K and V."""
    block_bytes = src_k[0].numel() * src_k.element_size()
    return 4 * block_mapping.shape[0] * block_bytes + block_mapping.numel() * block_mapping.element_size()
