"""Two models in one script, each under its own Horovod ``DistributedGradientTape`` given the same
drop-in compression object: each trains bit for bit as it would alone, eagerly and inside
``tf.function``. Horovod's tape traces its allreduce even when eager, so here the compression runs
traced (step 0's hashes, no state kept) whoever calls it; the PyTorch twin of this test
(tests/mpi/torch/test_dropin_models.py) is the one whose steps and states are per optimizer."""
import numpy as np
import pytest
import tensorflow as tf

from hvdsketch.tensorflow import Compression

STEPS = 5


class Trainer:
    """One model (a dense layer pair of the same shapes for both models, so the drop-in's names by
    shape meet) trained by Horovod's tape; model ``which`` sees its own data."""

    def __init__(self, hvd, which: int, compression, graph: bool) -> None:
        tf.keras.utils.set_random_seed(which)
        self.hvd, self.which, self.compression, self.step = hvd, which, compression, 0
        self.model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(64),
                                          tf.keras.layers.Dense(4)])
        self.optimizer = tf.keras.optimizers.SGD(0.1)
        self._step = tf.function(self._train) if graph else self._train

    def _train(self, x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((self.model(x) - y) ** 2)
        tape = self.hvd.DistributedGradientTape(tape, compression=self.compression)
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))

    def train_step(self) -> None:
        rng = np.random.default_rng([self.which, self.step, self.hvd.rank()])
        x = rng.normal(size=(8, 16)).astype("float32")
        # model 1's inputs are sparse in their first half: its gradients differ in density from model 0's
        x[:, :8] *= self.which == 0
        self._step(tf.constant(x), tf.constant(rng.normal(size=(8, 4)).astype("float32")))
        self.step += 1

    def weights(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.model.trainable_variables]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("flag", ["sketch", "randomk:ratio=0.3"])
def test_two_models_under_their_own_tapes_train_as_each_would_alone(hvd, flag, graph):
    compression = Compression.sketch() if flag == "sketch" else Compression.from_spec(flag)
    alone = []
    for which in (0, 1):
        trainer = Trainer(hvd, which, compression, graph)
        for _ in range(STEPS):
            trainer.train_step()
        alone.append(trainer.weights())
    pair = [Trainer(hvd, which, compression, graph) for which in (0, 1)]
    for _ in range(STEPS):
        for trainer in pair:
            trainer.train_step()
    for trainer, expected in zip(pair, alone):
        for got, want in zip(trainer.weights(), expected):
            np.testing.assert_array_equal(got, want, err_msg=f"model {trainer.which} differs from its run alone")
