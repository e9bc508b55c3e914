"""hvdsketch for TensorFlow (eager and ``tf.function``) and tf-keras.

One-line change to a Horovod script::

    tape = hvd.DistributedGradientTape(tape, compression=hvdsketch.tensorflow.Compression.sketch(error=0.5))

or hvdsketch's own tape, with Horovod's arguments, which knows variable names, runs multi-round
compressors, error feedback, keeps ``tf.IndexedSlices`` sparse, and reports bytes::

    tape = hvdsketch.tensorflow.DistributedGradientTape(tape, compression="sketch:error=0.5")

and its tf-keras optimizer for ``model.fit``::

    optimizer = hvdsketch.tensorflow.keras.DistributedOptimizer(optimizer, compression="powersgd:rank=2")

Never import ``horovod.torch`` in the same process.
"""
from hvdsketch.tensorflow import keras
from hvdsketch.tensorflow.compression import Compression
from hvdsketch.tensorflow.tape import DistributedGradientTape

__all__ = ["Compression", "DistributedGradientTape", "keras"]
