"""Hybrid KV-group block tables: staged writes applied in order, then token slot mapping (vLLM v1 BlockTables).

Three KV-cache groups g = 0, 1, 2 with allocation block sizes (16, 32, 8) and kernel block sizes (16, 16, 8), so
expansion e_g = (1, 2, 1): group 1 stores allocation block id b as the two kernel blocks 2b, 2b+1. Inputs:
block_table_0/1/2 int32 [max_num_reqs, width_g]; num_blocks int32 [3, max_num_reqs]; write_requests int32 [W];
overwrite bool [W]; staged_ids int32 [3, W, capacity] (-1 past the count); staged_counts int32 [3, W] in
[0, capacity]; idx_mapping int32 [B] (batch index -> request row); query_start_loc int32 [B + 1], non-decreasing
from 0; positions int64 [N]. Step 1, in place, for each group g independently and for w = 0 .. W-1 in order:
r = write_requests[w], n = staged_counts[g, w], start = 0 if overwrite[w] else num_blocks[g, r]; the n * e_g ids
(staged_ids[g, w, j] * e_g + k for j < n, k < e_g, in that order) go to block_table_g[r, start : start + n * e_g];
then num_blocks[g, r] = start + n * e_g (a request written several times sees its earlier writes). Step 2, on the
updated tables: slot_mappings int64 [3, N]; for batch b, request r = idx_mapping[b], every token
i in [query_start_loc[b], query_start_loc[b+1]) with p = positions[i] and kernel block size K_g gets
slot_mappings[g, i] = block_table_g[r, p // K_g] * K_g + p % K_g; tokens i >= query_start_loc[B] get -1. Indices
stay in range (every write fits its row; every p // K_g < width_g). Outputs, all compared exactly: the three tables
and num_blocks, updated in place and returned as the same tensor objects, and slot_mappings (a new tensor); the
other inputs stay unchanged.
"""
import torch

FAMILY = "kv_cache"
SOURCE_MODEL = "none (vLLM BlockTables test workload, 3 KV groups)"
DTYPE = "int32_int64"
BLOCK_SIZES = (16, 32, 8)
KERNEL_BLOCK_SIZES = (16, 16, 8)
STAGE_CAPACITY = 4
PAD_SLOT_ID = -1
SIZES = {
    "full": dict(max_num_reqs=64, max_num_batched_tokens=4096, max_blocks=(512, 1024, 512)),
    "odd": dict(max_num_reqs=37, max_num_batched_tokens=1531, max_blocks=(512, 1024, 512)),
    "cpu": dict(max_num_reqs=8, max_num_batched_tokens=256, max_blocks=(32, 64, 32)),
    "cpu_odd": dict(max_num_reqs=7, max_num_batched_tokens=97, max_blocks=(40, 80, 40)),
}
OUTPUTS = ("block_table_0", "block_table_1", "block_table_2", "num_blocks", "slot_mappings")
COMPARE = {name: "exact" for name in OUTPUTS}
INPLACE = {"block_table_0": 0, "block_table_1": 1, "block_table_2": 2, "num_blocks": 3}


