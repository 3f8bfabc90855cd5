"""Pure-torch ``flash_attn.utils.distributed.all_gather``: concatenate a tensor from every rank along dim 0."""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_gather(input_: torch.Tensor, process_group=None) -> torch.Tensor:
    world_size = dist.get_world_size(process_group)
    output = torch.empty(world_size * input_.shape[0], *input_.shape[1:], dtype=input_.dtype, device=input_.device)
    dist.all_gather_into_tensor(output, input_.contiguous(), group=process_group)
    return output
