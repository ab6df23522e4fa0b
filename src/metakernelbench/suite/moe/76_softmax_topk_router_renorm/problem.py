"""Softmax top-k MoE router with renormalisation (Qwen3-30B-A3B: 128 experts, top 8).

For each token, select the k experts with the largest router logits and return their renormalised softmax weights
(softmax over the selected logits, which equals softmax over all experts renormalised to sum to one) and their ids.
Order: descending logit; ties (equal logits) go to the lower expert index first. Ids are compared exactly, so the
tie rule matters: about a quarter of the rows hold coarsely quantised logits where ties are common.
"""
import torch

FAMILY = "moe"
SOURCE_MODEL = "Qwen3-30B-A3B"
DTYPE = "fp32"
DEMO = True  # one of the problems `mkb demo` runs
SIZES = {
    "full": dict(tokens=32768, experts=128, top_k=8),
    "odd": dict(tokens=3001, experts=128, top_k=8),
    "cpu": dict(tokens=128, experts=64, top_k=8),
    "cpu_odd": dict(tokens=45, experts=128, top_k=8),
}
OUTPUTS = ("topk_weights", "topk_ids")
COMPARE = {"topk_weights": "float", "topk_ids": "exact"}


def make_inputs(seed: int, device: str, size: str = "full"):
    s = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn((s["tokens"], s["experts"]), generator=gen, device=device) * 2.0
    hot = torch.randint(0, s["experts"], (s["tokens"],), generator=gen, device=device)
    logits[torch.arange(s["tokens"], device=device), hot] += 6.0
    tied_rows = torch.rand(s["tokens"], generator=gen, device=device) < 0.25
    logits[tied_rows] = torch.round(logits[tied_rows] * 2.0) / 2.0
    return logits, s["top_k"]


def reference(logits, top_k):
    acc = torch.promote_types(logits.dtype, torch.float32)
    order = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :top_k]
    selected = torch.gather(logits, 1, order).to(acc)
    weights = torch.softmax(selected, dim=-1)
    return weights.to(torch.float32 if acc == torch.float32 else acc), order.to(torch.int32)


def flops(logits, top_k):
    return logits.numel() * 3


def bytes_moved(logits, top_k):
    return logits.numel() * logits.element_size() + logits.shape[0] * top_k * 8