def make_inputs(seed: int, device: str, size: str = "full"):
    """Upstream's draw (every request written twice, by two permutations; positions below the furthest block the
    staged writes can reach in the smallest group), except that rows start with a random block count instead of
    zero: running requests append after their existing blocks, and num_blocks then takes more than a handful of
    values (the suite audit rejects near-constant outputs)."""
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    reqs, tokens = s["max_num_reqs"], s["max_num_batched_tokens"]
    writes = 2 * reqs
    max_position = writes // reqs * STAGE_CAPACITY * min(BLOCK_SIZES)
    tables = [torch.randint(0, 2048, (reqs, width), generator=gen, device=device, dtype=torch.int32)
              for width in s["max_blocks"]]
    # Room for both writes of a request: 2 x capacity ids, x2 in group 1.
    room = [width - writes // reqs * STAGE_CAPACITY * (b // k)
            for width, b, k in zip(s["max_blocks"], BLOCK_SIZES, KERNEL_BLOCK_SIZES)]
    num_blocks = torch.stack([torch.randint(0, top + 1, (reqs,), generator=gen, device=device, dtype=torch.int32)
                              for top in room])
    write_requests = torch.cat([torch.randperm(reqs, generator=gen, device=device),
                                torch.randperm(reqs, generator=gen, device=device)]).to(torch.int32)
    overwrite = torch.randint(0, 2, (writes,), generator=gen, device=device, dtype=torch.bool)
    staged_counts = torch.randint(0, STAGE_CAPACITY + 1, (3, writes), generator=gen, device=device, dtype=torch.int32)
    candidates = torch.randint(0, 2048, (3, writes, STAGE_CAPACITY), generator=gen, device=device, dtype=torch.int32)
    filled = torch.arange(STAGE_CAPACITY, device=device) < staged_counts[:, :, None]
    staged_ids = torch.where(filled, candidates, -1)
    idx_mapping = torch.randperm(reqs, generator=gen, device=device).to(torch.int32)
    lengths = torch.randint(0, tokens // reqs + 1, (reqs,), generator=gen, device=device)
    boundaries = lengths.cumsum(0).clamp_(max=tokens)
    query_start_loc = torch.cat([boundaries.new_zeros(1), boundaries]).to(torch.int32)
    positions = torch.randint(0, max_position, (tokens,), generator=gen, device=device, dtype=torch.int64)
    return (*tables, num_blocks, write_requests, overwrite, staged_ids, staged_counts, idx_mapping, query_start_loc,
            positions)


def _apply_staged_writes(tables, num_blocks, write_requests, overwrite, staged_ids, staged_counts):
    """Upstream's ordered loop, vectorised: round k holds each request's k-th write, so a round's writes hit distinct
    rows and apply as one scatter, and applying the rounds in order keeps every request's writes in order."""
    device = write_requests.device
    requests = write_requests.long()
    order = torch.arange(requests.numel(), device=device)
    rounds = ((requests[:, None] == requests[None, :]) & (order[None, :] < order[:, None])).sum(1)
    capacity = staged_ids.shape[-1]
    for k in range(int(rounds.max()) + 1 if requests.numel() else 0):
        writes = (rounds == k).nonzero().flatten()
        rows = requests[writes]
        for group, table in enumerate(tables):
            expansion = BLOCK_SIZES[group] // KERNEL_BLOCK_SIZES[group]
            count = staged_counts[group, writes].long() * expansion
            start = torch.where(overwrite[writes], 0, num_blocks[group, rows].long())
            ids = (staged_ids[group, writes].long()[:, :, None] * expansion
                   + torch.arange(expansion, device=device)).reshape(writes.numel(), capacity * expansion)
            span = torch.arange(capacity * expansion, device=device)
            valid = span < count[:, None]
            table[rows[:, None].expand_as(ids)[valid], (start[:, None] + span)[valid]] = ids[valid].to(table.dtype)
            num_blocks[group, rows] = (start + count).to(num_blocks.dtype)


def _slot_mappings(tables, idx_mapping, query_start_loc, positions):
    tokens = positions.numel()
    token = torch.arange(tokens, device=positions.device)
    batch = torch.searchsorted(query_start_loc[1:].contiguous(), token.to(query_start_loc.dtype), right=True)
    scheduled = token < query_start_loc[-1]
    request = idx_mapping.long()[batch.clamp(max=idx_mapping.numel() - 1)]
    slot_mappings = torch.full((len(tables), tokens), PAD_SLOT_ID, device=positions.device, dtype=torch.int64)
    for group, table in enumerate(tables):
        block_size = KERNEL_BLOCK_SIZES[group]
        logical = torch.where(scheduled, torch.div(positions, block_size, rounding_mode="floor"), 0)
        physical = table[request, logical].long()
        slots = physical * block_size + torch.remainder(positions, block_size)
        slot_mappings[group] = torch.where(scheduled, slots, PAD_SLOT_ID)
    return slot_mappings


@torch.no_grad()
def reference(block_table_0, block_table_1, block_table_2, num_blocks, write_requests, overwrite, staged_ids,
              staged_counts, idx_mapping, query_start_loc, positions):
    tables = (block_table_0, block_table_1, block_table_2)
    _apply_staged_writes(tables, num_blocks, write_requests, overwrite, staged_ids, staged_counts)
    slot_mappings = _slot_mappings(tables, idx_mapping, query_start_loc, positions)
    return block_table_0, block_table_1, block_table_2, num_blocks, slot_mappings


def flops(*inputs):
    return 0


def bytes_moved(block_table_0, block_table_1, block_table_2, num_blocks, write_requests, overwrite, staged_ids,
                staged_counts, idx_mapping, query_start_loc, positions):
    """The write list, the staged ids it uses, the table entries it writes, the counts read and written; then the
    batch layout, every position, one table entry per scheduled token and group, and every slot written."""
    expansion = torch.tensor([b // k for b, k in zip(BLOCK_SIZES, KERNEL_BLOCK_SIZES)], device=staged_counts.device)
    used_ids = int(staged_counts.sum())
    written_entries = int((staged_counts.long() * expansion[:, None]).sum())
    scheduled = int(query_start_loc[-1])
    writes = write_requests.numel() * (4 + 1) + staged_counts.numel() * 4 + used_ids * 4 + written_entries * 4
    counts = 2 * num_blocks.numel() * 4
    slots = (idx_mapping.numel() * 4 + query_start_loc.numel() * 4 + positions.numel() * 8 + 3 * scheduled * 4
             + 3 * positions.numel() * 8)
    return writes + counts + slots
