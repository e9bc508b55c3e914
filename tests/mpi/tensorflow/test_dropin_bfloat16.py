"""bfloat16 variables through Horovod's own tape with hvdsketch's drop-in compressions: Horovod reduces
no bfloat16, so the compression carries the gradient as float32 and gives back bfloat16 averages,
eagerly (Horovod's tape traces its allreduce in a function of its own) and inside tf.function."""
import numpy as np
import pytest
import tensorflow as tf

from hvdsketch.tensorflow import Compression


@pytest.mark.timeout(120)
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("flag", ["none", "fp16", "sketch:density=0.05,rows=3", "randomk:ratio=1"])
def test_bfloat16_dense_gradients_come_back_bfloat16_averages(hvd, flag, graph):
    var = tf.Variable(tf.zeros((256, 8), tf.bfloat16))
    rows = np.zeros((256, 8), np.float32)
    rows[[3, 100]] = np.arange(16).reshape(2, 8) % 7  # two rows: within the sketch's plan, recovered exactly
    target = tf.constant(rows * (hvd.rank() + 1), tf.bfloat16)
    compression = Compression.from_spec(flag)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(var * target)
        return hvd.DistributedGradientTape(tape, compression=compression).gradient(loss, [var])[0]

    got = (tf.function(step) if graph else step)()
    assert got.dtype == tf.bfloat16
    expected = rows * np.mean(np.arange(1, hvd.size() + 1))
    np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), expected, rtol=1e-2, atol=1e-6)
