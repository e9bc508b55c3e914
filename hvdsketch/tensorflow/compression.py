"""``hvdsketch.tensorflow.Compression``: drop-in values for Horovod's ``compression=``."""
from __future__ import annotations

import dataclasses
import re
from concurrent.futures import ThreadPoolExecutor

import tensorflow as tf

import hvdsketch.ops.tensorflow  # noqa: F401  (loaded before tracing, so autograph never sees an import)
from hvdsketch.compress import Compressor
from hvdsketch.compress.sketch import SparseSketch
from hvdsketch.dropin import CompressionNamespace, PresetCompression


#: A traced sketch's bound, as a fraction of rows, for a gradient made dense from ``tf.IndexedSlices``
#: where neither ``density`` nor ``ratio`` is given (see :meth:`TFDropInCompression.compressor_for`).
SLICES_DENSITY = 0.05


class TFDropInCompression(PresetCompression):
    """Counts its bytes in Python when eager and in two int64 variables inside ``tf.function``.

    Horovod's tape traces its allreduce even when eager, and a traced sketch keeps its tracing's plan: where
    neither ``density`` nor ``ratio`` is given, a traced gradient densified from ``tf.IndexedSlices`` is sized
    for :data:`SLICES_DENSITY` of its rows, any other for all of them. The variables are made in a thread of
    their own, outside every ``tf.function``'s variable scope, so a compression may be first used in any trace.
    """

    def __init__(self, compressor) -> None:
        self._counters: tuple[tf.Variable, tf.Variable] | None = None
        super().__init__(compressor)

    # plain Python over ops: autograph, which converts Horovod's allreduce that calls these, need not convert them
    @tf.autograph.experimental.do_not_convert
    def compress(self, tensor):
        if tensor.shape.is_fully_defined():
            payload, state = super().compress(tensor)
            if state is not None and not tf.executing_eagerly():
                # Horovod names a traced allreduce after its input: named after the gradient, ranks whose
                # compressors disagree get Horovod's mismatch error instead of a hang
                payload = tf.identity(payload, name="hvdsketch_" + re.sub(r"[^A-Za-z0-9_]", "_", tensor.name))
            return payload, state
        if self.compressor.name == "none":  # nothing to compress: as Horovod's own
            return tensor, None
        raise ValueError(
            f"hvdsketch: Horovod passed {self.compressor} a gradient of partly unknown static shape {tensor.shape}; "
            f"Horovod's eager DistributedGradientTape traces its allreduce in a function that loses the static shape "
            f"of a tf.IndexedSlices gradient it densifies (sparse_as_dense=True), and compression needs static "
            f"shapes: run the training step inside tf.function, leave sparse_as_dense off when eager, or use "
            f"hvdsketch.tensorflow.DistributedGradientTape, which keeps the shapes")

    def compressor_for(self, tensor):
        compressor = self.compressor
        if not isinstance(compressor, SparseSketch) or compressor.sized_in_advance or tf.executing_eagerly():
            return compressor
        return dataclasses.replace(compressor, density=SLICES_DENSITY if _densified_slices(tensor) else 1.0)

    @tf.autograph.experimental.do_not_convert
    def decompress(self, tensor, ctx):
        return super().decompress(tensor, ctx)

    def _count(self, sent: int, dense: int) -> None:
        if tf.executing_eagerly():
            self._sent += sent
            self._dense += dense
            return
        if self._counters is None:
            with ThreadPoolExecutor(1) as thread:
                self._counters = thread.submit(_counters).result()
        self._counters[0].assign_add(sent)
        self._counters[1].assign_add(dense)

    def counts(self) -> tuple[int, int]:
        if self._counters is None:
            return super().counts()
        traced = (int(counter.numpy()) for counter in self._counters)
        return tuple(a + b for a, b in zip(super().counts(), traced))  # type: ignore[return-value]


def _densified_slices(tensor: tf.Tensor) -> bool:
    """Whether a traced gradient is a ``tf.IndexedSlices`` made dense: TensorFlow sums its rows into
    place with ``UnsortedSegmentSum`` (looked for through identities and casts)."""
    op = tensor.op
    while op.type in ("Identity", "Cast") and op.inputs:
        op = op.inputs[0].op
    return op.type == "UnsortedSegmentSum"


def _counters() -> tuple[tf.Variable, tf.Variable]:
    with tf.device("CPU:0"):
        return tuple(tf.Variable(0, dtype=tf.int64, trainable=False, name=f"hvdsketch_bytes_{kind}")
                     for kind in ("sent", "dense"))


class Compression(CompressionNamespace):
    """Like ``horovod.tensorflow.Compression``: ``Compression.none``, ``.fp16``, ``.sketch`` or ``.sketch(**options)``,
    every other drop-in compressor by its name, ``Compression.from_spec("sketch:error=0.5,density=0.05")``, made
    anywhere, inside ``tf.function`` too.

    One object per flag (``Compression.fp16 is Compression.fp16``), as Horovod's, which caches its traced
    allreduce by the compression object. Tapes given one object (a GAN's) train as each would alone; its
    :meth:`~hvdsketch.dropin.DropInCompression.report` adds up every use.

    Example::

        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=hvdsketch.tensorflow.Compression.sketch)
        grads = tape.gradient(loss, model.trainable_variables)
    """

    drop_in = TFDropInCompression
    one_per_flag = True
    own = ("hvdsketch.tensorflow.DistributedGradientTape(tape, compression=...) or "
           "hvdsketch.tensorflow.keras.DistributedOptimizer(optimizer, compression=...)")
