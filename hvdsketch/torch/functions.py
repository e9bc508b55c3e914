"""Horovod's restore habit with hvdsketch's optimizer: load on rank 0, then broadcast::

    if hvd.rank() == 0:
        state = torch.load(path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvdsketch.torch.broadcast_optimizer_state(optimizer, root_rank=0)

Horovod's ``hvd.broadcast_optimizer_state`` cannot send hvdsketch's per-rank state: after a load on rank 0
only, it raises on every rank, naming this function.
"""
from __future__ import annotations

from typing import Any

import torch

from hvdsketch.torch.optimizer import Distributed


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, model: Any = None) -> None:
    """Broadcast the optimizer's state from ``root_rank`` (of the optimizer's process set), as Horovod's function
    does, and, for hvdsketch's optimizer, give every rank its own entry of the checkpoint the root loaded (none
    loaded: each rank keeps its own). Collective; ``model`` as in Horovod. Any other optimizer goes to Horovod's."""
    import horovod.torch as hvd

    if not isinstance(optimizer, Distributed):
        hvd.broadcast_optimizer_state(optimizer, root_rank, model)
        return
    with optimizer._torch_state_only():
        hvd.broadcast_optimizer_state(optimizer, root_rank, model)
    optimizer._distribute(root_rank)
