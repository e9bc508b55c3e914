"""``hvdsketch.tensorflow.Compression``: drop-in values for Horovod's ``compression=``."""
from __future__ import annotations

import tensorflow as tf

import hvdsketch.ops.tensorflow  # noqa: F401  (loaded before tracing, so autograph never sees an import)
from hvdsketch.dropin import CompressionNamespace, DropInCompression


class TFDropInCompression(DropInCompression):
    """Counts bytes in variables, so the count also grows when the exchange runs in a ``tf.function``."""

    def __init__(self, compressor) -> None:
        super().__init__(compressor)
        with tf.init_scope():
            self.bytes_sent = tf.Variable(0, dtype=tf.int64, trainable=False, name="hvdsketch_bytes_sent")
            self.bytes_dense = tf.Variable(0, dtype=tf.int64, trainable=False, name="hvdsketch_bytes_dense")

    def _count(self, sent: int, dense: int) -> None:
        self.bytes_sent.assign_add(sent)
        self.bytes_dense.assign_add(dense)


class Compression(CompressionNamespace):
    """Like ``horovod.tensorflow.Compression``: ``Compression.none``, ``Compression.fp16``,
    ``Compression.sketch(**options)``, ``Compression.from_spec("sketch:error=0.5")``."""

    drop_in = TFDropInCompression
