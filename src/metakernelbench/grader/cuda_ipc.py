"""Device-to-device hand-over of outputs and the persisting-L2 reset, through the CUDA driver API (ctypes only).

Copying hundreds of MB of outputs through a file costs about half a second per checked draw; handing the parent an
IPC handle to the child's device memory lets the parent copy them device to device in well under a millisecond.
The parent validates every offset against the mapped range and copies at once into memory it owns, so the child
controls nothing but the bytes it returns, exactly as with the file.
"""
from __future__ import annotations

import ctypes
from contextlib import contextmanager

import torch

from metakernelbench.grader import channel

HANDLE_BYTES = 64
CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06


class TransferError(Exception):
    """The driver refused an IPC step; callers fall back to the file transport."""


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * HANDLE_BYTES)]


_driver: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _driver
    if _driver is None:
        try:
            _driver = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise TransferError(f"no CUDA driver library: {exc}")
    return _driver


def _check(result: int, what: str) -> None:
    if result != 0:
        raise TransferError(f"{what} failed with CUDA driver error {result}")


@contextmanager
def _primary_context(device: torch.device):
    """Driver calls act on the thread's current context; grading lanes run in threads, so make it explicit."""
    lib = _lib()
    ordinal, context = ctypes.c_int(), ctypes.c_void_p()
    _check(lib.cuDeviceGet(ctypes.byref(ordinal), ctypes.c_int(device.index or 0)), "cuDeviceGet")
    _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), ordinal), "cuDevicePrimaryCtxRetain")
    try:
        _check(lib.cuCtxPushCurrent_v2(context), "cuCtxPushCurrent")
        try:
            yield lib
        finally:
            lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    finally:
        lib.cuDevicePrimaryCtxRelease_v2(ordinal)


def export(tensors: list[torch.Tensor]) -> list[dict]:
    """Child side: one record per contiguous tensor (handle of its allocation, offset and size inside it)."""
    if not tensors:
        return []
    records = []
    with _primary_context(tensors[0].device) as lib:
        for t in tensors:
            nbytes = t.numel() * t.element_size()
            record = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "nbytes": nbytes,
                      "device": str(t.device), "handle": "", "offset": 0}
            if nbytes:
                base, size, handle = ctypes.c_uint64(), ctypes.c_size_t(), _Handle()
                _check(lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                                   ctypes.c_uint64(t.data_ptr())), "cuMemGetAddressRange")
                _check(lib.cuIpcGetMemHandle(ctypes.byref(handle), base), "cuIpcGetMemHandle")
                record["handle"] = ctypes.string_at(ctypes.addressof(handle), HANDLE_BYTES).hex()
                record["offset"] = t.data_ptr() - base.value
            records.append(record)
    return records


class DeviceBuffer:
    """Parent side of the input hand-over: one dedicated device allocation (never the caching allocator's, whose
    segments also hold the parent's references) into which each call's inputs are copied; the child maps it by its
    IPC handle and copies them out into memory it owns. Grows when a call needs more; `close` frees it."""

    ALIGN = 256

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self.pointer = 0
        self.size = 0
        self.handle = ""
        self.retired: list[int] = []

    def _reserve(self, nbytes: int) -> None:
        if nbytes <= self.size:
            return
        if self.pointer:  # the child may still map it (cuda_ipc.Mappings): freed only at close, after the child
            self.retired.append(self.pointer)
        size = max(nbytes, 2 << 20)
        with _primary_context(self.device) as lib:
            pointer, handle = ctypes.c_uint64(), _Handle()
            _check(lib.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)), "cuMemAlloc")
            self.pointer, self.size = pointer.value, size
            _check(lib.cuIpcGetMemHandle(ctypes.byref(handle), pointer), "cuIpcGetMemHandle")
        self.handle = ctypes.string_at(ctypes.addressof(handle), HANDLE_BYTES).hex()

    def records(self, tensors: list[torch.Tensor]) -> list[dict]:
        """Copy `tensors` into the buffer (contiguous, each at an aligned offset) and describe them for the child."""
        flats = [t.detach().contiguous().view(-1) for t in tensors]
        sizes = [f.numel() * f.element_size() for f in flats]
        offsets, end = [], 0
        for nbytes in sizes:
            offsets.append(end)
            end += -(-nbytes // self.ALIGN) * self.ALIGN
        self._reserve(end)
        records = []
        for t, flat, nbytes, offset in zip(tensors, flats, sizes, offsets):
            if nbytes:
                target = torch.as_tensor(_DeviceBytes(self.pointer + offset, nbytes), device=self.device)
                target.copy_(flat.view(torch.uint8) if flat.element_size() == 1 else
                             flat.view(channel._CARRIER[flat.element_size()]).view(torch.uint8))
            records.append({"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "nbytes": nbytes,
                            "device": str(self.device), "handle": self.handle if nbytes else "", "offset": offset})
        torch.cuda.current_stream(self.device).synchronize()
        return records

    def close(self) -> None:
        """Only once no child maps the buffers any more (the session reaps its child first)."""
        pointers = self.retired + ([self.pointer] if self.pointer else [])
        if pointers:
            with _primary_context(self.device) as lib:
                for pointer in pointers:
                    lib.cuMemFree_v2(ctypes.c_uint64(pointer))
        self.pointer, self.size, self.handle, self.retired = 0, 0, "", []


class _DeviceBytes:
    """Just enough of `__cuda_array_interface__` for torch to view mapped bytes without owning them."""

    def __init__(self, pointer: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (pointer, False),
                                         "version": 3, "strides": None}


class Mappings:
    """Open IPC mappings kept across calls. The child maps the parent's input buffer once, not per call: on the H200
    an 8 GB buffer cost 63 ms to open and 16 ms to close in every call of a grading (problem 38), against 0.4 ms in a
    lone process. A mapping not named by a call's records is closed then (the parent retired that buffer)."""

    def __init__(self) -> None:
        self.ranges: dict[bytes, tuple[int, int]] = {}

    def close(self, device: str, keep: set = frozenset()) -> None:
        stale = [h for h in self.ranges if h not in keep]
        if not stale:
            return
        with _primary_context(torch.device(device)) as lib:
            for handle in stale:
                lib.cuIpcCloseMemHandle(ctypes.c_uint64(self.ranges.pop(handle)[0]))


def _open(lib, handle: bytes) -> tuple[int, int]:
    pointer, base, size = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_size_t()
    _check(lib.cuIpcOpenMemHandle_v2(ctypes.byref(pointer), _Handle.from_buffer_copy(handle),
                                     ctypes.c_uint(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)), "cuIpcOpenMemHandle")
    try:
        _check(lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), pointer), "cuMemGetAddressRange")
    except TransferError:
        lib.cuIpcCloseMemHandle(pointer)
        raise
    return pointer.value, base.value + size.value - pointer.value


