"""A non-finite step with TensorFlow passes through as Horovod's tape and tf-keras optimizer pass it: the
NaN or Inf average comes back (a loss scaler skips the step), and hvdsketch's state is as it was
before the step, eagerly and inside ``tf.function`` (a graph's held state put back at that run)."""
import numpy as np
import pytest
import tensorflow as tf

import hvdsketch.tensorflow.keras as hvdsketch_keras
from hvdsketch.tensorflow import DistributedGradientTape, gradients
from tests.loss_scaling import OVERFLOWS, assert_same_state

timeout = pytest.mark.timeout(180, method="thread")
STEPS = 6


@pytest.fixture(autouse=True)
def own_exchangers(monkeypatch):
    """The tape keeps one exchanger per setup for the whole process: these tests keep theirs apart."""
    monkeypatch.setattr(gradients, "TAPES", gradients.TapeExchanges())


@timeout
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("compression, memory", [("none", None), ("powersgd:rank=2", None),
                                                 ("topk:ratio=0.25", "fp32"), ("sketch:density=0.05", "fp32")])
def test_a_nonfinite_step_passes_through_the_tape_and_leaves_the_state_as_before(hvd, compression, memory, graph):
    var = tf.Variable(tf.zeros((40, 8)))
    target = tf.Variable(tf.zeros((40, 8)))

    def step(blown):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(var * target) * blown
        return DistributedGradientTape(tape, compression=compression, memory=memory).gradient(loss, [var])[0]

    step = tf.function(step) if graph else step
    rng = np.random.default_rng(hvd.rank())
    for k in range(STEPS):
        target.assign(rng.standard_normal((40, 8)).astype(np.float32))
        before = gradients.TAPES()[0].local_state() if k in OVERFLOWS else None
        blown = tf.constant(np.inf if k in OVERFLOWS and hvd.rank() == 0 else 1.0, tf.float32)
        grad = step(blown)
        finite = bool(tf.reduce_all(tf.math.is_finite(grad)))
        assert finite == (k not in OVERFLOWS)
        if finite:  # as a loss scaler steps
            var.assign_sub(0.1 * grad)
        else:
            assert_same_state(before, gradients.TAPES()[0].local_state())
    assert bool(tf.reduce_all(tf.math.is_finite(var)))


class StateAround(tf.keras.callbacks.Callback):
    """The optimizer's hvdsketch state before and after batch ``batch``."""

    def __init__(self, optimizer, batch: int) -> None:
        super().__init__()
        self.exchange, self.batch, self.states = optimizer._hvdsketch.exchange, batch, []

    def on_train_batch_begin(self, batch, logs=None):
        if batch == self.batch:
            self.states.append(self.exchange.local_state())

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            self.states.append(self.exchange.local_state())


@timeout
@pytest.mark.parametrize("compression, memory", [("topk:ratio=0.25", "fp32"), ("sketch:density=0.05", "fp32")])
def test_a_nonfinite_step_in_model_fit_leaves_the_state_as_before(hvd, compression, memory):
    """Inside model.fit's tf.function: the last batch's loss is Inf on rank 0 alone (a sample weight)."""
    tf.keras.utils.set_random_seed(0)
    net = tf.keras.Sequential([tf.keras.Input((12,)), tf.keras.layers.Dense(16, activation="relu"),
                               tf.keras.layers.Dense(3)])
    optimizer = hvdsketch_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=compression,
                                                     memory=memory)
    net.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(hvd.rank())
    x, y = rng.standard_normal((48, 12)).astype(np.float32), rng.integers(0, 3, 48)
    weights = np.ones(48, np.float32)
    if hvd.rank() == 0:
        weights[-8:] = np.inf
    around = StateAround(optimizer, batch=5)
    net.fit(x, y, sample_weight=weights, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[around])
    before, after = around.states
    assert before["step"] == 5
    assert_same_state(before, after)
