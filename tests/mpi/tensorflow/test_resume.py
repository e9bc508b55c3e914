"""Horovod's checkpoint habit in TensorFlow: every rank gathers, rank 0 saves one ``tf.train.Checkpoint``,
every rank restores it, and the continuation equals the uninterrupted run bit for bit.

The tape's state is :func:`hvdsketch.tensorflow.TapeState` (the tapes' exchanges of this process,
shared by setup: each run below forgets them first, as a new process would); the tf-keras
optimizer tracks its own. Giving every rank rank 0's hvdsketch state instead (what a checkpoint of
rank 0's state alone would do) makes the continuation differ, so the tests can fail.
"""
import gc
import os
import pickle
import shutil
import warnings

import numpy as np
import pytest
import tensorflow as tf

import hvdsketch.tensorflow as hvdsketch_tf
from hvdsketch.exchange import AgreementError
from hvdsketch.exchange.checkpoint import StateReset, checksum
from hvdsketch.tensorflow import gradients
from tests.shared_folder import shared_folder

#: (compression, memory): residual stores, methods with state of their own, the sketch, and auto on a
#: link so slow that PowerSGD at rank 1 (per-rank error feedback) wins the dense layer by far more than
#: timing noise. Not fp16 there: Horovod sums fp16 differently in the last bits depending on how its
#: fusion packed the tensors, so two runs at 4 ranks differ (PyTorch, whose hooks start them apart).
CASES = [("topk:ratio=0.05", "fp32"), ("topk:ratio=0.05", "fp16"), ("topk:ratio=0.05", "topk:ratio=0.2"),
         ("dgc:ratio=0.05", None), ("efsignsgd", None), ("powersgd:rank=2", None),
         ("sketch:error=0.5", "fp32"), ("sketch:density=0.05", "fp32"),
         ("auto:bandwidth=100kbit,latency=10us,warmup=2,powersgd_rank=1", "fp32")]
STEPS = 5
VOCAB = 3000


@pytest.fixture(scope="module")
def folder(hvd):
    yield from shared_folder(hvd, "hvdsketch-tf-resume-")


def model() -> tf.keras.Model:
    tf.keras.backend.clear_session()  # the same variable names (they name the exchanges, seed hashes) every time
    tf.keras.utils.set_random_seed(0)
    return tf.keras.Sequential([tf.keras.Input((6,), dtype="int64"), tf.keras.layers.Embedding(VOCAB, 8),
                                tf.keras.layers.Flatten(), tf.keras.layers.Dense(4)])


def batch(rank: int, step: int):
    rng = np.random.default_rng([rank, step])
    return tf.constant(rng.integers(0, VOCAB, size=(16, 6))), tf.constant(rng.integers(0, 4, size=16))


class Run:
    """A tape training loop as in a new process: model, optimizer, the tapes' state and a checkpoint of all three."""

    def __init__(self, case, graph=False):
        gradients.TAPES.clear()  # a new process has made no tape yet
        self.compression, self.memory = case
        self.model = model()
        self.optimizer = tf.keras.optimizers.SGD(0.2, momentum=0.9)
        self.state = hvdsketch_tf.TapeState()
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, hvdsketch=self.state)
        self.step = tf.function(self._step) if graph else self._step

    def _step(self, x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, self.model(x), from_logits=True))
        tape = hvdsketch_tf.DistributedGradientTape(tape, compression=self.compression, memory=self.memory)
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))

    def train(self, hvd, start: int, steps: int = STEPS) -> "Run":
        for step in range(start, start + steps):
            self.step(*batch(hvd.rank(), step))
        return self

    def save(self, hvd, prefix: str) -> str:
        """The habit: every rank gathers, rank 0 writes, the others wait for the file."""
        self.state.gather()
        path = self.checkpoint.save(prefix) if hvd.rank() == 0 else None
        return hvd.broadcast_object(path, 0, name="resume.path")  # the others wait for the file

    def weights(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.model.trainable_variables]


def same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def uninterrupted(hvd, case, prefix, graph=False):
    run = Run(case, graph).train(hvd, 0)
    path = run.save(hvd, prefix)
    return run.train(hvd, STEPS).weights(), path


