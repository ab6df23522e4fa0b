"""Whole-block copy between two pools under a block mapping, in the published layout (updated pools returned)."""

import torch

NUM_BLOCKS = 16
BLOCK = 32
NUM_MAPPINGS = 4


@torch.no_grad()
def reference(src: torch.Tensor, dst_k: torch.Tensor, dst_v: torch.Tensor,
              block_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dst_k[block_mapping[:, 1].long()] = src[block_mapping[:, 0].long()]
    dst_v[block_mapping[:, 1].long()] = 2 * src[block_mapping[:, 0].long()]
    return dst_k, dst_v


def make_inputs() -> list:
    device = torch.device("cpu")
    src = torch.randn(NUM_BLOCKS, BLOCK, device=device)
    order = torch.randperm(NUM_BLOCKS, device=device)
    mapping = torch.stack((order[:NUM_MAPPINGS], order[NUM_MAPPINGS:2 * NUM_MAPPINGS]), dim=1).to(torch.int32)
    return [src, torch.randn(NUM_BLOCKS, BLOCK, device=device), torch.randn(NUM_BLOCKS, BLOCK, device=device), mapping]
