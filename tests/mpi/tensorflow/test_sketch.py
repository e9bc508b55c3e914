"""The sparse-sketch through Horovod's TensorFlow collectives: Horovod's own tape with the drop-in
compression, hvdsketch's tape, eagerly and inside tf.function."""
import numpy as np
import pytest
import tensorflow as tf

from hvdsketch.compress import create
from hvdsketch.tensorflow import Compression, DistributedGradientTape
from tests import sketch_cases as cases


def horovod_tape_average(hvd, compression, gradient: np.ndarray, graph: bool) -> np.ndarray:
    """Average ``gradient`` with Horovod's own DistributedGradientTape (a loss whose gradient it is)."""
    var = tf.Variable(tf.zeros(gradient.shape))
    target = tf.constant(gradient)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(var * target)
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        return tape.gradient(loss, [var])[0]

    return (tf.function(step) if graph else step)().numpy()


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_horovod_tape_with_sketch_equals_dense_exactly(hvd, graph):
    g = cases.row_sparse_gradient(hvd.rank(), cases.EXACT_SHAPE, 3, integer=True)
    compression = Compression.from_spec(cases.EXACT_SPEC)
    recovered = horovod_tape_average(hvd, compression, g, graph)
    np.testing.assert_array_equal(recovered, cases.dense_average(hvd.size(), cases.EXACT_SHAPE, 3, True))
    report = compression.report()
    assert 0 < report["bytes_sent"] < report["bytes_dense"] / 2


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_recovery_within_count_sketch_bound(hvd, graph):
    g = cases.row_sparse_gradient(hvd.rank(), cases.LOSSY_SHAPE, 20, integer=False)
    truth = cases.dense_average(hvd.size(), cases.LOSSY_SHAPE, 20, False)
    recovered = horovod_tape_average(hvd, Compression.from_spec(cases.LOSSY_SPEC), g, graph)
    cols = create(cases.LOSSY_SPEC).plan(cases.LOSSY_SHAPE).cols
    assert 0 < cases.relative_error(recovered, truth) < cases.error_bound(cols, truth)


def test_keras_embedding_training_keeps_replicas_bit_identical(hvd, assert_replicas_identical):
    """50 tf.function steps of an embedding model; IndexedSlices gradients stay sparse; ranks agree bit for bit."""
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((8,), dtype="int64"), tf.keras.layers.Embedding(5000, 16),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(5)])
    optimizer = tf.keras.optimizers.SGD(0.1)
    seen_sparse = []

    @tf.function
    def train_step(tokens, labels):
        with tf.GradientTape() as tape:
            logits = model(tokens, training=True)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        tape = DistributedGradientTape(tape, compression="sketch:error=0.5,density=0.05,rows=3")
        grads = tape.gradient(loss, model.trainable_variables)
        seen_sparse.append(isinstance(grads[0], tf.IndexedSlices))
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    rng = np.random.default_rng(hvd.rank())
    for _ in range(50):
        train_step(rng.integers(0, 5000, size=(32, 8)), rng.integers(0, 5, size=32))
    assert seen_sparse and all(seen_sparse)
    assert_replicas_identical(model)


def test_an_inf_on_one_rank_comes_back_on_every_rank_in_graph(hvd):
    """As Horovod's compressions hand it back inside ``tf.function`` (a loss scaler skips the step)."""
    g = cases.row_sparse_gradient(hvd.rank(), cases.LOSSY_SHAPE, 4, integer=False)
    if hvd.rank() == 0:
        g[1, 1] = np.inf
    got = horovod_tape_average(hvd, Compression.sketch(error=0.5, density=0.05), g, graph=True)
    assert not np.isfinite(got).all()


def test_mismatched_specs_fail_on_every_rank(hvd):
    var = tf.Variable(tf.ones(4))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(var * var)
    tape = DistributedGradientTape(tape, compression="none" if hvd.rank() == 0 else "fp16")
    with pytest.raises(RuntimeError, match="different compression setups"):
        tape.gradient(loss, [var])
