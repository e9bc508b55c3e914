"""``lstm_tf``: the ``lstm`` language model in tf-keras, on the same data and windows.

Batches are the numpy ``(inputs, targets)`` pairs of
:class:`~hvdsketch.lab.workloads.language.LanguageModelData`. The gradient of
``keras.layers.Embedding`` comes back from ``tf.GradientTape`` as
``tf.IndexedSlices`` (one slice per token of the batch, repeats included):
TensorFlow's sparse gradient, which Horovod otherwise densifies or
allgathers. This is the only workload module that imports TensorFlow; it
uses tf-keras (Keras 2), as Horovod 0.28.1 does with ``TF_USE_LEGACY_KERAS=1``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import tensorflow as tf
import tf_keras as keras

from hvdsketch.lab.workloads.base import Batch
from hvdsketch.lab.workloads.language import LanguageModelData


@dataclass(frozen=True)
class KerasLanguageModel(LanguageModelData):
    name = "lstm_tf"
    framework: ClassVar[str] = "tensorflow"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tied:
            raise ValueError("tied=true is not supported by lstm_tf; use lstm (PyTorch)")

    def to_batch(self, arrays: tuple[np.ndarray, ...]) -> Batch:
        return arrays

    def build_model(self) -> keras.Model:
        """Embedding -> dropout -> (LSTM -> dropout) x layers -> dense decoder, seeded initialisers."""
        init = keras.initializers
        stack: list[keras.layers.Layer] = [
            keras.Input(shape=(None,), dtype="int64"),
            keras.layers.Embedding(self.vocabulary, self.embed_dim,
                                   embeddings_initializer=init.RandomUniform(-0.1, 0.1, seed=self.seed)),
            keras.layers.Dropout(self.dropout),
        ]
        for layer in range(self.layers):
            stack += [keras.layers.LSTM(self.hidden, return_sequences=True,
                                        kernel_initializer=init.GlorotUniform(seed=self.seed + 2 * layer + 1),
                                        recurrent_initializer=init.Orthogonal(seed=self.seed + 2 * layer + 2)),
                      keras.layers.Dropout(self.dropout)]
        stack.append(keras.layers.Dense(self.vocabulary,
                                        kernel_initializer=init.RandomUniform(-0.1, 0.1, seed=self.seed)))
        return keras.Sequential(stack)

    def loss(self, model: keras.Model, batch: Batch) -> tf.Tensor:
        inputs, targets = batch
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
            targets, model(inputs, training=True), from_logits=True))

    def score(self, model: keras.Model, batch: Batch) -> tuple[float, int, int]:
        inputs, targets = batch
        logits = model(inputs, training=False)
        total = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True))
        correct = tf.reduce_sum(tf.cast(tf.argmax(logits, -1) == targets, tf.int64))
        return float(total), int(correct), int(targets.size)
