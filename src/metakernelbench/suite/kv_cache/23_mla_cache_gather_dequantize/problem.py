"""Gather each request's tokens from a paged FP8 MLA cache into one contiguous fp32 tensor, dequantised (vLLM).

The cache [num_blocks, block_size, entry] is uint8 holding e4m3 bit patterns; an entry is one token's latent plus
its rope dims, all fp8 (512 + 64 = 576 at the timed size, DeepSeek MLA layout). Request r owns seq_lens[r] tokens;
its token p lives in block block_table[r, p // block_size] at offset p % block_size (columns of block_table past a
request's last block are not read). The output stacks the requests in order, [sum(seq_lens), entry] fp32: row
cu[r] + p holds every value of that entry as float32(e4m3 value) * scale, one fp32 multiply (scale is a Python
float, 0.1, rounded to fp32), with cu the exclusive prefix sum of seq_lens. The inputs must not be modified.
"""
import torch

FAMILY = "kv_cache"
SOURCE_MODEL = "DeepSeek MLA layout"
DTYPE = "fp8"
SCALE = 0.1
SIZES = {
    "full": dict(kv_lora_rank=512, rope_dim=64, block_size=16, num_blocks=1024, requests=8, total_tokens=4096),
    "odd": dict(kv_lora_rank=512, rope_dim=64, block_size=16, num_blocks=1024, requests=5, total_tokens=1531),
    "cpu": dict(kv_lora_rank=256, rope_dim=64, block_size=16, num_blocks=32, requests=4, total_tokens=160),
    "cpu_odd": dict(kv_lora_rank=256, rope_dim=64, block_size=16, num_blocks=24, requests=3, total_tokens=77),
}
OUTPUTS = ("out",)
COMPARE = {"out": "float"}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    entry = s["kv_lora_rank"] + s["rope_dim"]
    blocks, requests, total = s["num_blocks"], s["requests"], s["total_tokens"]
    source = torch.randn((blocks, s["block_size"], entry), generator=gen, device=device, dtype=torch.float16)
    src_cache = (source / SCALE).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    block_table = torch.stack([torch.randperm(blocks, generator=gen, device=device) for _ in range(requests)])
    # Request lengths: a random composition of the total into `requests` positive parts.
    cuts = torch.randperm(total - 1, generator=gen, device=device)[:requests - 1].sort().values + 1
    bounds = torch.cat([cuts.new_zeros(1), cuts, cuts.new_full((1,), total)])
    return src_cache, block_table.to(torch.int32), bounds.diff().to(torch.int32), SCALE


def reference(src_cache, block_table, seq_lens, scale):
    block_size = src_cache.shape[1]
    lengths = seq_lens.long()
    request = torch.repeat_interleave(torch.arange(lengths.numel(), device=src_cache.device), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    positions = torch.arange(request.numel(), device=src_cache.device) - starts[request]
    blocks = block_table[request, torch.div(positions, block_size, rounding_mode="floor")].long()
    return src_cache.view(torch.float8_e4m3fn)[blocks, positions % block_size].float() * scale


def flops(src_cache, block_table, seq_lens, scale):
    return int(seq_lens.long().sum()) * src_cache.shape[2]


def bytes_moved(src_cache, block_table, seq_lens, scale):
    tokens = int(seq_lens.long().sum())
    table_reads = int(((seq_lens.long() + src_cache.shape[1] - 1) // src_cache.shape[1]).sum())
    return (tokens * src_cache.shape[2] * (src_cache.element_size() + 4) + table_reads * block_table.element_size()
            + seq_lens.numel() * seq_lens.element_size())
