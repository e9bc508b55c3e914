"""A plain Horovod TensorFlow (tf-keras) training script. hvdsketch changes one line: ``compression=``.

    horovodrun -np 2 -H localhost:2 python examples/tensorflow_horovod.py --compression sketch:error=0.5

Trains the tf-keras LSTM language model (King James Bible) for a few steps
inside ``tf.function``, the embedding's gradient densified by Horovod's
``sparse_as_dense=True`` so that it reaches the compression.
"""
import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdsketch.tensorflow  # noqa: E402
from hvdsketch.lab.workloads import get  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--compression", default="sketch:error=0.5")
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--lr", type=float, default=1.0)
args = parser.parse_args()

hvd.init()
workload = get("lstm_tf:vocab_size=5000,hidden=128,embed_dim=128")
model = workload.build_model()
optimizer = tf.keras.optimizers.SGD(args.lr)
compression = hvdsketch.tensorflow.Compression.from_spec(args.compression)  # was: hvd.Compression.none


@tf.function
def train_step(inputs, targets):
    with tf.GradientTape() as tape:
        loss = workload.loss(model, (inputs, targets))
    tape = hvd.DistributedGradientTape(tape, compression=compression, sparse_as_dense=True)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


hvd.broadcast_variables(model.variables, root_rank=0)
first = last = None
for step, batch in zip(range(args.steps), workload.train_batches(0, hvd.rank(), hvd.size())):
    last = float(train_step(*batch))
    first = last if first is None else first
    if hvd.rank() == 0 and step % 10 == 0:
        print(f"step {step:4d}  loss {last:.3f}", flush=True)

if hvd.rank() == 0:
    report = compression.report()
    print(f"loss {first:.3f} -> {last:.3f}; {report['compression']}: sent {report['bytes_sent'] / 1e6:.2f} MB "
          f"for {report['bytes_dense'] / 1e6:.2f} MB of gradients ({report['ratio']:.1f}x less)")
