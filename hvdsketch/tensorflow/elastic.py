"""Horovod elastic with hvdsketch in TensorFlow: Horovod's state objects, with hvdsketch's state in them.

Use them where Horovod's are used, with ``hvd.elastic.run`` as it is::

    state = hvdsketch.tensorflow.elastic.TensorFlowKerasState(model, optimizer, batch=0)
    # model.fit: hvdsketch.tensorflow.elastic.KerasState(model, batch=0, epoch=0)

(A failed collective of hvdsketch raises Horovod's ``HorovodInternalError``, whose text names
``HorovodAllreduce``: Horovod 0.28.1's TensorFlow ``hvd.elastic.run`` recovers only from an
``UnknownError`` whose text does, as an error inside ``tf.function`` reaches it, and returns from
``train`` as if it had finished for any other, a grouped collective's included;
:mod:`hvdsketch.collectives.horovod`.)

Besides the model's and optimizer's variables (Horovod's), they keep hvdsketch's
per-rank state of the exchanges in use (a tf-keras ``DistributedOptimizer``'s own,
and every ``DistributedGradientTape``'s):

- ``save`` (each commit): a host copy of this rank's state alone, without communication;
- ``restore`` (after a worker failed): that copy back, the broken-off step forgotten;
- ``sync`` (the start, and every reset): Horovod broadcasts the variables from rank 0;
  each exchange then agrees anew with the ranks of the new world at its next step
  (:func:`hvdsketch.exchange.checkpoint.join`; a new worker's tape, made at its first
  step, joins there too): where the world changed (another number of ranks, or ranks at
  different steps: a worker was added) every rank drops its residuals and compressors'
  per-tensor state alike and keeps the step and policy decisions of the lowest rank that
  has state, and rank 0 warns (:class:`~hvdsketch.exchange.checkpoint.StateReset`).

Under Horovod elastic every exchange runs eagerly at every step, inside ``tf.function``
in Python ops (:meth:`~hvdsketch.tensorflow.gradients.GradientExchange.keeps_python_state`):
a traced exchange would keep the world size it was traced in.
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
    """``horovod.tensorflow.keras.elastic.KerasState`` with hvdsketch's per-rank state (see the module
    docstring): as Horovod's, the state above with tf-keras's backend (importing Horovod's would load
    ``horovod.tensorflow.keras`` and its plotting dependencies with the plugin)."""

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        super().__init__(model, optimizer=optimizer, backend=tf.keras.backend, **kwargs)
