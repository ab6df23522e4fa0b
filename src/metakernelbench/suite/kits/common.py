"""Host-side helpers of every reference, whatever its DSL: the GPU's arch name, vector widths, index-width guards."""
import functools

import torch


@functools.cache
def gpu_arch(device: torch.device) -> str:
    """`sm_90a` on Hopper: the `a` suffix unlocks arch-specific instructions (wgmma, setmaxnreg) from sm_90 up."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def vector_width(element_size: int, length: int, addresses=()) -> int:
    """Elements per access: the widest power of two up to 16 bytes that divides `length` and keeps every address
    aligned (a power of two divides each address exactly when it divides their OR)."""
    aligned = 0
    for address in addresses:
        aligned |= address
    vec = max(1, 16 // element_size)
    while vec > 1 and (length % vec or aligned % (vec * element_size)):
        vec //= 2
    return vec


def require_int32_indexing(*tensors: torch.Tensor) -> None:
    """Kernels index with 32-bit integers: refuse tensors they cannot address instead of wrapping around."""
    for tensor in tensors:
        if tensor.numel() >= 2**31:
            raise ValueError(f"a tensor of shape {tuple(tensor.shape)} is too large for 32-bit indexing")


def batcher_network(n: int) -> list[tuple[int, int]]:
    """Comparator pairs (i, j), i < j, of Batcher's odd-even merge sort for n a power of two: 19 compares sort 8
    values where a bitonic network needs 24. Unrolled in a kernel, it sorts registers without branches."""
    pairs = []
    p = 1
    while p < n:
        k = p
        while k >= 1:
            for j in range(k % p, n - k, 2 * k):
                for i in range(min(k, n - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    return pairs


def split_kv_slots(tokens: int, batch: int, chunk: int) -> int:
    """Work slots of a split-KV grid over CSR sequences, sized on the host from shapes alone (kv_indices.numel() and
    batch), so no host sync reads kv_indptr: chunk s of sequence b takes slot kv_indptr[b] // chunk + b + s. The
    slots are distinct (sequence b+1's first slot lies kv_indptr[b+1] // chunk - kv_indptr[b] // chunk + 1 slots
    after b's, at least b's ceil(len_b / chunk) chunks) and all below tokens // chunk + batch; a few stay empty."""
    return tokens // chunk + batch


def gathered_rows(seq_lens: torch.Tensor) -> int:
    """Rows of a gather that stacks requests of seq_lens[r] tokens: the output's shape depends on device data, so
    such a solve must wait for it once; a copy of the lengths to the host, no kernel."""
    return int(seq_lens.cpu().long().sum())