def import_copies(records: list[dict], device: str, kept: Mappings | None = None) -> list[torch.Tensor]:
    """Map each distinct handle once, validate every range against the mapping, copy into tensors this process
    owns; unmap, unless `kept` holds the mappings for later calls. Raises ValueError for records that lie,
    TransferError when the driver refuses."""
    target = torch.device(device)
    shapes = []
    for record in records:
        dtype, shape, offset, nbytes = channel.output_layout(record)
        handle = bytes.fromhex(str(record["handle"])) if nbytes else b""
        if nbytes and len(handle) != HANDLE_BYTES:
            raise ValueError("malformed IPC handle")
        shapes.append((dtype, shape, nbytes, offset, handle))
    wanted = {h for *_, h in shapes if h}
    if kept is not None:
        kept.close(device, keep=wanted)
    ranges = kept.ranges if kept is not None else {}
    copies, opened = [], []
    with _primary_context(target) as lib:
        try:
            for handle in wanted - set(ranges):
                ranges[handle] = _open(lib, handle)
                opened.append(handle)
            for dtype, shape, nbytes, offset, handle in shapes:
                owned = torch.empty(nbytes, dtype=torch.uint8, device=target)
                if nbytes:
                    pointer, length = ranges[handle]
                    if offset + nbytes > length:
                        raise ValueError("an output's range runs past the memory its handle maps")
                    owned.copy_(torch.as_tensor(_DeviceBytes(pointer + offset, nbytes), device=target))
                copies.append(owned.view(dtype).reshape(shape))
            torch.cuda.current_stream(target).synchronize()
        finally:
            if kept is None:
                for handle in opened:
                    lib.cuIpcCloseMemHandle(ctypes.c_uint64(ranges[handle][0]))
    return copies


def reset_persisting_l2(device: torch.device) -> bool:
    """Evict persisting-L2 lines and set their carve-out to zero, so no call inherits data pinned by an earlier one
    (threat 18). False where the driver or GPU has no persisting L2."""
    try:
        with _primary_context(device) as lib:
            limit_ok = lib.cuCtxSetLimit(ctypes.c_int(CU_LIMIT_PERSISTING_L2_CACHE_SIZE), ctypes.c_size_t(0)) == 0
            return lib.cuCtxResetPersistingL2Cache() == 0 and limit_ok
    except TransferError:
        return False


CU_CTX_SCHED_SPIN = 0x1  # cuda.h: a synchronising host thread spins instead of yielding or sleeping


def spin_when_synchronising(index: int) -> str:
    """Before the device's primary context exists: make host threads that synchronise with it spin. Returns the
    schedule now in force, for the verdict."""
    try:
        lib = _lib()
    except TransferError:
        return "default (no libcuda.so.1)"
    handle = ctypes.c_int()
    if (lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(handle), index) != 0
            or lib.cuDevicePrimaryCtxSetFlags(handle, CU_CTX_SCHED_SPIN) != 0):
        return "default (the driver refused spin)"
    return "spin"
