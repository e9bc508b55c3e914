"""Ranks must run the same setup at the same step; this checks they do, and fails alike on every rank.

Two checks. At start, one allgather of a digest of the setup (compressor or
policy, residual memory, every tensor's name and shape): every rank sees every
digest, so every rank reaches the same verdict and none hangs. Every step, a
tiny ``max`` allreduce of ``(step, -step, setup, -setup)`` rides beside the
gradients' collectives (:func:`step_message`) and is checked before any
gradient is waited for (ranks running different setups start different
collectives): its maxima equal the minima only if every rank is at the same step
with the same setup, so a rank resumed at another step (a checkpoint loaded on
one rank only) or switched to another setup is named on every rank before any
gradient is used.
"""
from __future__ import annotations

import hashlib
from types import ModuleType
from typing import Any

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


def step_message(ops: ModuleType, step: int, setup: int) -> Message:
    """This step's tag: ``max`` over ranks of ``(step, -step, setup, -setup)``, in host memory (it is
    control, not gradient data: checking it must not wait for an accelerator)."""
    return Message(ops.host_constant([step, -step, setup, -setup], "int64"), "max")


def step_agrees(ops: ModuleType, reduced: Any) -> Any:
    """A 0-d truth (a tensor of the back-end) that every rank sent the same step and setup."""
    return ops.reduce_min(ops.cast(reduced[0::2] == -reduced[1::2], "int64")) > 0


def step_error(step: int, rank: int) -> AgreementError:
    return AgreementError(
        f"hvdsketch: ranks are at different steps or run different setups (rank {rank} is at step {step}); "
        f"a checkpoint must be loaded on every rank (or loaded on rank 0 and broadcast with "
        f"hvdsketch's optimizer state, see DistributedOptimizer.state_dict), never on some ranks only")
