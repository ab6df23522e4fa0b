"""TIRx reference kit: CUDA and host (llvm) builds, IEEE numerics, the nvcc build of CI's compile check, host fp8.

TIRx kernels must live in a file (the decorator reads its source), so references define their `@T.function`s in
their own file and build them here.
"""
import torch
import tvm_tirx
from tvm_tirx.backend.config import parse_backend_config
from tvm_tirx.backend.cuda.compiler import compile_source
from tvm_tirx.script import tirx as T

# Plain IEEE fp32 (no flush-to-zero, exact division and sqrt): the default CUDA build passes --use_fast_math.
NO_FAST_MATH = {"cuda": {"nvcc": [], "nvrtc": []}}
TIRX_DTYPES = {
    torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32", torch.uint8: "uint8",
    torch.int8: "int8", torch.int16: "int16", torch.int32: "int32", torch.int64: "int64",
    torch.float8_e4m3fn: "float8_e4m3fn",
}


def fp32(value: float) -> float:
    """The fp32 value of a Python constant, as torch's fp32 reference rounds it (1e-5 is not exact in fp32)."""
    return float(torch.tensor(value, dtype=torch.float32))


def build_cuda(function, arch: str):
    """Compile a `@T.function` for a CUDA arch; its device code is built at the first launch (NVRTC)."""
    return tvm_tirx.tirx.compile(function, target=tvm_tirx.target.Target({"kind": "cuda", "arch": arch}))


def build_cpu(function):
    """Compile a `@T.function` for the host CPU (target llvm): how CI grades TIRx references without a GPU."""
    return tvm_tirx.tirx.compile(function, target="llvm")


def nvcc_build(executable, what: str) -> None:
    """Build `executable`'s device code now with nvcc, as CI's compile check does on a machine without a GPU."""
    for module in executable.mod.imports:
        config = parse_backend_config(module.inspect_source("backend_config"))
        config["cuda"]["compiler"] = "nvcc"
        if not compile_source(module.inspect_source("cuda"), config).binary:
            raise RuntimeError(f"nvcc produced no device binary for {what}")


def e4m3_bits(y):
    """e4m3fn bit pattern (uint8) of fp32 `y`, already clamped to +-448, rounded to nearest even: the llvm target's
    own fp8 cast neither saturates nor rounds subnormals correctly."""
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


def e4m3_value(bits):
    """fp32 value of an e4m3fn bit pattern (uint8), exact: the llvm target's own fp8 cast reads zero and the
    subnormals wrong. Normals rebias the exponent from 7 to 127; subnormals are k * 2**-9; 0x7F/0xFF are NaN."""
    b = T.Cast("uint32", bits)
    magnitude = b & T.uint32(0x7F)
    normal = T.reinterpret((magnitude + T.uint32(120 << 3)) << T.uint32(20), ty="float32")
    subnormal = T.Cast("float32", magnitude) * T.float32(2.0**-9)
    value = T.if_then_else(magnitude >= T.uint32(8), normal, subnormal)
    signed = T.reinterpret(T.reinterpret(value, ty="uint32") | ((b & T.uint32(0x80)) << T.uint32(24)), ty="float32")
    return T.if_then_else(magnitude == T.uint32(0x7F), T.reinterpret(T.uint32(0x7FC00000), ty="float32"), signed)


def bf16_round(x):
    """fp32 `x` (finite) rounded to the nearest bf16, ties to even, and widened back, by bit arithmetic: host paths
    need it where the reference rounds mid-computation, as the llvm target's bf16 cast round trip does not round."""
    bits = T.reinterpret(x, ty="uint32")
    rounded = (bits + T.uint32(0x7FFF) + ((bits >> T.uint32(16)) & T.uint32(1))) & T.uint32(0xFFFF0000)
    return T.reinterpret(rounded, ty="float32")
