"""Per-1x128-group FP8 quantisation in TIRx: eight lanes per group, 16-byte loads, shuffle amax, exact division."""
import functools

import torch
import tvm_tirx
from tvm_tirx.backend.config import parse_backend_config
from tvm_tirx.backend.cuda.compiler import compile_source
from tvm_tirx.script import tirx as T

GROUP = 128
FP8_MAX = 448.0
# IEEE division x / scale as the reference does it, no flush-to-zero: the default build passes --use_fast_math.
_NO_FAST_MATH = {"cuda": {"nvcc": [], "nvrtc": []}}
_THREADS = 256
_LANES = 8  # lanes per group; each lane owns two 8-element chunks, lane and lane + 8
_VEC = 8  # bf16 per 16-byte load
_CHUNKS = GROUP // (_LANES * _VEC)


def _kernel(hidden):
    if hidden % GROUP:
        raise ValueError(f"hidden={hidden} is not a multiple of the group size {GROUP}")
    groups_per_row = hidden // GROUP
    amin = float(torch.tensor(1e-10, dtype=torch.float32))  # the fp32 value the reference clamps to
    m = T.dynamic("m")

    @T.function
    def fp8_group_quant(
        X: T.Tensor((m, hidden), T.bfloat16, align=16),
        Q: T.Tensor((m, hidden), T.float8_e4m3fn, align=16),
        S: T.Tensor((m, groups_per_row), T.float32),
    ):
        T.device_entry(
            launch=T.cuda.LaunchConfig(grid=T.ceildiv(m * groups_per_row * _LANES, _THREADS), block=_THREADS),
            backend_config=_NO_FAST_MATH,
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


@functools.cache
def _compiled(hidden, arch):
    return tvm_tirx.tirx.compile(_kernel(hidden), target=tvm_tirx.target.Target({"kind": "cuda", "arch": arch}))


def _arch(device):
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _e4m3_bits(y):
    """e4m3fn bit pattern of fp32 `y` (already clamped to +-448), rounded to nearest even: the llvm target's own
    fp8 cast neither saturates nor rounds subnormals correctly."""
    bits = T.reinterpret(y, ty="uint32")
    ab = bits & T.uint32(0x7FFFFFFF)
    # Subnormals (|y| < 2**-6): k * 2**-9 with k = round-half-even(|y| * 512); k = 8 is the smallest normal.
    v = T.reinterpret(ab, ty="float32") * T.float32(512.0)
    fl = T.floor(v)
    fr = v - fl
    ki = T.Cast("uint32", fl)
    odd = (ki & T.uint32(1)) == T.uint32(1)
    sub = ki + T.if_then_else((fr > T.float32(0.5)) | ((fr == T.float32(0.5)) & odd), T.uint32(1), T.uint32(0))
    # Normals: round the fp32 mantissa to 3 bits (half to even), then rebias the exponent from 127 to 7.
    normal = ((ab + T.uint32(0x7FFFF) + ((ab >> T.uint32(20)) & T.uint32(1))) >> T.uint32(20)) - T.uint32(120 << 3)
    code = T.if_then_else(ab >= T.uint32(121 << 23), normal, sub)
    return T.Cast("uint8", code | ((bits >> T.uint32(24)) & T.uint32(0x80)))


@functools.cache
def _cpu_compiled(hidden):
    """Host (llvm) kernel: one parallel iteration per group; q is written as e4m3 bit patterns (uint8)."""
    if hidden % GROUP:
        raise ValueError(f"hidden={hidden} is not a multiple of the group size {GROUP}")
    groups_per_row = hidden // GROUP
    amin = float(torch.tensor(1e-10, dtype=torch.float32))
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
                Q[row, grp * GROUP + j] = _e4m3_bits(T.min(T.max(y, T.float32(-FP8_MAX)), T.float32(FP8_MAX)))

    return tvm_tirx.tirx.compile(fp8_group_quant_cpu, target="llvm")


def _solve_cpu(x):
    if x.dtype != torch.bfloat16 or x.dim() != 2:
        raise TypeError("fp8_group_quant tirx kernel takes a 2-D bf16 tensor")
    m, k = x.shape
    x = x.contiguous()
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((m, k // GROUP), dtype=torch.float32, device=x.device)
    if m > 0:
        _cpu_compiled(k)(x, q.view(torch.uint8), scales)
    return q, scales


def solve(x):
    if not x.is_cuda:
        return _solve_cpu(x)
    if x.dtype != torch.bfloat16 or x.dim() != 2:
        raise TypeError("fp8_group_quant tirx kernel takes a 2-D bf16 tensor")
    m, k = x.shape
    x = x.contiguous()
    if x.numel() >= 2**31:
        raise ValueError("tensor too large for the kernel's 32-bit indexing")
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((m, k // GROUP), dtype=torch.float32, device=x.device)
    if m > 0:
        _compiled(k, _arch(x.device))(x, q, scales)
    return q, scales


def _nvcc_build(ex, what):
    """Build the device code of `ex` now with nvcc (solve's NVRTC build happens lazily at the first launch)."""
    for mod in ex.mod.imports:
        config = parse_backend_config(mod.inspect_source("backend_config"))
        config["cuda"]["compiler"] = "nvcc"
        if not compile_source(mod.inspect_source("cuda"), config).binary:
            raise RuntimeError(f"nvcc produced no device binary for {what}")


def compile_for(arch: str) -> None:
    """Compile the kernel solve launches at the full and odd sizes (both hidden 7168) to a device binary for `arch`."""
    _nvcc_build(_compiled(7168, arch), "hidden=7168")
