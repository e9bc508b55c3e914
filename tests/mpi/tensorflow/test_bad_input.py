"""Bad input, misuse and ranks that disagree, with TensorFlow: a clear error on every rank or the right
result, never a hang. A hang inside a TensorFlow op ignores pytest-timeout's signal, so these tests
time out by thread (the job dies and mpirun ends it); cases that still hang run as child jobs from
tests/unit/test_bad_input.py instead."""
import numpy as np
import pytest
import tensorflow as tf

from hvdsketch.spec import SpecError
from hvdsketch.tensorflow import DistributedGradientTape

timeout = pytest.mark.timeout(60, method="thread")


@pytest.fixture(autouse=True)
def own_exchangers(monkeypatch):
    """The tape keeps one exchanger per setup for the whole process, set up (verified) with the first
    variables it saw; these tests keep theirs apart from the other files' tests."""
    from hvdsketch.tensorflow import gradients

    monkeypatch.setattr(gradients, "TAPES", gradients.TapeExchanges())


def same_on_every_rank(hvd, tensor, name: str) -> bool:
    gathered = hvd.allgather(tf.reshape(tf.cast(tensor, tf.float32), (1, -1)), name=f"bad_input_{name}").numpy()
    return all(np.array_equal(gathered[0], row) for row in gathered)


def gradient(var: tf.Variable, target, compression, graph: bool = False, **options):
    """hvdsketch's tape's average of the gradient ``target`` of ``var``."""
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(var * tf.cast(target, var.dtype))
        return DistributedGradientTape(tape, compression=compression, **options).gradient(loss, [var])[0]

    return (tf.function(step) if graph else step)()


@timeout
@pytest.mark.parametrize("arguments, message", [
    ({"compression": ""}, "compression='' is empty"),
    ({"compression": " "}, "is empty"),
    ({"compression": "fp16:dtype=bfloat16"}, "no bfloat16 allreduce"),
    ({"compression": "none", "memory": ""}, "residual memory flag must be a non-empty string naming one of"),
], ids=lambda a: a if isinstance(a, str) else ",".join(f"{k}={v!r}"[:40] for k, v in a.items()))
def test_bad_arguments_raise_clear_errors_on_every_rank(hvd, arguments, message):
    with pytest.raises(SpecError, match=message):
        gradient(tf.Variable(tf.ones(4)), tf.ones(4), **arguments)


@timeout
def test_residual_memory_works_eagerly(hvd):
    """Top-1 of (4, 5): the 4 held back the first step (fp32 residual) outweighs the 5 the second."""
    var = tf.Variable(tf.zeros(2), name="memory_var")
    target = tf.constant([4.0, 5.0]) * (hvd.rank() + 1)
    first = gradient(var, target, "topk:ratio=0.5", memory="fp32").numpy()
    second = gradient(var, target, "topk:ratio=0.5", memory="fp32").numpy()
    mean = np.mean(np.arange(1, hvd.size() + 1))
    np.testing.assert_allclose(first, [0, 5 * mean])
    np.testing.assert_allclose(second, [8 * mean, 0])


@timeout
@pytest.mark.parametrize("compression", ["none", "sketch:density=0.5", "randomk:ratio=0.5"])
def test_a_rank_that_retraces_alone_neither_hangs_nor_disagrees(hvd, compression):
    """One rank's last batch is smaller, so only that rank traces the step again: its graph must
    submit the same collectives, with the same hash seeds, as the other ranks' older graph."""
    var = tf.Variable(tf.ones((8, 4)), name=f"retrace_{compression.split(':')[0]}")

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, var))
        return DistributedGradientTape(tape, compression=compression).gradient(loss, [var])[0]

    last = hvd.rank() == hvd.size() - 1
    for i in range(3):
        rows = 5 if i == 2 and last else 6
        got = step(tf.fill((rows, 8), float(hvd.rank() + 1)))
        assert same_on_every_rank(hvd, got, f"retrace_{i}_{compression.split(':')[0]}")
    if compression == "none":
        rows = [6] * (hvd.size() - 1) + [5]
        np.testing.assert_allclose(got.numpy(), np.mean([n * (r + 1) for r, n in enumerate(rows)]))


@timeout
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_a_finite_gradient_that_overflows_float16_is_reported_as_overflow(hvd, graph):
    target = tf.fill([16], 1e5 if hvd.rank() == 0 else 1.0)
    error = tf.errors.InvalidArgumentError if graph else FloatingPointError
    with pytest.raises(error, match="overflowed float16 on the wire"):
        gradient(tf.Variable(tf.zeros(16)), target, "fp16", graph=graph, error_if_nonfinite=True)


@timeout
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("compression", ["none", "topk:ratio=1"])
def test_bfloat16_variables_get_bfloat16_averages(hvd, compression, graph):
    target = tf.constant(np.arange(12, dtype=np.float32) * (hvd.rank() + 1))
    got = gradient(tf.Variable(tf.zeros(12, tf.bfloat16)), target, compression, graph=graph)
    assert got.dtype == tf.bfloat16
    expected = np.arange(12) * np.mean(np.arange(1, hvd.size() + 1))
    np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), expected, rtol=1e-2)


@timeout
def test_float16_variables_with_powersgd_stay_finite(hvd):
    rng = np.random.default_rng(hvd.rank())
    got = gradient(tf.Variable(tf.zeros((16, 8), tf.float16), name="fp16_powersgd"),
                   rng.standard_normal((16, 8)).astype(np.float32), "powersgd:rank=2")
    assert got.dtype == tf.float16 and np.isfinite(got.numpy()).all()
    assert same_on_every_rank(hvd, got, "fp16_powersgd")
