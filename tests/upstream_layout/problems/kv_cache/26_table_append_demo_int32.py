"""Append block ids to two block tables and count them, in the published layout (tables returned through aliases)."""

import torch

REQUESTS = 8
WIDTH = 16


@torch.no_grad()
def reference(table_0: torch.Tensor, table_1: torch.Tensor, num_blocks: torch.Tensor,
              new_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    tables = [table_0, table_1]
    counts = num_blocks
    for group, table in enumerate(tables):
        rows = torch.arange(REQUESTS)
        table[rows, counts[group].long()] = new_ids + group
    counts += 1
    return tables[0], tables[1], counts, new_ids * 2


def make_inputs() -> list:
    tables = [torch.randint(0, 1000, (REQUESTS, WIDTH), dtype=torch.int32) for _ in range(2)]
    counts = torch.randint(0, WIDTH - 1, (2, REQUESTS), dtype=torch.int32)
    return [*tables, counts, torch.randint(0, 1000, (REQUESTS,), dtype=torch.int32)]
