"""The balanced exact method over Horovod's TensorFlow collectives (its alltoall with splits): the
dense average in every support scenario (tests/exact_cases.py), and through DistributedGradientTape
as Horovod's own tape averages, eagerly and inside tf.function (where it runs in Python ops)."""
import numpy as np
import pytest
import tensorflow as tf

from hvdsketch.collectives.horovod import HorovodCommunicator
from hvdsketch.tensorflow import DistributedGradientTape
from tests import exact_cases as cases


@pytest.mark.parametrize("flag", cases.FLAGS)
@pytest.mark.parametrize("scenario", cases.SCENARIOS)
def test_equals_the_dense_average(hvd, scenario, flag):
    cases.check(flag, scenario, hvd.size(), hvd.rank(), HorovodCommunicator(hvd), tf.convert_to_tensor)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_tape_averages_sparse_gradients_as_horovods_tape(hvd, graph):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((5,), dtype="int64"), tf.keras.layers.Embedding(2000, 4),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)])
    x = tf.constant(np.random.default_rng(100 + hvd.rank()).integers(0, 2000 if hvd.rank() else 30, size=(8, 5)))

    def grads(make_tape):
        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x) ** 2)
            return make_tape(tape).gradient(loss, model.trainable_variables)
        return [tf.convert_to_tensor(g).numpy() for g in (tf.function(step) if graph else step)(x)]

    theirs = grads(lambda t: hvd.DistributedGradientTape(t))
    ours = grads(lambda t: DistributedGradientTape(t, compression="balanced"))
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
