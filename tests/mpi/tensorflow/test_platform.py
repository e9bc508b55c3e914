"""Horovod's TensorFlow collectives give exact values, eagerly and inside tf.function."""
import numpy as np
import pytest
import tensorflow as tf


def test_allreduce_sum_and_average_are_exact(hvd):
    n = hvd.size()
    x = tf.range(6, dtype=tf.float32) + hvd.rank()
    expected = np.arange(6, dtype=np.float32) * n + sum(range(n))
    np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum, name="platform.sum").numpy(), expected)
    np.testing.assert_array_equal(hvd.allreduce(x * n, op=hvd.Average, name="platform.avg").numpy(), expected)


def test_allreduce_inside_tf_function(hvd):
    @tf.function
    def summed(x):
        return hvd.allreduce(x, op=hvd.Sum, name="platform.graph")

    n = hvd.size()
    out = summed(tf.fill([4], float(hvd.rank() + 1)))
    np.testing.assert_array_equal(out.numpy(), np.full(4, n * (n + 1) / 2, dtype=np.float32))


@pytest.mark.parametrize("dtype", [tf.float32, tf.int64])
def test_allgather_concatenates_varying_sizes(hvd, dtype):
    rank, n = hvd.rank(), hvd.size()
    mine = tf.fill([rank + 1, 2], tf.cast(rank, dtype))
    gathered = hvd.allgather(mine, name=f"platform.gather.{dtype.name}")
    expected = np.concatenate([np.full((r + 1, 2), r) for r in range(n)])
    np.testing.assert_array_equal(gathered.numpy(), expected)
