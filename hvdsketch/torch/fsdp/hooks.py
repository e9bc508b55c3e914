"""The objects FSDP2 calls, a custom reduce-scatter per module and HSDP's replica all-reduce hook, each handing
its call to :class:`~hvdsketch.torch.fsdp.reduction.FSDPReduction` with the module's shard."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from hvdsketch.torch.fsdp.modules import Shard

try:  # private in PyTorch 2.9-2.13; modules.missing_api says what a PyTorch without it lacks
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
except ImportError:  # pragma: no cover - an older PyTorch: compress() raises before any hook is made
    ReduceScatter = object


class CompressedReduceScatter(ReduceScatter):
    """One FSDP module's reduce-scatter (``FSDPModule.set_custom_reduce_scatter``): FSDP reads this rank's block
    when it returns; ``reduce(shard, output, input, group, op)`` fills it."""

    def __init__(self, reduce: Callable[[Shard, torch.Tensor, torch.Tensor, Any, Any], None], shard: Shard) -> None:
        self.reduce, self.shard = reduce, shard

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any,
                 async_op: bool = False) -> None:
        self.reduce(self.shard, output_tensor, input_tensor, group, op)
        return None


class ReplicaAllReduce:
    """HSDP's all-reduce of one module's reduced block across the replicas, through hvdsketch
    (``FSDPModule.set_all_reduce_hook``): ``all_reduce(shard, block)`` averages it in place."""

    def __init__(self, all_reduce: Callable[[Shard, torch.Tensor], None], shard: Shard) -> None:
        self.all_reduce, self.shard = all_reduce, shard

    def __call__(self, reduce_output: torch.Tensor) -> None:
        self.all_reduce(self.shard, reduce_output)
