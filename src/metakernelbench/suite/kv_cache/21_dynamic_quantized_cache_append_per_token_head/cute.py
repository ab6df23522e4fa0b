"""Per-(token, head) FP8 cache append in CuTe DSL: 8 lanes per head row, amax by 3 shuffles, 16-byte loads, stores."""
import functools

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from metakernelbench.suite.kits.common import gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.cute import compile_kernel, fake_ptr, gmem_ptr, lanes_max, stream_of, vector_copy

FP8_MAX = 448.0
MIN_SCALE = 1e-6
INV_FP8_MAX = 1.0 / FP8_MAX  # the scale is amax x fp32(1/448), as torch divides by a scalar on CUDA
CODES_PER_LANE = 16  # 16 e4m3 codes are one 16-byte store; their bf16 sources are two 16-byte loads
THREADS = 256


class _QuantAppend:
    def __init__(self, heads: int, head_dim: int):
        self.heads, self.head_dim = heads, head_dim
        self.lanes = head_dim // CODES_PER_LANE  # lanes per (token, head) row: a power of two up to 32

    @cute.jit
    def __call__(self, pKey: cute.Pointer, pVal: cute.Pointer, pSlot: cute.Pointer, pKc: cute.Pointer,
                 pVc: cute.Pointer, pKs: cute.Pointer, pVs: cute.Pointer, tokens: cutlass.Int32,
                 cache_rows: cutlass.Int32, stream: cuda.CUstream):
        # Raw pointers, runtime token and slot counts: one compile per (heads, head_dim). Rows are (token, head)
        # pairs of head_dim elements, in the inputs and in the caches (a cache row is (slot, head)).
        rows = tokens * self.heads
        src = cute.make_layout((rows, self.head_dim), stride=(self.head_dim, 1))
        dst = cute.make_layout((cache_rows, self.head_dim), stride=(self.head_dim, 1))
        mKey, mVal = cute.make_tensor(pKey, src), cute.make_tensor(pVal, src)
        mKc, mVc = cute.make_tensor(pKc, dst), cute.make_tensor(pVc, dst)
        mKs = cute.make_tensor(pKs, cute.make_layout((cache_rows,)))
        mVs = cute.make_tensor(pVs, cute.make_layout((cache_rows,)))
        mSlot = cute.make_tensor(pSlot, cute.make_layout((tokens,)))
        per_cta = THREADS // self.lanes
        self.kernel(mKey, mVal, mSlot, mKc, mVc, mKs, mVs).launch(
            grid=((rows + per_cta - 1) // per_cta, 1, 1), block=(THREADS, 1, 1), stream=stream)

    @cute.jit
    def _quantize(self, x: cute.TensorSSA, codes: cute.Tensor) -> cutlass.Float32:
        """Codes of one lane's slice of a row into `codes`; returns the row's scale (all its lanes take part)."""
        amax = lanes_max(cute.math.abs(x).reduce(cute.ReductionOp.MAX, cutlass.Float32(0.0), 0), self.lanes)
        scale = cute.arch.fmax(amax * cutlass.Float32(INV_FP8_MAX), cutlass.Float32(MIN_SCALE))
        # The contract multiplies by the fp32 reciprocal (x * (1 / scale)), so the kernel does too: same codes, bit
        # for bit. The e4m3 conversion is cvt.rn.satfinite: round to nearest even, saturating at +-448 (the clamp).
        inv = cutlass.Float32(1.0) / scale
        codes.store((x * inv).to(codes.element_type))
        return scale

    @cute.kernel
    def kernel(self, mKey: cute.Tensor, mVal: cute.Tensor, mSlot: cute.Tensor, mKc: cute.Tensor, mVc: cute.Tensor,
               mKs: cute.Tensor, mVs: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        L, V = self.lanes, CODES_PER_LANE // 2  # V: bf16 per 16-byte load
        row = bidx * (THREADS // L) + tidx // L
        lane = tidx % L
        rows = mKey.shape[0]
        # Tail rows still join the shuffles (full-warp masks): they read a valid row's slot and write nothing.
        token = cutlass.min(row, rows - 1) // self.heads
        head = row % self.heads
        slot = mSlot[token]
        write = (row < rows) & (slot >= 0)
        load = vector_copy(mKey.element_type, V)
        store = vector_copy(mKc.element_type, CODES_PER_LANE)
        rK = cute.make_rmem_tensor((CODES_PER_LANE,), mKey.element_type)
        rV = cute.make_rmem_tensor((CODES_PER_LANE,), mVal.element_type)
        rK.fill(0)
        rV.fill(0)
        if write:
            # Lane l owns elements [16 l, 16 l + 16) of its row: two 16-byte loads of the key, two of the value.
            gKey = cute.zipped_divide(mKey[row, None], (V,))
            gVal = cute.zipped_divide(mVal[row, None], (V,))
            vK, vV = cute.zipped_divide(rK, (V,)), cute.zipped_divide(rV, (V,))
            for j in cutlass.range_constexpr(2):
                cute.copy(load, gKey[None, 2 * lane + j], vK[None, j])
                cute.copy(load, gVal[None, 2 * lane + j], vV[None, j])
        qK = cute.make_rmem_tensor((CODES_PER_LANE,), mKc.element_type)
        qV = cute.make_rmem_tensor((CODES_PER_LANE,), mVc.element_type)
        k_scale = self._quantize(rK.load().to(cutlass.Float32), qK)
        v_scale = self._quantize(rV.load().to(cutlass.Float32), qV)
        if write:
            cache_row = slot * self.heads + head
            cute.copy(store, qK, cute.zipped_divide(mKc[cache_row, None], (CODES_PER_LANE,))[None, lane])
            cute.copy(store, qV, cute.zipped_divide(mVc[cache_row, None], (CODES_PER_LANE,))[None, lane])
            if lane == 0:
                mKs[cache_row] = k_scale
                mVs[cache_row] = v_scale


@functools.cache
def _compiled(heads, head_dim, arch):
    """Compile once per (heads, head_dim) and arch; token and cache-slot counts stay dynamic."""
    if head_dim % CODES_PER_LANE or (head_dim // CODES_PER_LANE) not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"dynamic_quantized_cache_append cute: head_dim {head_dim} is not 16 x a power of two <= 512")
    bf16, codes = fake_ptr(torch.bfloat16, 16), fake_ptr(torch.float8_e4m3fn, 16)
    scales = fake_ptr(torch.float32, 4)
    return compile_kernel(_QuantAppend(heads, head_dim), bf16, bf16, fake_ptr(torch.int64, 8), codes, codes, scales,
                          scales, cutlass.Int32(1), cutlass.Int32(1), arch=arch)


def solve(key, value, slot_mapping, key_cache, value_cache, k_scale_cache, v_scale_cache):
    tokens, heads, head_dim = key.shape
    if key.dtype != torch.bfloat16 or value.dtype != torch.bfloat16:
        raise TypeError("dynamic_quantized_cache_append cute: key and value must be bf16")
    if key_cache.dtype != torch.uint8 or value_cache.dtype != torch.uint8:
        raise TypeError("dynamic_quantized_cache_append cute: the caches must be uint8 (e4m3 bit patterns)")
    if k_scale_cache.dtype != torch.float32 or v_scale_cache.dtype != torch.float32:
        raise TypeError("dynamic_quantized_cache_append cute: the scale caches must be fp32")
    if not all(t.is_contiguous() for t in (key_cache, value_cache, k_scale_cache, v_scale_cache)):
        raise ValueError("dynamic_quantized_cache_append cute: caches must be contiguous to be updated in place")
    if tokens == 0:
        return key_cache, value_cache, k_scale_cache, v_scale_cache
    key, value, slots = key.contiguous(), value.contiguous(), slot_mapping.to(torch.int64).contiguous()
    require_int32_indexing(key, key_cache)
    kernel = _compiled(heads, head_dim, gpu_arch(key.device))
    codes = torch.float8_e4m3fn  # the uint8 caches hold e4m3 bit patterns: the kernel writes them as e4m3
    kernel(gmem_ptr(key, 16), gmem_ptr(value, 16), gmem_ptr(slots, 8), gmem_ptr(key_cache.view(codes), 16),
           gmem_ptr(value_cache.view(codes), 16), gmem_ptr(k_scale_cache, 4), gmem_ptr(v_scale_cache, 4), tokens,
           key_cache.numel() // head_dim, stream_of(key))
    return key_cache, value_cache, k_scale_cache, v_scale_cache


def compile_for(arch: str, sizes: list[dict]) -> None:
    for shape in {(dims["heads"], dims["head_dim"]) for dims in sizes}:
        _compiled(*shape, arch)
