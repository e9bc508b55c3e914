"""hvdsketch for TensorFlow (eager and ``tf.function``) and tf-keras.

One-line change to a Horovod script::

    tape = hvd.DistributedGradientTape(tape, compression=hvdsketch.tensorflow.Compression.sketch(error=0.5))

or hvdsketch's own tape, with Horovod's arguments, which knows variable names, runs multi-round
compressors, error feedback, keeps ``tf.IndexedSlices`` sparse, and reports bytes::

    tape = hvdsketch.tensorflow.DistributedGradientTape(tape, compression="sketch:error=0.5")

and its tf-keras optimizer for ``model.fit``::

    optimizer = hvdsketch.tensorflow.keras.DistributedOptimizer(optimizer, compression="powersgd:rank=2")

Checkpoints: :func:`TapeState` (the tapes') and the keras optimizer's ``hvdsketch_state`` are
``tf.train.Checkpoint``-trackable; every rank gathers, rank 0 saves one file that resumes every
rank (:mod:`hvdsketch.tensorflow.state`). Horovod elastic: :mod:`hvdsketch.tensorflow.elastic`'s
``TensorFlowKerasState`` / ``KerasState`` in place of Horovod's.

Never import ``horovod.torch`` in the same process.
"""
from hvdsketch.tensorflow import elastic, keras
from hvdsketch.tensorflow.compression import Compression
from hvdsketch.tensorflow.state import ExchangeState, TapeState
from hvdsketch.tensorflow.tape import DistributedGradientTape

__all__ = ["Compression", "DistributedGradientTape", "ExchangeState", "TapeState", "elastic", "keras"]