def saved_blob(path: str) -> bytes:
    reader = tf.train.load_checkpoint(path)
    (key,) = [k for k in reader.get_variable_to_shape_map() if "hvdsketch" in k and k.endswith("py_state")]
    return reader.get_tensor(key)


def with_rank_0_state_everywhere(blob: bytes) -> bytes:
    """The saved state as a rank-0-only one would resume: every rank with rank 0's hvdsketch state."""
    saved = pickle.loads(blob)
    for entry in saved["exchanges"]:
        entry["ranks"] = [entry["ranks"][0]] * len(entry["ranks"])
        entry["checksum"] = checksum(entry)  # edited on purpose: sealed anew
    return pickle.dumps(saved)


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case[0]}|{case[1]}")
def test_one_checkpoint_saved_on_rank_0_resumes_every_rank_exactly(hvd, folder, case):
    weights, path = uninterrupted(hvd, case, os.path.join(folder, "tape"))
    assert len(pickle.loads(saved_blob(path))["exchanges"][0]["ranks"]) == hvd.size()
    resumed = Run(case)
    resumed.checkpoint.restore(path).assert_existing_objects_matched()
    assert same(weights, resumed.train(hvd, STEPS).weights())
    # each rank needs its own state: with rank 0's on every rank the continuation differs
    other = Run(case)
    other.checkpoint.restore(path)
    other.state.deserialize(with_rank_0_state_everywhere(saved_blob(path)))
    assert not same(weights, other.train(hvd, STEPS).weights())


def test_inside_tf_function_too(hvd, folder):
    weights, path = uninterrupted(hvd, CASES[0], os.path.join(folder, "graph"), graph=True)
    resumed = Run(CASES[0], graph=True)
    resumed.checkpoint.restore(path)
    assert same(weights, resumed.train(hvd, STEPS).weights())


def test_a_restored_state_the_script_dropped_gives_nothing_to_a_later_tape(hvd, folder):
    """A state restored and then dropped before any tape took its entries (a script that builds
    its loop anew) stops listening: a later fresh run trains as if no checkpoint was ever read."""
    first = Run(CASES[0]).train(hvd, 0)
    path = first.save(hvd, os.path.join(folder, "dropped"))
    dropped = Run(CASES[0])
    dropped.checkpoint.restore(path)
    del dropped
    gc.collect()
    assert same(first.weights(), Run(CASES[0]).train(hvd, 0).weights())


def test_restored_on_rank_0_and_broadcast_resumes_every_rank_exactly(hvd, folder):
    """Horovod's other habit: restore on rank 0, broadcast the variables (the optimizer's built
    first) and, for hvdsketch's per-rank state, ``state.broadcast``."""
    case = ("powersgd:rank=2", None)
    weights, path = uninterrupted(hvd, case, os.path.join(folder, "broadcast"))
    resumed = Run(case)
    resumed.optimizer.build(resumed.model.trainable_variables)
    if hvd.rank() == 0:
        resumed.checkpoint.restore(path)
    hvd.broadcast_variables(resumed.model.variables + resumed.optimizer.variables(), root_rank=0)
    resumed.state.broadcast(root_rank=0)
    assert same(weights, resumed.train(hvd, STEPS).weights())


def test_a_restore_on_rank_0_alone_fails_the_first_step_on_every_rank(hvd, folder):
    _, path = uninterrupted(hvd, CASES[0], os.path.join(folder, "alone"))
    resumed = Run(CASES[0])
    if hvd.rank() == 0:
        resumed.checkpoint.restore(path)
    with pytest.raises(AgreementError, match="different steps"):
        resumed.train(hvd, STEPS, steps=1)


