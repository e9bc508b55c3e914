"""Horovod elastic with hvdsketch's optimizer: ``hvd.elastic.run`` and ``hvd.elastic.TorchState`` as they are.

``TorchState``'s default optimizer handler would gather every rank's state at each commit (collective, and a
new worker calls it alone) and sync with Horovod's ``broadcast_optimizer_state``, which cannot carry per-rank
state. So hvdsketch's optimizers get their own handler, ahead of ``torch.optim.Optimizer``'s:

- ``save`` (each commit): a host copy of this rank's state alone, without communication;
- ``restore`` (after a failure): that copy back, the broken-off step forgotten;
- ``sync`` (after a reset): the wrapped optimizer's state broadcast from rank 0, then the ranks agree on
  hvdsketch's (:func:`hvdsketch.exchange.checkpoint.join`): where the world changed, every rank drops its
  residuals and compressors' state and keeps the step and policy decisions of the lowest rank with state,
  and rank 0 warns (:class:`~hvdsketch.exchange.checkpoint.StateReset`).
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
