"""A model's FSDP2 modules as hvdsketch exchanges them: one reduce-scatter each, of a fixed layout.

Each ``FSDPModule`` reduces the chunk-cat of its gradients (rank 0's padded shards, then rank 1's, ...).
:func:`shards` describes it as a tensor whose dimension 0 is ``N`` blocks, block ``q`` rank ``q``'s: rows
``(N * rows, d)`` where every shard has rows of one width ``d > 1`` (so an embedding's rows are the rows the
methods see), otherwise flat.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

#: What hvdsketch needs of FSDP2, and the PyTorch that first has it.
NEEDS = {"set_custom_reduce_scatter": "2.9", "set_force_sum_reduction_for_comms": "2.9",
         "set_gradient_divide_factor": "2.9", "set_all_reduce_hook": "2.7"}


def missing_api(replicate: bool) -> str | None:
    """Why this PyTorch cannot run hvdsketch's FSDP front end (``replicate``: with HSDP's replica
    all-reduce), or ``None``."""
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard import _fsdp_api  # noqa: F401 (the ReduceScatter base)
    except ImportError:
        return f"hvdsketch.torch.fsdp needs FSDP2 (torch.distributed.fsdp.fully_shard) of PyTorch >= 2.9; this is {torch.__version__}"
    needed = [name for name in NEEDS if (replicate or name != "set_all_reduce_hook") and not hasattr(FSDPModule, name)]
    if needed:
        return (f"hvdsketch.torch.fsdp needs PyTorch >= {max(NEEDS[n] for n in needed)} (FSDPModule."
                f"{', FSDPModule.'.join(needed)}); this is {torch.__version__}")
    return None


@dataclass(frozen=True)
class Shard:
    """One FSDP module's reduce-scatter: ``module``'s name in the model (``"<root>"`` for the model
    itself), the shape its input is exchanged in (dimension 0 in ``size`` blocks) and its dtype."""

    name: str
    module: Any
    shape: tuple[int, ...]
    dtype: str
    size: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def block(self) -> tuple[int, ...]:
        """The shape of one rank's block: what FSDP's reduce-scatter gives this rank."""
        return (self.shape[0] // self.size, *self.shape[1:])

    @property
    def mesh(self) -> str:
        """How FSDP shards the module: ``"FSDP"`` over one mesh dimension, ``"HSDP"`` over two
        (replicas and shards, FSDP's own replica all-reduce), ``"DDP"`` replicated only."""
        return type(_param_group(self.module).mesh_info).__name__.removesuffix("MeshInfo")

    @property
    def group(self) -> Any:
        """The process group FSDP reduce-scatters this module's gradients over."""
        info = _param_group(self.module).mesh_info
        return getattr(info, "reduce_scatter_process_group", None) or info.shard_process_group


def _param_group(module: Any) -> Any:
    groups = module._get_fsdp_state()._fsdp_param_groups
    if len(groups) > 1:
        raise ValueError("hvdsketch: an FSDP module with several parameter groups (fully_shard's shard_placement_fn "
                         "giving parameters different meshes) takes no custom reduce-scatter; wrap them apart")
    return groups[0] if groups else None


def _dtype(group: Any) -> str:
    policy = group.mp_policy
    dtype = policy.reduce_dtype or policy.param_dtype or group.fsdp_params[0].sharded_param.dtype
    return str(dtype).removeprefix("torch.")


def shards(model: torch.nn.Module) -> list[Shard]:
    """Every FSDP module of ``model`` (itself included) that has parameters, in the model's order."""
    from torch.distributed.fsdp import FSDPModule

    found = []
    for name, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        group = _param_group(module)
        if group is None or not group.fsdp_params:
            continue
        size = group.mesh_info.shard_mesh_size
        blocks = [tuple(p.padded_sharded_param_size) for p in group.fsdp_params]
        widths = {math.prod(b[1:]) for b in blocks}
        width = next(iter(widths))
        rows = sum(b[0] for b in blocks)
        shape = ((size * rows, width) if len(widths) == 1 and width > 1 else
                 (size * sum(math.prod(b) for b in blocks),))
        found.append(Shard(name or "<root>", module, shape, _dtype(group), size))
    return found
