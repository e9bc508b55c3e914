"""Communicators: move a compressor's messages between ranks, without blocking.

A communicator has ``rank``, ``size``, ``stats`` (:class:`~hvdsketch.collectives.stats.CommStats`) and
``start(messages, name)``, which starts reducing each :class:`~hvdsketch.compress.Message` by its ``op`` (one
collective per op and dtype) and returns a :class:`Handle` at once: ``test()`` says without blocking whether the
results have arrived, ``wait()`` returns them. ``name`` labels the round's collectives, the same on every rank
and stable across steps (Horovod matches and caches collectives by name). Implementations: :mod:`.horovod`,
:mod:`.mpi` (hvdsketch's own) and :mod:`.torchdist`; :mod:`.grouping` is what they share.
"""
from __future__ import annotations

import copy
from typing import Any, Protocol, Sequence

from hvdsketch.collectives.stats import CommStats
from hvdsketch.compress.base import Message


class Handle(Protocol):
    def test(self) -> bool: ...

    def wait(self) -> list[Any]: ...


class Communicator(Protocol):
    rank: int
    size: int
    stats: CommStats

    def start(self, messages: Sequence[Message], name: str) -> Handle: ...


def reduce(communicator: Communicator, messages: Sequence[Message], name: str) -> list[Any]:
    """The messages reduced, blocking: for what runs between steps (probes, agreement, decisions)."""
    return communicator.start(messages, name).wait()


def side_channel(communicator: Communicator) -> Communicator:
    """The communicator with counters of its own, so collectives that carry no gradients (a
    policy's probe and agreement, checkpoints) are not counted as gradient bytes."""
    side = copy.copy(communicator)
    side.stats = CommStats()
    return side
