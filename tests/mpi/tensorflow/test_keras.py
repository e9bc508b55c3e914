"""hvdsketch's tf-keras DistributedOptimizer in model.fit: compressors that need more than one
allreduce train (PowerSGD eagerly, the sketch inside tf.function), replicas stay identical, and
Horovod's arguments mean what they mean in Horovod's own tf-keras optimizer."""
import numpy as np
import pytest
import tensorflow as tf

import hvdsketch.tensorflow.keras as hvdsketch_keras


def data(hvd, n=64):
    """Each rank's own examples of a learnable task: the class of six tokens of the first 200 (of a
    vocabulary of 5000, so the embedding's gradient is row-sparse) is their first's modulo 4."""
    rng = np.random.default_rng(7 + hvd.rank())
    tokens = rng.integers(0, 200, size=(n, 6))
    return tokens, tokens[:, 0] % 4


def model(vocab=5000):
    tf.keras.backend.clear_session()  # the same variable names (they seed PowerSGD's start) in every model
    tf.keras.utils.set_random_seed(0)  # the same start on every rank
    return tf.keras.Sequential([tf.keras.Input((6,), dtype="int64"), tf.keras.layers.Embedding(vocab, 16),
                                tf.keras.layers.Flatten(), tf.keras.layers.Dense(32, activation="relu"),
                                tf.keras.layers.Dense(4)])


def fit(hvd, optimizer, epochs=5, run_eagerly=False):
    net = model()
    net.compile(optimizer=optimizer, run_eagerly=run_eagerly,
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data(hvd)
    history = net.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0)
    return net, history.history["loss"]


@pytest.mark.parametrize("compression, run_eagerly", [
    ("powersgd:rank=2", True),
    ("powersgd:rank=2", False),  # inside tf.function: its state advances in a Python op every step
    ("sketch:density=0.05", False),  # inside tf.function, each gradient's exchange its own ops
    ("sketch", False),  # the union sketch: two rounds, sized every step, in a Python op
    ("efsignsgd", False),
    ("topk:ratio=0.1", False),
])
def test_model_fit_trains_and_keeps_replicas_identical(hvd, compression, run_eagerly, assert_replicas_identical):
    optimizer = hvdsketch_keras.DistributedOptimizer(tf.keras.optimizers.SGD(1.0), compression=compression)
    net, losses = fit(hvd, optimizer, run_eagerly=run_eagerly)
    assert losses[-1] < 0.95 * losses[0]  # it trains
    assert_replicas_identical(net, "keras.replicas")
    assert type(optimizer).__name__ == "SGD" and isinstance(optimizer, tf.keras.optimizers.SGD)
    report = optimizer.report()  # every one of 5 epochs x 8 batches counted, eager or inside tf.function
    assert report["steps"] == 40 and report["ratio"] > 1


def test_stateful_compressor_inside_tf_function_trains_as_eagerly(hvd):
    """PowerSGD inside model.fit's tf.function (its exchange a Python op every step) gives the
    weights the eager run gives: its warm start and residuals advance step by step alike."""
    eager, _ = fit(hvd, hvdsketch_keras.DistributedOptimizer(tf.keras.optimizers.SGD(1.0), compression="powersgd"),
                   epochs=1, run_eagerly=True)
    traced, _ = fit(hvd, hvdsketch_keras.DistributedOptimizer(tf.keras.optimizers.SGD(1.0), compression="powersgd"),
                    epochs=1)
    for a, b in zip(eager.trainable_variables, traced.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def horovod_and_ours(hvd, graph, **kwargs):
    import horovod.tensorflow.keras as hvd_keras

    theirs, _ = fit(hvd, hvd_keras.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(1.0), **kwargs), epochs=1,
                    run_eagerly=not graph)
    ours, _ = fit(hvd, hvdsketch_keras.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(1.0), **kwargs), epochs=1,
                  run_eagerly=not graph)
    return theirs, ours


CASES = {  # the embedding's gradient dense, as Horovod's pre/postscaling and aggregation need it
    "op=Sum": lambda hvd: dict(op=hvd.Sum),
    "gradient_predivide_factor": lambda hvd: dict(gradient_predivide_factor=2.0),
    "backward_passes_per_step=2": lambda hvd: dict(backward_passes_per_step=2),
    "average_aggregated_gradients": lambda hvd: dict(backward_passes_per_step=2, average_aggregated_gradients=True),
    "groups=2": lambda hvd: dict(groups=2),
}


@pytest.mark.parametrize("case, graph", [(case, True) for case in CASES] + [("backward_passes_per_step=2", False)],
                         ids=lambda v: {True: "tf.function", False: "eager"}.get(v, v) if isinstance(v, bool) else v)
def test_argument_matches_horovods_keras_optimizer(hvd, case, graph, assert_replicas_identical):
    theirs, ours = horovod_and_ours(hvd, graph, sparse_as_dense=True, **CASES[case](hvd))
    for a, b in zip(theirs.trainable_variables, ours.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    assert not np.array_equal(ours.trainable_variables[0].numpy(), model().trainable_variables[0].numpy())
    assert_replicas_identical(ours, "keras.replicas")
