"""Horovod's checkpoint habit: rank 0 saves one file, every rank resumes from it exactly.

Every rank calls ``optimizer.state_dict()`` (it gathers every rank's residuals and
compressors' state), rank 0 alone ``torch.save``s it into a folder all ranks
share, and a fresh model and optimizer on every rank load that file (or rank 0
loads it and broadcasts): the continuation equals the uninterrupted run bit for
bit. Giving every rank rank 0's hvdsketch state instead (what a checkpoint of
rank 0's state alone would do) makes it differ, so the tests can fail.
"""
import copy
import io
import os
import time
import warnings

import numpy as np
import pytest
import torch

import hvdsketch.torch as hvdsketch_torch
from hvdsketch.exchange import AgreementError
from hvdsketch.exchange.checkpoint import StateReset, checksum
from hvdsketch.torch import DistributedOptimizer
from hvdsketch.torch.saved import to_numpy
from tests.shared_folder import shared_folder

#: (compression, memory): residual stores, methods with state of their own, the sketch, and auto on a
#: link so slow that PowerSGD at rank 1 (per-rank error feedback) wins the dense layer by far more than
#: timing noise. Not fp16 there: Horovod sums fp16 differently in the last bits depending on how its
#: fusion packed the tensors, so two runs at 4 ranks differ (PyTorch, whose hooks start them apart).
CASES = [("topk:ratio=0.05", "fp32"), ("topk:ratio=0.05", "fp16"), ("topk:ratio=0.05", "topk:ratio=0.2"),
         ("dgc:ratio=0.05", None), ("efsignsgd", None), ("powersgd:rank=2", None),
         ("sketch:error=0.5", "fp32"), ("sketch:density=0.05", "fp32"),
         ("auto:bandwidth=100kbit,latency=10us,warmup=2,powersgd_rank=1", "fp32"),
         ({"rules": [{"name": "2.weight", "compression": "powersgd"}], "default": "powersgd:rank=1"}, "fp32")]
STEPS = 5


@pytest.fixture(scope="module")
def folder(hvd):
    yield from shared_folder(hvd, "hvdsketch-resume-")


def make(compression, memory, tag=""):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(3000, 8), torch.nn.Flatten(), torch.nn.Linear(8 * 6, 4))
    named = [(f"{tag}{name}", p) for name, p in model.named_parameters()]
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9), named,
                                     compression=compression, memory=memory)
    return model, optimizer


def train(model, optimizer, start, steps, rank):
    for step in range(start, start + steps):
        rng = np.random.default_rng([rank, step])
        tokens = torch.from_numpy(rng.integers(0, 3000, size=(16, 6)))
        labels = torch.from_numpy(rng.integers(0, 4, size=16))
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(tokens), labels).backward()
        optimizer.step()


def save(hvd, model, optimizer, path):
    """The habit: every rank gathers, rank 0 writes, the others wait for the file."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    if hvd.rank() == 0:
        torch.save(state, path)
    hvd.barrier()


def load(path):
    return torch.load(path)


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def uninterrupted(hvd, case, path):
    """Train ``STEPS`` steps, save, train ``STEPS`` more: the model of the run never stopped."""
    model, optimizer = make(*case)
    train(model, optimizer, 0, STEPS, hvd.rank())
    save(hvd, model, optimizer, path)
    train(model, optimizer, STEPS, STEPS, hvd.rank())
    return model


def resumed(hvd, case, checkpoint, on_rank_0_only=False):
    model, optimizer = make(*case)
    if not on_rank_0_only or hvd.rank() == 0:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
    if on_rank_0_only:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvdsketch_torch.broadcast_optimizer_state(optimizer, root_rank=0)
    train(model, optimizer, STEPS, STEPS, hvd.rank())
    return model


def with_rank_0_state_everywhere(checkpoint):
    """The checkpoint as a rank-0-only one would resume: every rank with rank 0's hvdsketch state."""
    checkpoint = copy.deepcopy(checkpoint)
    ours = checkpoint["optimizer"]["hvdsketch"]
    ours["ranks"] = [ours["ranks"][0]] * len(ours["ranks"])
    ours["checksum"] = checksum(to_numpy(ours))  # edited on purpose: sealed anew
    return checkpoint


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case[0]}|{case[1]}")
def test_one_file_saved_on_rank_0_resumes_every_rank_exactly(hvd, folder, case):
    path = os.path.join(folder, "checkpoint.pt")
    model = uninterrupted(hvd, case, path)
    checkpoint = load(path)
    assert len(checkpoint["optimizer"]["hvdsketch"]["ranks"]) == hvd.size()
    assert same(model, resumed(hvd, case, load(path)))
    # each rank needs its own state: with rank 0's on every rank the continuation differs
    assert not same(model, resumed(hvd, case, with_rank_0_state_everywhere(checkpoint)))


