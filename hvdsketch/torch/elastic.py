"""Horovod elastic with hvdsketch's optimizer: ``hvd.elastic.run`` and ``hvd.elastic.TorchState`` as they are.

``TorchState(model=..., optimizer=...)`` keeps a copy of each object's state at
every ``commit()``, restores it after a worker failed, and after every reset
(workers removed or added) syncs the state from rank 0. Its default optimizer
handler would call ``optimizer.state_dict()``, which for hvdsketch's optimizer
gathers every rank's residuals (collective, and costly at every commit; a new
worker calls it alone in ``TorchState``'s constructor, while the others wait to
sync), and sync with Horovod's ``broadcast_optimizer_state``, which cannot carry
hvdsketch's per-rank state. So the optimizer registers, through Horovod's
``set_handler_registry``, a handler of its own for hvdsketch's optimizers
(ahead of ``torch.optim.Optimizer``'s):

- ``save`` (each commit): a host copy of this rank's state alone (the wrapped
  optimizer's and the exchanger's), without communication;
- ``restore`` (after a failure): that copy back, the broken-off step forgotten;
- ``sync`` (after a reset, every rank of the new world): the wrapped
  optimizer's state broadcast from rank 0 (Horovod's function), then the ranks
  agree on hvdsketch's (:func:`hvdsketch.exchange.checkpoint.join`): where the
  world changed (another number of ranks, or ranks at different steps: a worker
  was added), every rank drops its residuals and compressors' per-tensor state
  alike and keeps the step and policy decisions of the lowest rank that has
  state, and rank 0 warns (:class:`~hvdsketch.exchange.checkpoint.StateReset`);
  a world of the same ranks that all restored the same commit keeps its state.
  Where Horovod skips the sync (workers only removed), the first step in the
  smaller world does the same.
"""
from __future__ import annotations

from typing import Any

from horovod.torch.elastic.state import StateHandler, get_handler_registry, set_handler_registry


class OptimizerStateHandler(StateHandler):
    """``TorchState``'s handler of hvdsketch's optimizers (see the module docstring)."""

    def __init__(self, optimizer: Any) -> None:
        super().__init__(optimizer)
        self._saved = optimizer._local_state()

    def save(self) -> None:
        self._saved = self.value._local_state()

    def restore(self) -> None:
        self.value._load_local_state(self._saved)

    def sync(self) -> None:
        import horovod.torch as hvd

        optimizer = self.value
        optimizer._abandon()
        with optimizer._torch_state_only():
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        if optimizer._included:
            optimizer._join(elastic=True)


def register(kind: type) -> None:
    """Put :class:`OptimizerStateHandler` first in Horovod's ``TorchState`` handler registry for the
    optimizers of ``kind`` (:class:`hvdsketch.torch.optimizer.Distributed`), once."""
    registry = get_handler_registry()
    if not any(handler is OptimizerStateHandler for _, handler in registry):
        set_handler_registry([(kind, OptimizerStateHandler), *registry])
