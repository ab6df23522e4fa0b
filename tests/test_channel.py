"""Tensors cross the parent/child channel bit-exactly, without pickle, for every dtype the suite uses."""
import socket

import pytest
import torch

from metakernelbench.grader import channel


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int32,
                                   torch.int64, torch.bool, torch.uint8])
def test_roundtrip_bit_exact(dtype):
    t = (torch.randn(3, 5, 7) * 10).to(dtype)
    meta, blob = channel.tensor_to_wire(t.transpose(0, 2))
    back = channel.tensor_from_wire(meta, blob)
    assert back.dtype == dtype and back.shape == (7, 5, 3)
    assert torch.equal(back.view(torch.uint8) if dtype != torch.bool else back,
                       t.transpose(0, 2).contiguous().view(torch.uint8) if dtype != torch.bool else t.transpose(0, 2))


def test_framed_messages_and_closed_peer():
    a, b = socket.socketpair()
    channel.send(a, {"op": "x", "n": 3}, [b"abc", b""])
    header, blobs = channel.recv(b)
    assert header == {"op": "x", "n": 3} and blobs == [b"abc", b""]
    a.close()
    with pytest.raises(channel.ChannelClosed):
        channel.recv(b)


def test_unknown_dtype_is_refused():
    with pytest.raises(ValueError):
        channel.tensor_from_wire({"dtype": "os.system", "shape": [1]}, b"\0\0\0\0")
