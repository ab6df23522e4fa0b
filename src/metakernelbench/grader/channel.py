"""Messages between the trusted parent and the untrusted child: length-framed JSON, never pickle; output tensors
travel as raw bytes through a file the parent sizes and maps.

The parent must never unpickle what the child sends (that would run the child's code in the parent), so tensors
cross as dtype/shape/offset records plus bytes, and the parent rebuilds them with numpy and torch alone.
"""
from __future__ import annotations

import json
import math
import socket
import struct

import numpy as np
import torch

MAX_HEADER = 1 << 20
_LEN = struct.Struct("!Q")
# dtypes numpy cannot hold travel as raw integers of the same width and are reinterpreted on arrival.
_CARRIER = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class ChannelClosed(Exception):
    """The other side went away (exited, crashed or was killed)."""


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Read exactly n bytes straight into one buffer (outputs can be hundreds of MB: no intermediate copies)."""
    buffer = bytearray(n)
    view, got = memoryview(buffer), 0
    while got < n:
        count = sock.recv_into(view[got:], min(n - got, 1 << 24))
        if not count:
            raise ChannelClosed("peer closed the channel")
        got += count
    return buffer


def send(sock: socket.socket, header: dict) -> None:
    raw = json.dumps(header).encode()
    sock.sendall(_LEN.pack(len(raw)) + raw)


def recv(sock: socket.socket) -> dict:
    (size,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if size > MAX_HEADER:
        raise ChannelClosed(f"message of {size} bytes exceeds the limit: channel corrupted")
    header = json.loads(_recv_exact(sock, size))
    if not isinstance(header, dict):
        raise ChannelClosed("message is not an object: channel corrupted")
    return header


def write_to_file(tensors: list[torch.Tensor], path: str) -> list[dict]:
    """Copy tensors' bytes straight into a file the parent sized and maps (one device-to-host copy, no socket copies:
    outputs of hundreds of MB cross in tens of ms). Raises when they do not fit the parent's size."""
    array = np.memmap(path, dtype=np.uint8, mode="r+")
    metas, offset = [], 0
    for t in tensors:
        flat = t.detach().contiguous().view(-1)
        nbytes = flat.numel() * flat.element_size()
        if offset + nbytes > array.size:
            raise ValueError(f"outputs exceed the {array.size} bytes the expected outputs need")
        if nbytes:
            target = torch.from_numpy(array[offset:offset + nbytes]).view(_CARRIER[flat.element_size()])
            target.copy_(flat.view(_CARRIER[flat.element_size()]))
        metas.append({"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "offset": offset,
                      "nbytes": nbytes})
        offset += nbytes
    return metas  # no msync: the reader maps the same page cache, and a sync to disk costs milliseconds


def input_records(inputs: tuple) -> tuple[list[dict], list[torch.Tensor]]:
    """How a call's inputs cross to the child: one record per input, tensors by layout (their bytes travel by file or
    IPC), Python scalars, sequences of them and dtypes by value (upstream problems pass floats such as sm_scale and
    ints such as top_k). Raises TypeError for anything else."""
    records, tensors = [], []
    for value in inputs:
        if isinstance(value, torch.Tensor):
            records.append({"kind": "tensor"})
            tensors.append(value)
        elif isinstance(value, torch.dtype):
            records.append({"kind": "dtype", "value": str(value).removeprefix("torch.")})
        elif value is None or isinstance(value, (bool, int, float, str)):
            records.append({"kind": "scalar", "value": value})
        elif isinstance(value, (tuple, list)) and all(v is None or isinstance(v, (bool, int, float, str))
                                                     for v in value):
            records.append({"kind": type(value).__name__, "value": list(value)})
        else:
            raise TypeError(f"an input of type {type(value).__name__} cannot be handed to the child")
    return records, tensors


def input_values(records: list[dict], tensors: list[torch.Tensor]) -> tuple:
    """The child's side of `input_records`: the inputs again, tensors taken in order from `tensors`."""
    made = iter(tensors)
    values = []
    for record in records:
        kind = record["kind"]
        if kind == "tensor":
            values.append(next(made))
        elif kind == "dtype":
            dtype = getattr(torch, str(record["value"]), None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"unknown dtype {record['value']!r}")
            values.append(dtype)
        elif kind in ("tuple", "list"):
            values.append(tuple(record["value"]) if kind == "tuple" else list(record["value"]))
        else:
            values.append(record["value"])
    return tuple(values)


def output_layout(meta: dict) -> tuple[torch.dtype, list[int], int, int]:
    """(dtype, shape, offset, nbytes) of one output record the child sent, or ValueError when they disagree."""
    dtype = getattr(torch, str(meta["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {meta['dtype']!r}")
    shape = [int(s) for s in meta["shape"]]
    offset, nbytes = int(meta["offset"]), int(meta["nbytes"])
    if offset < 0 or nbytes != dtype.itemsize * math.prod(shape):
        raise ValueError("output metadata does not match the bytes written")
    return dtype, shape, offset, nbytes


def read_from_file(metas: list[dict], path: str, device: str) -> list[torch.Tensor]:
    """Rebuild tensors from the file the child filled, validating every offset and size against the file."""
    array = np.memmap(path, dtype=np.uint8, mode="c")  # copy-on-write: writable views, the file untouched
    tensors = []
    for meta in metas:
        dtype, shape, offset, nbytes = output_layout(meta)
        if offset + nbytes > array.size:
            raise ValueError("output metadata does not match the bytes written")
        # Copied into a fresh torch allocation (aligned as torch aligns; DSLs such as TVM require it) on `device`.
        owned = torch.empty(nbytes, dtype=torch.uint8, device=device)
        if nbytes:
            owned.copy_(torch.from_numpy(array[offset:offset + nbytes]))
        tensors.append(owned.view(_CARRIER[dtype.itemsize]).view(dtype).reshape(shape))
    return tensors
