"""``hvdsketch.tensorflow.DistributedGradientTape``: Horovod's tape API with any hvdsketch compressor.

``gradient()`` computes the local gradients, then averages them across ranks
through hvdsketch's exchange (one fused Horovod collective per round and op).
``tf.IndexedSlices`` gradients (embeddings) stay sparse end to end with the
sketch. Works eagerly and inside ``tf.function``; inside a function the hash
seeds are fixed when it is traced (the step is a Python number at trace time).
"""
from __future__ import annotations

import itertools
from typing import Any

import tensorflow as tf

from hvdsketch import spec
from hvdsketch.collectives.horovod import HorovodCommunicator
from hvdsketch.compress import Compressor, RowSparse, TensorContext, create
from hvdsketch.exchange import exchange_all, verify_agreement
from hvdsketch.ops import tensorflow as tf_ops

_steps = itertools.count()


class _DistributedGradientTape(tf.GradientTape):
    def __init__(self, tape: tf.GradientTape, compressor: Compressor, memory: Any,
                 communicator: HorovodCommunicator, persistent: bool = False,
                 watch_accessed_variables: bool = True) -> None:
        super(self.__class__, self).__init__(persistent, watch_accessed_variables)
        self._tape = tape
        self._compressor = compressor
        self._memory = memory
        self._communicator = communicator

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = super(self.__class__, self).gradient(target, sources, output_gradients, **kwargs)
        flat_sources, flat_grads = tf.nest.flatten(sources), tf.nest.flatten(grads)
        names = [getattr(s, "name", f"source.{i}").removesuffix(":0") for i, s in enumerate(flat_sources)]
        shapes = [tuple(int(d) for d in s.shape) for s in flat_sources]
        layout = ";".join(f"{n}:{s}" for n, s in zip(names, shapes))
        verify_agreement(self._communicator, f"{self._compressor}|{self._memory}|{layout}", tf_ops)
        step = next(_steps)
        present = [i for i, g in enumerate(flat_grads) if g is not None]
        jobs = [(self._compressor, _as_hvdsketch(flat_grads[i]),
                 TensorContext(names[i], shapes[i], step, self._communicator.size)) for i in present]
        for i, averaged in zip(present, exchange_all(jobs, self._communicator, self._memory)):
            flat_grads[i] = _as_tf(averaged)
        return tf.nest.pack_sequence_as(grads, flat_grads)


def _as_hvdsketch(grad: Any) -> Any:
    if isinstance(grad, tf.IndexedSlices):
        shape = tuple(int(d) for d in tf.get_static_value(grad.dense_shape))
        return RowSparse(tf.cast(grad.indices, tf.int64), grad.values, shape)
    return grad


def _as_tf(averaged: Any) -> Any:
    if isinstance(averaged, RowSparse):
        return tf.IndexedSlices(averaged.values, averaged.indices, tf.constant(averaged.dense_shape, tf.int64))
    return averaged


def DistributedGradientTape(gradtape: tf.GradientTape, compression: "str | Compressor | None" = None,
                            memory: Any = None) -> tf.GradientTape:
    """Wrap ``gradtape`` so that ``gradient()`` returns gradients averaged across Horovod ranks.

    Args:
        gradtape: the ``tf.GradientTape`` that recorded the loss.
        compression: a flag such as ``"sketch:error=0.5"`` or a compressor; falls back to
            ``HVDSKETCH_COMPRESSION``, then ``"none"``.
        memory: a residual memory (error feedback) or ``None``.
    """
    import horovod.tensorflow as hvd

    compressor = create(compression if isinstance(compression, Compressor) else spec.resolve(compression))
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,), dict(_DistributedGradientTape.__dict__))
    return cls(gradtape._tape, compressor, memory, HorovodCommunicator(hvd),
               gradtape._persistent, gradtape._watch_accessed_variables)
