"""Communicators: move a compressor's messages between ranks.

A communicator has ``rank``, ``size``, ``stats`` (:class:`~hvdsketch.collectives.stats.CommStats`)
and ``reduce(messages) -> list``, which reduces each
:class:`~hvdsketch.compress.Message` by its ``op``, fusing messages of one op
into one collective. :mod:`.horovod` uses Horovod's collectives (NCCL and tensor
fusion on GPUs); :mod:`.mpi` is hvdsketch's own mpi4py layer.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence

from hvdsketch.collectives.stats import CommStats
from hvdsketch.compress.base import Message


class Communicator(Protocol):
    rank: int
    size: int
    stats: CommStats

    def reduce(self, messages: Sequence[Message]) -> list[Any]: ...
