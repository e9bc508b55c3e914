"""Horovod's own tape with hvdsketch's drop-in compressions inside ``tf.function`` when one rank alone
traces again (a smaller last batch on that rank): every rank's step still averages the same thing, so
the replicas stay identical.

A traced graph keeps what the compression computed in Python at its tracing; a rank that traces again
must build the graph the other ranks built once (for the sketch: the hashes of the same step).
"""
import numpy as np
import pytest
import tensorflow as tf

from hvdsketch.tensorflow import Compression

FLAGS = ["sketch:density=0.05", "sketch:error=0.5,density=0.2,rows=3", "randomk:ratio=0.2", "fp16", "none"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("flag", FLAGS)
def test_a_rank_that_retraces_alone_averages_what_the_others_do(hvd, flag, assert_replicas_identical):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(64), tf.keras.layers.Dense(4)])
    optimizer = tf.keras.optimizers.SGD(0.1)
    compression = Compression.from_spec(flag)
    traces = []

    @tf.function
    def step(x, y):
        traces.append(x.shape[0])
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        grads = hvd.DistributedGradientTape(tape, compression=compression).gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.concat([tf.reshape(g, [-1]) for g in grads], 0)

    hvd.broadcast_variables(model.variables, root_rank=0)
    rng = np.random.default_rng(hvd.rank())
    for i in range(4):
        rows = 5 if i == 2 and hvd.rank() == 1 else 8  # rank 1's short batch: it alone traces again
        averaged = step(rng.normal(size=(rows, 16)).astype("float32"), rng.normal(size=(rows, 4)).astype("float32"))
        gathered = hvd.allgather(averaged[None], name=f"retrace.{flag}.{i}").numpy()
        assert all(np.array_equal(gathered[0], row) for row in gathered), f"step {i}: the ranks' averages differ"
    assert (5 in traces) == (hvd.rank() == 1)  # the retrace happened, on rank 1 alone
    assert_replicas_identical(model, f"retrace.{flag}")
