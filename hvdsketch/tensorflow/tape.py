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

import itertools
from typing import Any, Mapping

import tensorflow as tf

from hvdsketch import policy as _policy
from hvdsketch import spec
from hvdsketch.collectives.horovod import HorovodCommunicator
from hvdsketch.compress import Compressor, RowSparse, TensorContext
from hvdsketch.exchange import exchange_all, verify_agreement
from hvdsketch.ops import tensorflow as tf_ops
from hvdsketch.policy import Policy
from hvdsketch.policy.cost import values_of

_steps = itertools.count()
_policies: dict[str, Policy] = {}  # flag -> its policy, shared by the tapes made each step


class _DistributedGradientTape(tf.GradientTape):
    def __init__(self, tape: tf.GradientTape, policy: Policy, memory: Any,
                 communicator: HorovodCommunicator, persistent: bool = False,
                 watch_accessed_variables: bool = True) -> None:
        super(self.__class__, self).__init__(persistent, watch_accessed_variables)
        self._tape = tape
        self._policy = policy
        self._memory = memory
        self._communicator = communicator

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        if self._memory is not None and not tf.executing_eagerly():
            raise ValueError("hvdsketch: residual memory keeps its state in Python, which tf.function would "
                             "freeze at tracing; run the training step eagerly, or without memory=")
        grads = super(self.__class__, self).gradient(target, sources, output_gradients, **kwargs)
        flat_sources, flat_grads = tf.nest.flatten(sources), tf.nest.flatten(grads)
        names = [getattr(s, "name", f"source.{i}").removesuffix(":0") for i, s in enumerate(flat_sources)]
        shapes = [tuple(int(d) for d in s.shape) for s in flat_sources]
        layout = ";".join(f"{n}:{s}" for n, s in zip(names, shapes))
        verify_agreement(self._communicator, f"{self._policy}|{self._memory}|{layout}", tf_ops)
        step = next(_steps)
        present = [i for i, g in enumerate(flat_grads) if g is not None]
        inputs = [_as_hvdsketch(flat_grads[i]) for i in present]
        contexts = [TensorContext(names[i], shapes[i], step, self._communicator.size, self._communicator.rank)
                    for i in present]
        jobs = list(zip(self._select(inputs, contexts), inputs, contexts))
        for i, averaged in zip(present, exchange_all(jobs, self._communicator, self._memory)):
            flat_grads[i] = _as_tf(averaged)
        return tf.nest.pack_sequence_as(grads, flat_grads)

    def _select(self, grads: list[Any], contexts: list[TensorContext]) -> list[Compressor]:
        """The policy's compressors; while tracing, a policy still deciding decides on eager stand-ins."""
        if not (self._policy.pending and grads and tf_ops.is_symbolic(values_of(grads[0]))):
            return self._policy.select(grads, contexts, self._communicator)
        with tf.init_scope():
            stand_ins = [_stand_in(g, ctx.shape) for g, ctx in zip(grads, contexts)]
            return self._policy.select(stand_ins, contexts, self._communicator, traced=True)


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
        memory: a residual memory (error feedback) or ``None``.
    """
    import horovod.tensorflow as hvd

    if compression is None or isinstance(compression, str):
        flag = str(spec.resolve(compression))
        if flag not in _policies:
            _policies[flag] = _policy.create(flag)
        policy = _policies[flag]
    else:
        policy = _policy.create(compression)
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,), dict(_DistributedGradientTape.__dict__))
    return cls(gradtape._tape, policy, memory, HorovodCommunicator(hvd),
               gradtape._persistent, gradtape._watch_accessed_variables)
