"""A plain Horovod tf-keras ``model.fit`` script; hvdsketch changes one line: ``compression=``.

    horovodrun -np 2 -H localhost:2 python examples/keras_horovod.py --compression sketch

Trains a bag-of-words classifier on synthetic documents (``examples/synthetic.py``) with
Horovod's keras habits: ``hvd.init()``, the learning rate scaled by the number of ranks, Horovod's
``DistributedOptimizer`` around the keras optimizer, the variables broadcast from rank 0 by Horovod's
callback, checkpoints written by rank 0 only. (Horovod 0.28.1's ``MetricAverageCallback`` reaches
for Keras 3's backend, which lacks what it needs, where tf-keras is in use; the losses printed are
averaged over the ranks with ``hvd.allreduce`` instead.)
``model.fit`` runs its steps inside ``tf.function``. The embedding's ``tf.IndexedSlices`` gradient
travels by Horovod's allgather, uncompressed: Horovod's tf-keras optimizer densifies it
(``sparse_as_dense=True``) inside a function of its own that loses its static shape, which
compression needs. So the compression meets the dense layers only: ``fp16`` halves them, and the
drop-in sketch sends them dense (their rows all carry values; a sketch would be no smaller).
``--compression`` takes several flags to train once with each in one launch.

Compressors that Horovod's ``compression=`` cannot carry (PowerSGD, top-k, the union sketch) run
in ``model.fit`` through ``hvdsketch.tensorflow.keras.DistributedOptimizer(optimizer,
compression="powersgd:rank=2")`` instead of Horovod's optimizer (those that keep state between steps,
with ``model.compile(..., run_eagerly=True)``).
"""
import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import horovod.tensorflow.keras as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402
from synthetic import VOCAB, documents  # noqa: E402

import hvdsketch.tensorflow  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--compression", nargs="+", default=["sketch"], help="hvdsketch drop-in flags")
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--lr", type=float, default=0.005)
parser.add_argument("--checkpoint-dir", default="./checkpoints")
args = parser.parse_args()


class LossHistory(tf.keras.callbacks.Callback):
    """Each step's loss on this rank."""

    def on_train_begin(self, logs=None):
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(logs["loss"])


def train(flag: str) -> None:
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((6,), dtype="int64"), tf.keras.layers.Embedding(VOCAB, 16),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(4)])
    compression = hvdsketch.tensorflow.Compression.from_spec(flag)  # was: hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(args.lr * hvd.size()), compression=compression)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    history = LossHistory()
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), history]
    if hvd.rank() == 0:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(
            os.path.join(args.checkpoint_dir, f"keras-{flag.replace(':', '_')}-{{epoch}}.weights.h5"),
            save_weights_only=True))
    dataset = tf.data.Dataset.from_tensor_slices(documents(hvd.rank())).repeat().batch(args.batch_size)
    model.fit(dataset, steps_per_epoch=args.steps // 2, epochs=2, callbacks=callbacks, verbose=0)

    first, last = (float(hvd.allreduce(tf.constant(sum(part) / 5), name=name))  # the averages over ranks
                   for part, name in ((history.losses[:5], "first"), (history.losses[-5:], "last")))
    if hvd.rank() == 0:
        report = compression.report()
        print(f"{flag} (keras): loss {first:.3f} -> {last:.3f}; sent {report['bytes_sent'] / 1e6:.3f} MB for "
              f"{report['bytes_dense'] / 1e6:.3f} MB of gradients ({report['ratio']:.1f}x less)", flush=True)


hvd.init()
for flag in args.compression:
    train(flag)
