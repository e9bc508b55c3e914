import os

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")  # test_tape adds process sets


@pytest.fixture(scope="session")
def hvd():
    """``horovod.tensorflow``, initialised once per rank."""
    import horovod.tensorflow as hvd

    hvd.init()
    return hvd


@pytest.fixture
def assert_replicas_identical(hvd):
    """``check(model, name)``: asserts that the model's trainable variables are bit for bit the same
    on every rank (collective: one allgather named ``name``)."""
    import numpy as np
    import tensorflow as tf

    def check(model, name: str = "replicas") -> None:
        flat = tf.concat([tf.reshape(v, [-1]) for v in model.trainable_variables], 0)
        gathered = hvd.allgather(flat[None, :], name=name).numpy()
        assert all(np.array_equal(gathered[0], row) for row in gathered)

    return check
