"""A plain Horovod TensorFlow 2 training script; hvdsketch changes one line: ``compression=``.

    horovodrun -np 2 -H localhost:2 python examples/tensorflow_horovod.py --compression sketch

Trains a tf-keras bag-of-words classifier on synthetic documents (``examples/synthetic.py``) with
a custom loop and Horovod's habits: ``hvd.init()``, the learning rate scaled by the number of ranks,
each rank its own shard of the data, ``hvd.DistributedGradientTape`` made in the step (with the
compression named there too, inside ``tf.function``), the variables broadcast from rank 0 after
the first step (so the optimizer's are made), a checkpoint written by rank 0 only. The step runs
eagerly or inside ``tf.function`` (``--mode``). Inside a function Horovod's ``sparse_as_dense=True``
densifies the embedding's ``tf.IndexedSlices`` gradient, so that it reaches the compression;
eagerly Horovod densifies it inside a function of its own that loses its static shape, which
compression needs, so there it stays sparse and travels by Horovod's allgather, uncompressed, and
the drop-in sketch sends the dense layers dense (their rows all carry values).
``--compression`` and ``--mode`` take several values to train once with each in one launch.
"""
import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402
from synthetic import VOCAB, documents  # noqa: E402

import hvdsketch.tensorflow  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--compression", nargs="+", default=["sketch"], help="hvdsketch drop-in flags")
parser.add_argument("--mode", nargs="+", choices=["eager", "function"], default=["function"])
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--lr", type=float, default=0.005)
parser.add_argument("--checkpoint-dir", default="./checkpoints")
args = parser.parse_args()


def train(flag: str, mode: str) -> None:
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((6,), dtype="int64"), tf.keras.layers.Embedding(VOCAB, 16),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(4)])
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = tf.keras.optimizers.Adam(args.lr * hvd.size())
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)

    def training_step(words, labels, first_batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(words, training=True))
        compression = hvdsketch.tensorflow.Compression.from_spec(flag)  # was: hvd.Compression.none
        # eagerly, Horovod densifies in a function that loses the embedding gradient's shape: left sparse there
        tape = hvd.DistributedGradientTape(tape, compression=compression, sparse_as_dense=mode == "function")
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:  # after the first step, so that the optimizer's variables exist
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
        return hvd.allreduce(loss, name="loss")  # the average over ranks

    step = tf.function(training_step) if mode == "function" else training_step
    dataset = tf.data.Dataset.from_tensor_slices(documents(hvd.rank())).repeat().batch(args.batch_size)
    losses = [float(step(words, labels, tf.constant(i == 0)))  # a tensor: one trace for every step
              for i, (words, labels) in enumerate(dataset.take(args.steps))]

    if hvd.rank() == 0:
        checkpoint.save(os.path.join(args.checkpoint_dir, f"tensorflow-{mode}-{flag.replace(':', '_')}"))
        report = hvdsketch.tensorflow.Compression.from_spec(flag).report()  # counted since its first use
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        print(f"{flag} ({mode}): loss {first:.3f} -> {last:.3f}; sent {report['bytes_sent'] / 1e6:.3f} MB for "
              f"{report['bytes_dense'] / 1e6:.3f} MB of gradients ({report['ratio']:.1f}x less)", flush=True)


hvd.init()
for mode in args.mode:
    for flag in args.compression:
        train(flag, mode)