@pytest.mark.parametrize("case", [CASES[0], ("powersgd:rank=2", None)], ids=lambda case: case[0])
def test_loaded_on_rank_0_and_broadcast_resumes_every_rank_exactly(hvd, folder, case):
    path = os.path.join(folder, "broadcast.pt")
    model = uninterrupted(hvd, case, path)
    checkpoint = load(path) if hvd.rank() == 0 else None
    assert same(model, resumed(hvd, case, checkpoint, on_rank_0_only=True))


def loaded_on_rank_0_alone(hvd, folder, name: str):
    """A fresh model and optimizer, rank 0's optimizer loaded from an uninterrupted run's file."""
    path = os.path.join(folder, name)
    uninterrupted(hvd, CASES[0], path)
    model, optimizer = make(*CASES[0])
    if hvd.rank() == 0:
        optimizer.load_state_dict(load(path)["optimizer"])
    return model, optimizer


def test_horovods_broadcast_after_a_rank_0_load_names_the_supported_way(hvd, folder):
    model, optimizer = loaded_on_rank_0_alone(hvd, folder, "horovod.pt")
    with pytest.raises(AgreementError, match="different steps.*hvdsketch.torch.broadcast_optimizer_state"):
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)


def test_a_load_on_rank_0_alone_fails_the_next_step_on_every_rank(hvd, folder):
    model, optimizer = loaded_on_rank_0_alone(hvd, folder, "alone.pt")
    with pytest.raises(AgreementError, match="different steps.*loaded on every rank.*broadcast_optimizer_state"):
        train(model, optimizer, 0, 1, hvd.rank())


def test_horovods_broadcast_at_the_start_of_training_works_as_with_horovods_optimizer(hvd):
    model, optimizer = make(*CASES[0], tag="start.")
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    train(model, optimizer, 0, 2, hvd.rank())
    assert optimizer.report()["steps"] == 3  # Horovod's made the momentum buffers with one step of zeros


#: What the other ranks do right after rank 0's save, in Horovod's habit: train on, or a collective of
#: Horovod's own (a barrier, as Horovod's examples put after the save; an allreduce; a broadcast).
AFTER_THE_SAVE = {
    "training": lambda hvd: None,
    "barrier": lambda hvd: hvd.barrier(),
    "allreduce": lambda hvd: hvd.allreduce(torch.ones(1), name="habit.allreduce"),
    "broadcast_object": lambda hvd: hvd.broadcast_object("saved", root_rank=0, name="habit.broadcast"),
}


