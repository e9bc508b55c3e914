"""Horovod elastic with hvdsketch in TensorFlow: Horovod's state objects, with hvdsketch's state in them.

Use them where Horovod's are used, with ``hvd.elastic.run`` as it is::

    state = hvdsketch.tensorflow.elastic.TensorFlowKerasState(model, optimizer, batch=0)
    # model.fit: hvdsketch.tensorflow.elastic.KerasState(model, batch=0, epoch=0)

Besides Horovod's variables they keep the per-rank state of the exchanges in use (a tf-keras
``DistributedOptimizer``'s and every ``DistributedGradientTape``'s): ``save`` copies this rank's state without
communication, ``restore`` puts it back, and after ``sync`` each exchange agrees anew with the new world at its
next step (:func:`hvdsketch.exchange.checkpoint.join`): where the world changed, every rank drops its residuals
and compressors' state, keeps the step and decisions of the lowest rank with state, and rank 0 warns
(:class:`~hvdsketch.exchange.checkpoint.StateReset`). Under Horovod elastic every exchange runs in Python ops
(:meth:`~hvdsketch.tensorflow.gradients.GradientExchange.keeps_python_state`); a failed collective raises what
Horovod 0.28.1's ``hvd.elastic.run`` recovers from (:mod:`hvdsketch.collectives.horovod`).
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf
from horovod.tensorflow import elastic as _horovod

from hvdsketch.tensorflow import gradients
from hvdsketch.tensorflow.gradients import GradientExchange


class _WithExchanges:
    """What hvdsketch adds to a Horovod state object of a ``model`` and ``optimizer``."""

    optimizer: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._exchange_states: list[tuple[GradientExchange, dict[str, Any]]] = []
        super().__init__(*args, **kwargs)

    def _exchanges(self) -> list[GradientExchange]:
        own = getattr(self.optimizer, "_hvdsketch", None)
        return ([own.exchange] if own is not None else []) + gradients.TAPES()

    def save(self) -> None:
        super().save()
        self._exchange_states = [(exchange, exchange.local_state()) for exchange in self._exchanges()]

    def restore(self) -> None:
        super().restore()
        saved = {id(exchange): state for exchange, state in self._exchange_states}
        for exchange in self._exchanges():
            if id(exchange) in saved:
                exchange.load_local_state(saved[id(exchange)])
            else:  # made after the last commit
                exchange.session.abandon()

    def sync(self) -> None:
        super().sync()
        for exchange in self._exchanges():
            exchange.session.abandon()
            exchange.rejoin = True


class TensorFlowKerasState(_WithExchanges, _horovod.TensorFlowKerasState):
    """``horovod.tensorflow.elastic.TensorFlowKerasState`` with hvdsketch's per-rank state (see the module docstring)."""


class KerasState(TensorFlowKerasState):
    """``horovod.tensorflow.keras.elastic.KerasState`` with hvdsketch's per-rank state: the state above with
    tf-keras's backend, as Horovod's (importing which would load ``horovod.tensorflow.keras``)."""

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        super().__init__(model, optimizer=optimizer, backend=tf.keras.backend, **kwargs)
