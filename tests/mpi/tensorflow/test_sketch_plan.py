"""A traced sketch whose plan a dense gradient overflows is never silent (TensorFlow, inside tf.function).

A traced graph keeps the plan of its tracing, so ``density=0.05`` on a dense layer has the same large
error at every step; the reduced bitmap shows the overflow alike on every rank, and a conditional op in
the graph warns once, naming the tensor, the expected error and what to give instead. Through Horovod's
own tape with the drop-in sketch and through hvdsketch's tape.
"""
import numpy as np
import pytest
import tensorflow as tf

from hvdsketch.tensorflow import Compression, DistributedGradientTape
from tests.plan_cases import assert_names_the_error_measured, hvdsketch_warnings

TAPES = {
    "horovod tape, drop-in": lambda hvd, tape: hvd.DistributedGradientTape(
        tape, compression=Compression.sketch(error=0.5, density=0.05, seed=31)),
    "hvdsketch tape": lambda hvd, tape: DistributedGradientTape(tape, compression="sketch:error=0.5,density=0.05,seed=32"),
}
NAMES = {"horovod tape, drop-in": {(64, 48): "shape(64, 48)#0", (48, 40): "shape(48, 40)#0"},
         "hvdsketch tape": {(64, 48): "dense/kernel", (48, 40): "dense_1/kernel"}}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", list(TAPES))
def test_a_traced_plan_overflowed_by_dense_gradients_warns_once(hvd, path):
    tf.keras.backend.clear_session()  # layer names dense, dense_1 as in NAMES
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(48, activation="tanh"),
                                 tf.keras.layers.Dense(40)])

    @tf.function
    def errors(x):
        with tf.GradientTape(persistent=True) as tape:
            loss = tf.reduce_mean(tf.square(model(x)))
        local = tape.gradient(loss, model.trainable_variables)
        averaged = TAPES[path](hvd, tape).gradient(loss, model.trainable_variables)
        return [tf.norm(a - t) / tf.norm(t) for a, t in
                ((tf.convert_to_tensor(a), hvd.allreduce(g, name=f"plan.truth.{i}"))
                 for i, (a, g) in enumerate(zip(averaged, local))) if len(a.shape) == 2]

    rng = np.random.default_rng(hvd.rank())
    seen = []
    for _ in range(3):
        with hvdsketch_warnings() as messages:
            measured = errors(rng.normal(size=(16, 64)).astype("float32"))
        seen.append((messages, {tuple(v.shape): float(e) for v, e in zip(model.trainable_variables[::2], measured)}))
    (first, first_errors), later = seen[0], seen[1:]
    for advice in assert_names_the_error_measured(first, first_errors, NAMES[path]).values():
        assert advice.startswith("inside tf.function the plan stays the one traced") and "density" in advice
    for messages, step_errors in later:
        assert not messages  # once
        assert all(e > 1.0 for e in step_errors.values())  # the traced plan stays: so did the warning's reason
