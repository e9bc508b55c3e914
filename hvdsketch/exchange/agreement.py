"""Ranks must run the same setup at the same step; this checks they do, and fails alike on every rank.

Two checks. At start, one allgather of a digest of the setup (compressor or
policy, residual memory, every tensor's name and shape): every rank sees every
digest, so every rank reaches the same verdict and none hangs. Every step, a
tiny ``max`` allreduce of ``(step, -step, setup, -setup, activity, -activity)``
rides beside the gradients' collectives (:func:`step_message`) and is checked
before any gradient is waited for (ranks running different setups start
different collectives): its maxima equal the minima only if every rank is at the
same step with the same setup, doing the same thing, so a rank resumed at
another step (a checkpoint loaded on one rank only) or switched to another setup
is named on every rank before any gradient is used.

The activity says what a rank sends the tag for: a training step
(:data:`TRAIN`) or gathering a checkpoint (:data:`CHECKPOINT`, which every rank
must do together). Both travel under the same collective name, so a rank that
calls ``optimizer.state_dict()`` alone meets the other ranks' next training
step instead of waiting forever for a gather they never start: both sides see
the mismatch in the reduced tag and raise (:func:`step_error`).
"""
from __future__ import annotations

import hashlib
from types import ModuleType
from typing import Any, Sequence

from hvdsketch.collectives import Communicator, reduce
from hvdsketch.compress.base import Message


class AgreementError(RuntimeError):
    """Ranks run with different compression setups, tensor shapes or steps."""


def digest(text: str, bits: int = 62) -> int:
    """A ``bits``-bit digest of ``text``, the same on every rank."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> (64 - bits)


def verify(communicator: Communicator, description: str, ops: ModuleType) -> None:
    """Fail on every rank unless all ranks pass the same ``description`` (its digest travels in host
    memory: control, not gradient data).

    Works eagerly (raises :class:`AgreementError`) and inside ``tf.function`` (an assertion op).
    """
    local = ops.host_constant([digest(description)], "int64")
    (gathered,) = reduce(communicator, [Message(local, "allgather")], "hvdsketch.agreement")
    ops.check_all_equal(
        gathered, f"hvdsketch: ranks run different compression setups or models (rank "
                  f"{communicator.rank} runs: {description[:300]}); start every rank with the same "
                  f"--compression / HVDSKETCH_COMPRESSION / config and the same model", AgreementError)


#: What a rank sends its step tag for (the tag's third pair).
TRAIN, CHECKPOINT = 0, 1

#: How to resume a checkpoint on every rank, named by every error a partial resume leads to.
RESUME = ("a checkpoint must be loaded on every rank (each takes its own rank's state from the one file "
          "rank 0 saved), or loaded on rank 0 and then broadcast with "
          "hvdsketch.torch.broadcast_optimizer_state(optimizer, root_rank=0); Horovod's own "
          "hvd.broadcast_optimizer_state does not carry hvdsketch's per-rank state")

#: How to save one: ``state_dict()`` gathers every rank's state.
SAVE = ("optimizer.state_dict() gathers every rank's state (residuals, compressors' state), so every rank "
        "must call it: call state_dict() on every rank, then save on rank 0 "
        "(state = optimizer.state_dict(); if hvd.rank() == 0: torch.save(state, path))")


def step_message(ops: ModuleType, step: int, setup: int, activity: int = TRAIN) -> Message:
    """This step's tag: ``max`` over ranks of ``(step, -step, setup, -setup, activity, -activity)``, in
    host memory (control, not gradient data: checking it must not wait for an accelerator)."""
    return Message(ops.host_constant([step, -step, setup, -setup, activity, -activity], "int64"), "max")


def step_agrees(ops: ModuleType, reduced: Any) -> Any:
    """A 0-d truth (a tensor of the back-end) that every rank sent the same step, setup and activity."""
    return ops.reduce_min(ops.cast(reduced[0::2] == -reduced[1::2], "int64")) > 0


def step_error(step: int, rank: int, reduced: Sequence[int] | None = None) -> AgreementError:
    """The error every rank raises when the tag disagrees; ``reduced`` (the tag as integers, where
    it can be read) tells what differs: the activity (a rank gathering a checkpoint alone), the
    step (a checkpoint loaded on some ranks only) or the setup."""
    if reduced is not None and reduced[4] != -reduced[5]:
        return AgreementError(f"hvdsketch: some ranks gather a checkpoint while others train (rank {rank} is at "
                              f"step {step}); {SAVE}")
    if reduced is not None and reduced[0] != -reduced[1]:
        return AgreementError(f"hvdsketch: ranks are at different steps (rank {rank} is at step {step}, others "
                              f"between {-reduced[1]} and {reduced[0]}): {RESUME}")
    return AgreementError(
        f"hvdsketch: ranks are at different steps or run different setups (rank {rank} is at step {step}); "
        f"{RESUME}; and every rank must run the same compression")
