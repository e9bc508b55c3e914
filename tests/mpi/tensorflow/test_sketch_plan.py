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


@pytest.mark.timeout(240)
def test_horovod_tape_sizes_a_default_sketch_by_what_each_gradient_is(hvd):
    """``Compression.sketch()``, no density given, traced by Horovod's tape: the embedding's gradient,
    which Horovod made dense from ``tf.IndexedSlices``, is sketched for 5% of its rows; the dense
    layer's, whose rows all carry values, goes dense (Horovod's own average), and nothing warns."""
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,), dtype="int64"), tf.keras.layers.Embedding(2000, 16),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(8)])
    compression = Compression.sketch(seed=33)  # an object of this test's own: its report counts this test

    @tf.function
    def averaged(tokens):
        with tf.GradientTape(persistent=True) as tape:
            loss = tf.reduce_sum(tf.square(model(tokens)))
        local = tape.gradient(loss, model.trainable_variables)
        got = hvd.DistributedGradientTape(tape, compression=compression, sparse_as_dense=True).gradient(
            loss, model.trainable_variables)
        truth = [hvd.allreduce(tf.convert_to_tensor(g), name=f"default.truth.{i}") for i, g in enumerate(local)]
        return got, truth

    tokens = np.random.default_rng(hvd.rank()).integers(0, 2000, size=(8, 4))  # at most 32 rows a rank
    with hvdsketch_warnings() as messages:
        got, truth = averaged(tokens)
    assert not messages
    (embedding, kernel, bias), (embedding_truth, kernel_truth, bias_truth) = got, truth
    np.testing.assert_allclose(kernel.numpy(), kernel_truth.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(bias.numpy(), bias_truth.numpy(), rtol=1e-6, atol=1e-7)
    error = float(tf.norm(tf.convert_to_tensor(embedding) - embedding_truth) / tf.norm(embedding_truth))
    assert 0 < error < 1.0  # sketched: not exact, within the plan's reach
    report = compression.report()
    dense_layer = 4 * (64 * 8 + 8)
    assert dense_layer < report["bytes_sent"] < report["bytes_dense"] / 3  # the embedding's 128 KB, sketched
