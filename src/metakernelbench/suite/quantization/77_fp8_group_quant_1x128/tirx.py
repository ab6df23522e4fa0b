"""Per-1x128-group FP8 quantisation in TIRx: eight lanes per group, 16-byte loads, shuffle amax, exact division."""
import functools

import torch
from tvm_tirx.script import tirx as T

from metakernelbench.suite.kits.common import gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.tirx import NO_FAST_MATH, build_cpu, build_cuda, e4m3_bits, fp32, nvcc_build

GROUP = 128
FP8_MAX = 448.0
CPU_PATH = True
_THREADS = 256
_LANES = 8  # lanes per group; each lane owns two 8-element chunks, lane and lane + 8
_VEC = 8  # bf16 per 16-byte load
_CHUNKS = GROUP // (_LANES * _VEC)


def _kernel(hidden):
    if hidden % GROUP:
        raise ValueError(f"hidden={hidden} is not a multiple of the group size {GROUP}")
    groups_per_row = hidden // GROUP
    amin = fp32(1e-10)  # the fp32 value the reference clamps to
    m = T.dynamic("m")

    @T.function
    def fp8_group_quant(
        X: T.Tensor((m, hidden), T.bfloat16, align=16),
        Q: T.Tensor((m, hidden), T.float8_e4m3fn, align=16),
        S: T.Tensor((m, groups_per_row), T.float32),
    ):
        T.device_entry(
            launch=T.cuda.LaunchConfig(grid=T.ceildiv(m * groups_per_row * _LANES, _THREADS), block=_THREADS),
            backend_config=NO_FAST_MATH,  # IEEE x / scale, as the reference divides
        )
        gtid = T.cuda.block_idx("x") * _THREADS + T.cuda.thread_idx("x")
        g = gtid // _LANES
        lane = gtid % _LANES
        # Tail groups still join the shuffles (full-warp masks): clamp their loads, guard their stores.
        gl = T.min(g, m * groups_per_row - 1)
        row = gl // groups_per_row
        col = (gl % groups_per_row) * GROUP + lane * _VEC
        xv = T.alloc_local((_CHUNKS * _VEC,), T.bfloat16)
        qv = T.alloc_local((_VEC,), T.float8_e4m3fn)
        # Chunk h of all eight lanes is one contiguous 128-byte run: whole sectors per load instruction.
        for h in T.unroll(_CHUNKS):
            xv[h * _VEC : h * _VEC + _VEC] = X[row, T.Ramp(col + h * _LANES * _VEC, 1, _VEC)]
        # |x| on the bf16 bit pattern: integer order equals float order for magnitudes, and NaN (above inf)
        # propagates like torch's amax.
        amax_bits: T.uint32 = 0
        for i in T.unroll(_CHUNKS * _VEC):
            amax_bits = T.max(amax_bits, T.Cast("uint32", T.reinterpret(xv[i], ty="uint16")) & T.uint32(0x7FFF))
        amax_bits = T.cuda.warp_max(amax_bits, _LANES)
        amax = T.reinterpret(amax_bits << T.uint32(16), ty="float32")
        scale = T.max(amax, T.float32(amin)) / T.float32(FP8_MAX)
        if g < m * groups_per_row:
            if lane == 0:
                S[row, gl % groups_per_row] = scale
            for h in T.unroll(_CHUNKS):
                for j in T.unroll(_VEC):
                    # The e4m3 cast rounds to nearest and saturates (satfinite) at +-448, i.e. it is the clamp.
                    qv[j] = T.float8_e4m3fn(T.float32(xv[h * _VEC + j]) / scale)
                Q[row, T.Ramp(col + h * _LANES * _VEC, 1, _VEC)] = qv[T.Ramp(0, 1, _VEC)]

    return fp8_group_quant


def _cpu_kernel(hidden):
    """Host (llvm) kernel: one parallel iteration per group; q is written as e4m3 bit patterns (uint8)."""
    if hidden % GROUP:
        raise ValueError(f"hidden={hidden} is not a multiple of the group size {GROUP}")
    groups_per_row = hidden // GROUP
    amin = fp32(1e-10)
    m = T.dynamic("m")

    @T.function
    def fp8_group_quant_cpu(
        X: T.Tensor((m, hidden), T.bfloat16),
        Q: T.Tensor((m, hidden), T.uint8),
        S: T.Tensor((m, groups_per_row), T.float32),
    ):
        for gi in T.parallel(m * groups_per_row):
            row = gi // groups_per_row
            grp = gi % groups_per_row
            st = T.alloc_local((2,), T.float32)
            st[0] = T.float32(0)
            for j in range(GROUP):
                st[0] = T.max(st[0], T.abs(T.float32(X[row, grp * GROUP + j])))
            st[1] = T.max(st[0], T.float32(amin)) / T.float32(FP8_MAX)
            S[row, grp] = st[1]
            for j in range(GROUP):
                y = T.float32(X[row, grp * GROUP + j]) / st[1]
                Q[row, grp * GROUP + j] = e4m3_bits(T.min(T.max(y, T.float32(-FP8_MAX)), T.float32(FP8_MAX)))

    return fp8_group_quant_cpu


@functools.cache
def _compiled(hidden, arch):
    return build_cuda(_kernel(hidden), arch) if arch else build_cpu(_cpu_kernel(hidden))


def solve(x):
    if x.dtype != torch.bfloat16 or x.dim() != 2:
        raise TypeError("fp8_group_quant tirx kernel takes a 2-D bf16 tensor")
    m, k = x.shape
    x = x.contiguous()
    require_int32_indexing(x)
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((m, k // GROUP), dtype=torch.float32, device=x.device)
    if m > 0:
        # The host kernel writes e4m3 bit patterns (the llvm target's own fp8 cast is not the contract's).
        _compiled(k, gpu_arch(x.device) if x.is_cuda else None)(x, q if x.is_cuda else q.view(torch.uint8), scales)
    return q, scales


def compile_for(arch: str, sizes: list[dict]) -> None:
    for hidden in {dims["hidden"] for dims in sizes}:  # the token count is dynamic
        nvcc_build(_compiled(hidden, arch), f"hidden={hidden}")