def test_a_save_on_rank_0_alone_resumes_with_every_ranks_residuals_afresh_and_says_so(hvd, folder,
                                                                                      assert_replicas_identical):
    """Horovod's plain habit, without ``gather()``: no collective (the others train on), rank 0
    warns that no rank's residuals are in the file; every rank resumes from it alike, afresh."""
    run = Run(CASES[0]).train(hvd, 0, steps=2)
    path = None
    if hvd.rank() == 0:
        with pytest.warns(UserWarning, match=r"no rank's error-feedback residuals.*call gather\(\) on every rank"):
            path = run.checkpoint.save(os.path.join(folder, "lonely"))
    run.train(hvd, 2, steps=1)  # meanwhile nobody waits for anybody
    path = hvd.broadcast_object(path, 0, name="resume.lonely")
    resumed = Run(CASES[0])
    resumed.checkpoint.restore(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed.train(hvd, 2, steps=2)
    resets = [str(w.message) for w in caught if issubclass(w.category, StateReset)]
    assert len(resets) == (hvd.rank() == 0)
    assert all("saved on one rank without every rank's state" in m and "afresh at step 2" in m for m in resets)
    assert_replicas_identical(resumed.model, "resume.replicas")


def other_world(blob: bytes, size: int) -> bytes:
    """The saved state as if made by ``size`` ranks (the ranks' entries repeated or cut)."""
    saved = pickle.loads(blob)
    for entry in saved["exchanges"]:
        entry["ranks"] = (entry["ranks"] * size)[:size]
        entry["world"] = size
        entry["checksum"] = checksum(entry)
    return pickle.dumps(saved)


def test_a_checkpoint_of_another_world_size_is_a_clear_error_or_an_opted_in_logged_reset(hvd, folder,
                                                                                         assert_replicas_identical):
    weights, path = uninterrupted(hvd, CASES[0], os.path.join(folder, "world"))
    other = 4 if hvd.size() == 2 else 2
    blob = other_world(saved_blob(path), other)
    resumed = Run(CASES[0]).train(hvd, 0, steps=1)  # its tape's exchange exists: the error comes at restore
    with pytest.raises(ValueError, match=rf"{other} ranks \(this run has {hvd.size()}\).*reset_on_change=True"):
        resumed.state.deserialize(blob)
    reset = Run(CASES[0])  # no tape yet: the error or reset comes with the first tape
    reset.state.reset_on_change = True
    reset.checkpoint.restore(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reset.state.deserialize(blob)
        reset.train(hvd, STEPS, steps=2)  # and training goes on, alike on every rank
    resets = [w for w in caught if issubclass(w.category, StateReset)]
    assert len(resets) == (hvd.rank() == 0)
    assert all(f"start afresh at step {STEPS}" in str(w.message) for w in resets)
    assert_replicas_identical(reset.model, "resume.replicas")


def test_a_checkpoint_of_another_method_is_a_clear_error(hvd, folder):
    _, path = uninterrupted(hvd, ("powersgd:rank=2", None), os.path.join(folder, "method"))
    resumed = Run(("dgc:ratio=0.05", None))
    resumed.checkpoint.restore(path)
    with pytest.raises(ValueError, match="compression 'powersgd:rank=2'.*this run: 'dgc:ratio=0.05'"):
        resumed.train(hvd, STEPS, steps=1)



def test_a_damaged_checkpoint_is_a_clear_error_on_every_rank(hvd, folder):
    """One bit flipped in the middle of the checkpoint's data: TensorFlow's checksums find it where the
    tensor is read (the restore, or the first step for the optimizer's slots), alike on every rank, and
    nothing trains on from it. An hvdsketch entry edited without its checksum, or bytes that are no
    entry at all, are a ValueError naming the entry."""
    _, path = uninterrupted(hvd, CASES[0], os.path.join(folder, "damage"))
    flipped = path + "-flipped"
    if hvd.rank() == 0:
        for suffix in (".index", ".data-00000-of-00001"):
            shutil.copy(path + suffix, flipped + suffix)
        with open(flipped + ".data-00000-of-00001", "r+b") as data:
            middle = os.fstat(data.fileno()).st_size // 2
            data.seek(middle)
            byte = data.read(1)[0]
            data.seek(middle)
            data.write(bytes([byte ^ 0x10]))
    hvd.broadcast_object(None, 0, name="resume.flipped")  # the others wait for the file
    resumed = Run(CASES[0])
    with pytest.raises(tf.errors.OpError, match="Checksum does not match"):
        resumed.checkpoint.restore(flipped)
        resumed.train(hvd, STEPS, steps=1)

    edited = pickle.loads(saved_blob(path))
    edited["exchanges"][0]["ranks"].reverse()  # each rank's state given to another, not sealed anew
    running = Run(CASES[0]).train(hvd, 0, steps=1)  # its tape's exchange exists: the error comes at restore
    with pytest.raises(ValueError, match="'hvdsketch' entry is damaged: its contents do not match its checksum"):
        running.state.deserialize(pickle.dumps(edited))
    with pytest.raises(ValueError, match="hvdsketch entry cannot be read"):
        running.state.deserialize(b"hand-edited text")

# -- the tf-keras optimizer under model.fit: GatherStateCallback ahead of rank 0's ModelCheckpoint ------------

def fit(hvd, case, epochs, folder=None, restore=None, save_freq="epoch"):
    """``epochs`` epochs of the same 6 batches (rank 0 saving into ``folder`` every ``save_freq``),
    from the checkpoint ``restore`` if given: the weights at the end."""
    net = model()
    net.compile(optimizer=hvdsketch_tf.keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.2, momentum=0.9),
                                                                  compression=case[0], memory=case[1]),
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if restore:
        net.load_weights(restore)
    rng = np.random.default_rng(7 + hvd.rank())
    x, y = rng.integers(0, VOCAB, size=(48, 6)), rng.integers(0, 4, size=48)
    callbacks = [hvdsketch_tf.keras.GatherStateCallback(save_freq)]
    if folder and hvd.rank() == 0:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(os.path.join(folder, "weights-{epoch}"),
                                                            save_weights_only=True, save_freq=save_freq))
    net.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    hvd.broadcast_object(None, 0, name="resume.fitted")  # rank 0's files are written
    return [v.numpy() for v in net.trainable_variables]


