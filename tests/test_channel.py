"""Messages are framed JSON (never pickle); output tensors cross bit-exactly through a file the parent sizes."""
import socket

import pytest
import torch

from metakernelbench.grader import channel, cuda_ipc

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int32, torch.int64, torch.bool,
          torch.uint8]


def _sized(tmp_path, nbytes):
    path = tmp_path / "outputs.bin"
    with open(path, "wb") as f:
        f.truncate(nbytes)
    return str(path)


def test_outputs_round_trip_bit_exact_through_the_file(tmp_path):
    tensors = [(torch.randn(3, 5, 7) * 10).to(dtype).transpose(0, 2) for dtype in DTYPES] + [torch.empty(0, 4)]
    path = _sized(tmp_path, sum(t.numel() * t.element_size() for t in tensors))
    metas = channel.write_to_file(tensors, path)
    back = channel.read_from_file(metas, path, "cpu")
    for want, got in zip(tensors, back):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8))


def test_outputs_larger_than_the_file_are_refused(tmp_path):
    path = _sized(tmp_path, 64)
    with pytest.raises(ValueError, match="exceed"):
        channel.write_to_file([torch.zeros(1024)], path)


@pytest.mark.parametrize("meta", [{"dtype": "os.system", "shape": [1], "offset": 0, "nbytes": 4},
                                  {"dtype": "float32", "shape": [100], "offset": 0, "nbytes": 400},
                                  {"dtype": "float32", "shape": [2], "offset": -4, "nbytes": 8},
                                  {"dtype": "float32", "shape": [3], "offset": 0, "nbytes": 8}])
def test_forged_output_records_are_refused(tmp_path, meta):
    path = _sized(tmp_path, 64)
    with pytest.raises(ValueError):
        channel.read_from_file([meta], path, "cpu")


def test_framed_messages_and_closed_peer():
    a, b = socket.socketpair()
    channel.send(a, {"op": "x", "n": 3})
    assert channel.recv(b) == {"op": "x", "n": 3}
    a.close()
    with pytest.raises(channel.ChannelClosed):
        channel.recv(b)


@pytest.mark.parametrize("record, match", [
    ({"dtype": "float32", "shape": [4], "nbytes": 8, "offset": 0, "handle": "00" * 64}, "does not match"),
    ({"dtype": "os.system", "shape": [4], "nbytes": 16, "offset": 0, "handle": "00" * 64}, "unknown dtype"),
    ({"dtype": "float32", "shape": [4], "nbytes": 16, "offset": -8, "handle": "00" * 64}, "does not match"),
    ({"dtype": "float32", "shape": [4], "nbytes": 16, "offset": 0, "handle": "00" * 8}, "malformed IPC handle"),
])
def test_ipc_records_that_lie_are_refused_before_any_mapping(record, match):
    with pytest.raises(ValueError, match=match):
        cuda_ipc.import_copies([record], "cuda:0")


class _FakeChildSession:
    """Stands in for a child session: offers IPC records first, then writes the file when asked again without IPC."""

    def __init__(self, workdir, outputs):
        self.workdir, self.outputs, self.ipc, self.asked = workdir, outputs, True, []

    def request(self, msg, timeout_s):
        self.asked.append(dict(msg))
        if msg["ipc"]:
            records = [{"dtype": "float32", "shape": list(t.shape), "nbytes": t.numel() * 4, "offset": 0,
                        "handle": "00" * 64, "device": "cpu"} for t in self.outputs]
            return {"outputs": records, "transport": "ipc", "integrity_problems": []}
        metas = channel.write_to_file(self.outputs, msg["path"])
        return {"outputs": [dict(m, device="cpu") for m in metas], "transport": "file", "integrity_problems": []}


def test_a_refused_ipc_hand_over_falls_back_to_the_file_for_the_rest_of_the_session(tmp_path, monkeypatch):
    from metakernelbench.grader import Grader, GraderConfig

    def refuse(records, device):
        raise cuda_ipc.TransferError("cuIpcOpenMemHandle failed with CUDA driver error 201")

    monkeypatch.setattr(cuda_ipc, "import_copies", refuse)
    outputs = [torch.randn(4, 8), torch.arange(6, dtype=torch.float32)]
    session = _FakeChildSession(tmp_path, outputs)
    grader = Grader(GraderConfig(device="cpu"))
    got, transport = grader._fetch_outputs(session, max_bytes=1 << 20)
    assert transport == "file" and session.ipc is False
    assert [m["ipc"] for m in session.asked] == [True, False]
    assert all(torch.equal(a, b) for a, b in zip(got, outputs))
    grader._fetch_outputs(session, max_bytes=1 << 20)
    assert [m["ipc"] for m in session.asked] == [True, False, False]
