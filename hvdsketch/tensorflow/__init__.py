"""hvdsketch for TensorFlow (eager and ``tf.function``) and tf-keras.

One-line change to a Horovod script::

    tape = hvd.DistributedGradientTape(tape, compression=hvdsketch.tensorflow.Compression.sketch(error=0.5))

or hvdsketch's own :func:`DistributedGradientTape`, or :func:`hvdsketch.tensorflow.keras.DistributedOptimizer`
for ``model.fit``: Horovod's arguments, variable names, multi-round compressors, error feedback,
``tf.IndexedSlices`` kept sparse, byte reports. Checkpoints: :func:`TapeState` and the keras optimizer's
``hvdsketch_state`` (:mod:`hvdsketch.tensorflow.state`); Horovod elastic: :mod:`hvdsketch.tensorflow.elastic`.

Never import ``horovod.torch`` in the same process.
"""
from hvdsketch.tensorflow import elastic, keras
from hvdsketch.tensorflow.compression import Compression
from hvdsketch.tensorflow.state import ExchangeState, TapeState
from hvdsketch.tensorflow.tape import DistributedGradientTape

__all__ = ["Compression", "DistributedGradientTape", "ExchangeState", "TapeState", "elastic", "keras"]
