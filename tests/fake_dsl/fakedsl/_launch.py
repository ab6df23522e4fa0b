"""The fake DSL's launcher, imported lazily by its first kernel call. Like CuTe DSL's runtime, a native library
installed beside the package (not below it) is loaded here when present."""
import ctypes
from pathlib import Path

_RUNTIME = Path(__file__).resolve().parents[1] / "fakedsl_runtime" / "libruntime.so"
if _RUNTIME.is_file():
    ctypes.CDLL(str(_RUNTIME))


def launch(fn, args):
    return fn(*args)
