"""``hvdsketch.tensorflow.DistributedGradientTape``: Horovod's tape API with any hvdsketch compressor.

``gradient()`` computes the local gradients, then averages them across ranks
through hvdsketch's exchange (one fused Horovod collective per round and op).
``tf.IndexedSlices`` gradients (embeddings) stay sparse end to end with the
sketch. Works eagerly and inside ``tf.function``; inside a function the hash
seeds are fixed when it is traced (the step is a Python number at trace time).

Per-tensor policies (:mod:`hvdsketch.policy`) work in both modes. Eagerly,
``auto`` warms up and decides at the first calls, like the PyTorch optimizer.
Inside ``tf.function`` every decision is fixed when the function is traced: a
policy that has not decided yet decides then, from eager stand-ins of the
traced gradients (random values; a dense gradient counts as dense, an
``IndexedSlices`` one as its static number of looked-up rows, an upper bound),
with its probe and measurements run eagerly; a policy that decided in earlier
eager steps keeps its decision. A flag string names one policy per process,
since the tape is made anew every step.
"""
from __future__ import annotations

from typing import Any, Mapping

import tensorflow as tf

from hvdsketch import policy as _policy
from hvdsketch import spec
from hvdsketch.collectives.horovod import HorovodCommunicator
from hvdsketch.compress import Compressor, RowSparse, TensorContext
from hvdsketch.compress.support import values_of
from hvdsketch.exchange import Exchanger
from hvdsketch.ops import tensorflow as tf_ops
from hvdsketch.policy import Policy

_exchangers: dict[str, Exchanger] = {}  # flag and memory -> the exchanger shared by the tapes made each step


class _DistributedGradientTape(tf.GradientTape):
    def __init__(self, tape: tf.GradientTape, exchanger: Exchanger, persistent: bool = False,
                 watch_accessed_variables: bool = True) -> None:
        super(self.__class__, self).__init__(persistent, watch_accessed_variables)
        self._tape = tape
        self._exchanger = exchanger

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = super(self.__class__, self).gradient(target, sources, output_gradients, **kwargs)
        flat_sources, flat_grads = tf.nest.flatten(sources), tf.nest.flatten(grads)
        names = [getattr(s, "name", f"source.{i}").removesuffix(":0") for i, s in enumerate(flat_sources)]
        shapes = [tuple(int(d) for d in s.shape) for s in flat_sources]
        exchanger = self._exchanger
        if not exchanger.verified:
            with tf.init_scope():
                exchanger.verify(list(zip(names, shapes)), tf_ops)
        present = [i for i, g in enumerate(flat_grads) if g is not None]
        inputs = {names[i]: _as_hvdsketch(flat_grads[i]) for i in present}
        policy = exchanger.policy
        if policy.pending and inputs and tf_ops.is_symbolic(values_of(next(iter(inputs.values())))):
            with tf.init_scope():  # a graph keeps its compressors: decide now, on eager stand-ins
                contexts = [TensorContext(names[i], shapes[i], exchanger.step, exchanger.communicator.size,
                                          exchanger.communicator.rank) for i in present]
                policy.end_step([(_stand_in(g, ctx.shape), ctx) for g, ctx in zip(inputs.values(), contexts)],
                                exchanger.communicator, traced=True)
        averaged = exchanger.exchange(inputs)
        for i in present:
            flat_grads[i] = _as_tf(averaged[names[i]])
        return tf.nest.pack_sequence_as(grads, flat_grads)


def _as_hvdsketch(grad: Any) -> Any:
    if isinstance(grad, tf.IndexedSlices):
        shape = tuple(int(d) for d in tf.get_static_value(grad.dense_shape))
        return RowSparse(tf.cast(grad.indices, tf.int64), grad.values, shape)
    return grad


def _stand_in(grad: Any, shape: tuple[int, ...]) -> Any:
    """An eager tensor like the traced gradient ``grad``: random normal values of its dtype; for a
    row-sparse one, distinct rows as many as its static count of looked-up rows (all if unknown)."""
    if isinstance(grad, RowSparse):
        dtype = grad.values.dtype
        looked_up = grad.values.shape[0] if grad.values.shape.rank else None
        rows = min(shape[0], looked_up or shape[0])
        indices = tf.range(rows, dtype=tf.int64) * (shape[0] // max(rows, 1))
        return RowSparse(indices, tf.random.normal((rows, *shape[1:]), dtype=dtype), shape)
    if not grad.dtype.is_floating:
        return tf.zeros(shape, grad.dtype)
    return tf.random.normal(shape, dtype=grad.dtype)


def _as_tf(averaged: Any) -> Any:
    if isinstance(averaged, RowSparse):
        return tf.IndexedSlices(averaged.values, averaged.indices, tf.constant(averaged.dense_shape, tf.int64))
    return averaged


def DistributedGradientTape(gradtape: tf.GradientTape,
                            compression: "str | Compressor | Policy | Mapping | list | None" = None,
                            memory: Any = None) -> tf.GradientTape:
    """Wrap ``gradtape`` so that ``gradient()`` returns gradients averaged across Horovod ranks.

    Args:
        gradtape: the ``tf.GradientTape`` that recorded the loss.
        compression: a flag such as ``"sketch:error=0.5"`` or ``"auto"``, per-tensor rules, a
            compressor or a :class:`hvdsketch.policy.Policy`; falls back to ``HVDSKETCH_COMPRESSION``,
            then ``"none"``.
        memory: error feedback: a ``--memory`` flag (``"fp32"``) or a :class:`hvdsketch.memory.Memory`;
            ``None`` for none (eagerly only: its state lives in Python).
    """
    import horovod.tensorflow as hvd

    from hvdsketch.memory import create as create_memory

    def make() -> Exchanger:
        return Exchanger(_policy.create(compression), HorovodCommunicator(hvd),
                         None if memory is None else create_memory(memory))

    if compression is None or isinstance(compression, str):
        key = f"{spec.resolve(compression)}|{memory}"
        if key not in _exchangers:
            _exchangers[key] = make()
        exchanger = _exchangers[key]
    else:
        exchanger = make()
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,), dict(_DistributedGradientTape.__dict__))
    return cls(gradtape._tape, exchanger, gradtape._persistent, gradtape._watch_accessed_variables)