@pytest.mark.parametrize("after", AFTER_THE_SAVE)
def test_state_dict_on_rank_0_alone_waits_for_no_one_and_resumes_every_rank_afresh_alike(hvd, folder, after,
                                                                                        monkeypatch):
    """Horovod's habit, ``optimizer.state_dict()`` inside ``if hvd.rank() == 0:``: nothing waits
    (the others' next step answers rank 0's check-in at once; past any other collective it gives
    up after ``HVDSKETCH_CHECKIN_SECONDS``), rank 0 warns once, and the file resumes every rank alike."""
    limit = 60.0 if after == "training" else 2.0  # training answers at once: far below the limit
    monkeypatch.setenv("HVDSKETCH_CHECKIN_SECONDS", str(limit))
    model, optimizer = make(*CASES[0], tag="habit.")
    train(model, optimizer, 0, 2, hvd.rank())
    path = os.path.join(folder, f"habit-{after}.pt")
    if hvd.rank() == 0:
        began = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
        assert time.monotonic() - began < limit / 2 if after == "training" else limit + 5
        said = [str(w.message) for w in caught if "without the other ranks" in str(w.message)]
        assert len(said) == 1 and "call state_dict() on every rank" in said[0]
        assert torch.load(path)["optimizer"]["hvdsketch"]["ranks"] is None
    AFTER_THE_SAVE[after](hvd)
    train(model, optimizer, 2, 2, hvd.rank())  # and training goes on, alike on every rank
    assert_replicas_identical(hvd, model, f"habit.{after}.trained")
    hvd.barrier()  # the file is written
    resumed_model, resumed_optimizer = make(*CASES[0], tag="habit.")
    checkpoint = load(path)
    resumed_model.load_state_dict(checkpoint["model"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed_optimizer.load_state_dict(checkpoint["optimizer"])
    resets = [str(w.message) for w in caught if issubclass(w.category, StateReset)]
    assert len(resets) == (hvd.rank() == 0)
    assert all("saved on one rank without every rank's state" in m and "afresh at step 2" in m for m in resets)
    train(resumed_model, resumed_optimizer, 2, 2, hvd.rank())
    assert_replicas_identical(hvd, resumed_model, f"habit.{after}.resumed")


def assert_replicas_identical(hvd, model, name):
    weights = hvd.allgather(torch.cat([p.detach().reshape(-1) for p in model.parameters()])[None], name=name)
    assert all(torch.equal(weights[0], w) for w in weights)


def _flip_a_residual_bit(checkpoint) -> None:
    """One bit flipped in rank 0's first residual (a flip in the file that unpickling cannot notice)."""
    slots = checkpoint["optimizer"]["hvdsketch"]["ranks"][0]["memory"]["slots"]
    tensor = next(v for slot in slots.values() for v in slot.values() if isinstance(v, torch.Tensor) and v.any())
    tensor.view(-1).view(torch.uint8)[tensor.nbytes // 2] ^= 0x10


def test_a_damaged_or_foreign_checkpoint_entry_is_a_clear_error_naming_it_on_every_rank(hvd):
    model, optimizer = make(*CASES[0], tag="damaged.")
    train(model, optimizer, 0, 2, hvd.rank())
    saved = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    flipped = torch.load(io.BytesIO(buffer.getvalue()))
    _flip_a_residual_bit(flipped)
    edited = copy.deepcopy(saved)
    del edited["optimizer"]["hvdsketch"]["ranks"][-1]["step"]
    older = copy.deepcopy(saved)
    older["optimizer"]["hvdsketch"]["format"] = 1
    _, fresh = make(*CASES[0], tag="damaged.")
    for checkpoint in (flipped, edited):
        with pytest.raises(ValueError, match=r"'hvdsketch' entry is damaged: its contents do not match its checksum"):
            fresh.load_state_dict(checkpoint["optimizer"])
    with pytest.raises(ValueError, match=r"'hvdsketch' entry has format 1, written by another version"):
        fresh.load_state_dict(older["optimizer"])
    with pytest.raises(ValueError, match=r"'hvdsketch' entry is not a checkpoint of hvdsketch's state"):
        fresh.load_state_dict({**saved["optimizer"], "hvdsketch": "not a checkpoint"})
    fresh.load_state_dict(saved["optimizer"])  # the intact one loads


def _other_world(checkpoint, size):
    """``checkpoint`` as if made by ``size`` ranks (the ranks' entries repeated or cut)."""
    checkpoint = copy.deepcopy(checkpoint)
    ours = checkpoint["hvdsketch"]
    ours["ranks"] = (ours["ranks"] * size)[:size]
    ours["world"] = size
    ours["checksum"] = checksum(to_numpy(ours))
    return checkpoint


def test_a_checkpoint_of_another_world_size_is_a_clear_error_or_an_opted_in_logged_reset(hvd):
    model, optimizer = make(*CASES[0], tag="world.")
    train(model, optimizer, 0, 3, hvd.rank())
    other = 4 if hvd.size() == 2 else 2
    checkpoint = _other_world(optimizer.state_dict(), other)
    resumed_model, resumed_optimizer = make(*CASES[0], tag="world.")
    with pytest.raises(ValueError, match=rf"{other} ranks \(this run has {hvd.size()}\).*reset_on_change=True"):
        resumed_optimizer.load_state_dict(copy.deepcopy(checkpoint))
    resumed_model.load_state_dict(model.state_dict())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed_optimizer.load_state_dict(checkpoint, reset_on_change=True)
    resets = [w for w in caught if issubclass(w.category, StateReset)]
    assert len(resets) == (hvd.rank() == 0)
    assert all("start afresh at step 3" in str(w.message) for w in resets)
    report = resumed_optimizer.report()
    assert report["steps"] == 3 and report["residual_bytes"] == 0
    train(resumed_model, resumed_optimizer, 3, 2, hvd.rank())  # and training goes on, alike on every rank
    weights = hvd.allgather(resumed_model[2].weight.detach()[None], name="resume.weights")
    assert all(torch.equal(weights[0], w) for w in weights)


def test_a_checkpoint_of_another_method_is_a_clear_error_or_an_opted_in_reset(hvd):
    model, optimizer = make("powersgd:rank=2", None, tag="method.")
    train(model, optimizer, 0, 2, hvd.rank())
    checkpoint = optimizer.state_dict()
    _, other = make("dgc:ratio=0.05", None, tag="method.")
    with pytest.raises(ValueError, match="compression 'powersgd:rank=2'.*this run: 'dgc:ratio=0.05'"):
        other.load_state_dict(copy.deepcopy(checkpoint))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StateReset)
        other.load_state_dict(checkpoint, reset_on_change=True)
    assert other.report()["steps"] == 2
