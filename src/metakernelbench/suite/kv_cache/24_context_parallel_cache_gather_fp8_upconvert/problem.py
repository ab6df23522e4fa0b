"""Gather requests' tokens from a paged mixed-layout FP8 MLA cache and upconvert them to bf16 (vLLM, DeepSeek-V3.2).

The cache [num_blocks, block_size, 656] is uint8; each 656-byte entry is one token: bytes 0-511 hold 512 e4m3 codes
(the latent, "nope"), bytes 512-527 four little-endian fp32 scales, one per group of 128 codes, and bytes 528-655
64 bf16 rope values. Request r owns seq_lens[r] tokens; its token p lives in block block_table[r, p // block_size]
at offset p % block_size (columns of block_table past a request's last block are not read). The output stacks the
requests in order, [sum(seq_lens), 576] bf16: row cu[r] + p (cu the exclusive prefix sum of seq_lens) holds
bf16(float32(code_i) * scale_{i // 128}) for i < 512 (an fp32 product rounded once to bf16), then the 64 rope values
copied bit for bit. The inputs must not be modified.
"""
import math

import torch

FAMILY = "kv_cache"
SOURCE_MODEL = "DeepSeek-V3.2 layout"
DTYPE = "bf16"
NOPE_DIM = 512
ROPE_DIM = 64
GROUP_SIZE = 128
NUM_GROUPS = NOPE_DIM // GROUP_SIZE
SCALE_BYTES = 4 * NUM_GROUPS
ENTRY_BYTES = NOPE_DIM + SCALE_BYTES + 2 * ROPE_DIM  # 656
SIZES = {
    "full": dict(block_size=64, num_blocks=16, requests=3, total_tokens=641),
    "odd": dict(block_size=64, num_blocks=23, requests=5, total_tokens=397),
    "cpu": dict(block_size=64, num_blocks=6, requests=2, total_tokens=150),
    "cpu_odd": dict(block_size=64, num_blocks=5, requests=3, total_tokens=77),
}
OUTPUTS = ("out",)
COMPARE = {"out": "float"}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    block_size, blocks, requests, total = s["block_size"], s["num_blocks"], s["requests"], s["total_tokens"]
    # Request lengths: a random composition of the total; each request gets its own blocks of one permutation.
    cuts = torch.randperm(total - 1, generator=gen, device=device)[:requests - 1].sort().values + 1
    bounds = torch.cat([cuts.new_zeros(1), cuts, cuts.new_full((1,), total)])
    lengths = bounds.diff().tolist()
    blocks_per_request = [math.ceil(length / block_size) for length in lengths]
    block_table = torch.zeros((requests, max(blocks_per_request)), dtype=torch.int32, device=device)
    permutation = torch.randperm(blocks, generator=gen, device=device).to(torch.int32)
    cursor = 0
    for request, count in enumerate(blocks_per_request):
        block_table[request, :count] = permutation[cursor:cursor + count]
        cursor += count
    entries = blocks * block_size
    codes = torch.randn((entries, NOPE_DIM), generator=gen, device=device).to(torch.float8_e4m3fn)
    scales = torch.rand((entries, NUM_GROUPS), generator=gen, device=device) * 2.0 + 0.1
    rope = torch.randn((entries, ROPE_DIM), generator=gen, device=device, dtype=torch.bfloat16)
    cache = torch.cat([codes.view(torch.uint8), scales.view(torch.uint8), rope.view(torch.uint8)], dim=1)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    return cache.view(blocks, block_size, ENTRY_BYTES), block_table, seq_lens


def reference(cache, block_table, seq_lens):
    block_size = cache.shape[1]
    lengths = seq_lens.long()
    request = torch.repeat_interleave(torch.arange(lengths.numel(), device=cache.device), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    positions = torch.arange(request.numel(), device=cache.device) - starts[request]
    blocks = block_table[request, torch.div(positions, block_size, rounding_mode="floor")].long()
    entries = cache[blocks, positions % block_size]
    codes = entries[:, :NOPE_DIM].contiguous().view(torch.float8_e4m3fn).float()
    scales = entries[:, NOPE_DIM:NOPE_DIM + SCALE_BYTES].contiguous().view(torch.float32)
    nope = (codes.view(-1, NUM_GROUPS, GROUP_SIZE) * scales[:, :, None]).to(torch.bfloat16).view(-1, NOPE_DIM)
    rope = entries[:, NOPE_DIM + SCALE_BYTES:].contiguous().view(torch.bfloat16)
    return torch.cat((nope, rope), dim=-1)


def flops(cache, block_table, seq_lens):
    return int(seq_lens.long().sum()) * NOPE_DIM


def bytes_moved(cache, block_table, seq_lens):
    tokens = int(seq_lens.long().sum())
    table_reads = int(((seq_lens.long() + cache.shape[1] - 1) // cache.shape[1]).sum())
    return (tokens * (ENTRY_BYTES + 2 * (NOPE_DIM + ROPE_DIM)) + table_reads * block_table.element_size()
            + seq_lens.numel() * seq_lens.element_size())