@pytest.mark.parametrize("case", [("topk:ratio=0.05", "fp32"), ("powersgd:rank=2", None)],
                         ids=lambda case: case[0])
def test_model_fit_resumes_every_rank_from_rank_0s_model_checkpoint(hvd, folder, case):
    where = os.path.join(folder, f"keras-{case[0]}")
    weights = fit(hvd, case, epochs=2, folder=where)
    first = os.path.join(where, "weights-1")
    assert len(pickle.loads(saved_blob(first))["exchanges"][0]["ranks"]) == hvd.size()
    assert same(weights, fit(hvd, case, epochs=1, restore=first))


def test_model_save_on_rank_0_alone_saves_without_waiting_for_the_others(hvd, folder, assert_replicas_identical):
    """``if hvd.rank() == 0: model.save(path)`` (a SavedModel or a .keras file, with the optimizer)
    neither hangs nor fails: the SavedModel says it holds no rank's residuals, and both load
    without hvdsketch, the optimizer the wrapped one's own class."""
    net = model()
    net.compile(optimizer=hvdsketch_tf.keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.2),
                                                                  compression="topk:ratio=0.05", memory="fp32"),
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = batch(hvd.rank(), 0)
    net.fit(x, y, batch_size=8, verbose=0)
    if hvd.rank() == 0:
        with pytest.warns(UserWarning, match="no rank's error-feedback residuals"):
            net.save(os.path.join(folder, "savedmodel"))
        net.save(os.path.join(folder, "model.keras"))
        for name in ("savedmodel", "model.keras"):
            assert type(tf.keras.models.load_model(os.path.join(folder, name)).optimizer) is tf.keras.optimizers.SGD
    net.fit(x, y, batch_size=8, verbose=0)
    assert_replicas_identical(net, "resume.replicas")


def test_gather_state_callback_gathers_at_the_batches_model_checkpoint_saves_at(hvd, folder):
    """``save_freq=4`` in an epoch of 6 batches: ModelCheckpoint saves after batch 4 alone; the
    file holds every rank's state only if the callback gathered right there."""
    where = os.path.join(folder, "keras-batches")
    fit(hvd, ("topk:ratio=0.05", "fp32"), epochs=1, folder=where, save_freq=4)
    (entry,) = pickle.loads(saved_blob(os.path.join(where, "weights-1")))["exchanges"]
    assert entry["ranks"] is not None and len(entry["ranks"]) == hvd.size()
    assert {state["step"] for state in entry["ranks"]} == {4}
