"""Framed messages between the trusted parent and the untrusted child: JSON headers and raw tensor bytes, never pickle.

The parent must never unpickle what the child sends (that would run the child's code in the parent), so tensors
travel as dtype/shape headers plus their bytes, and the parent rebuilds them with numpy and torch alone.
"""
from __future__ import annotations

import json
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


class Oversized(ChannelClosed):
    """The other side announced more data than the receiver accepts (a flood); nothing of it was read."""


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


def send(sock: socket.socket, header: dict, blobs: list | None = None) -> None:
    blobs = blobs or []
    header = {**header, "blob_sizes": [len(b) for b in blobs]}
    raw = json.dumps(header).encode()
    sock.sendall(_LEN.pack(len(raw)) + raw)
    for blob in blobs:
        sock.sendall(blob)


def recv(sock: socket.socket, max_blob_bytes: int = 1 << 20) -> tuple[dict, list[bytearray]]:
    (size,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if size > MAX_HEADER:
        raise ChannelClosed(f"header of {size} bytes exceeds the limit: channel corrupted")
    header = json.loads(_recv_exact(sock, size))
    if not isinstance(header, dict):
        raise ChannelClosed("header is not an object: channel corrupted")
    sizes = header.pop("blob_sizes", [])
    if not isinstance(sizes, list) or not all(isinstance(s, int) and s >= 0 for s in sizes):
        raise ChannelClosed("blob sizes invalid: channel corrupted")
    if sum(sizes) > max_blob_bytes:
        raise Oversized(f"the submission sent {sum(sizes)} bytes of outputs where at most {max_blob_bytes} fit "
                        "the expected outputs")
    return header, [_recv_exact(sock, int(s)) for s in sizes]


def tensor_to_wire(t: torch.Tensor) -> tuple[dict, memoryview]:
    flat = t.detach().contiguous().view(-1)
    carrier = _CARRIER[t.element_size()]
    data = memoryview(np.ascontiguousarray(flat.view(carrier).cpu().numpy())).cast("B")
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}, data


def tensor_from_wire(meta: dict, data: bytearray) -> torch.Tensor:
    dtype = getattr(torch, str(meta["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {meta['dtype']!r}")
    shape = [int(s) for s in meta["shape"]]
    if not data:
        return torch.empty(shape, dtype=dtype)
    carrier = _CARRIER[torch.empty((), dtype=dtype).element_size()]
    return torch.frombuffer(data, dtype=carrier).view(dtype).reshape(shape)
