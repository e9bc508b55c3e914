"""Bytes on the wire, counted per rank and per collective.

Counts are the exact message sizes where hvdsketch runs the schedule (the MPI layer); for a library's own
collectives, the ring's formulas (:func:`ring_allreduce_bytes`) and :func:`alltoall_bytes`.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, asdict


@dataclass
class Counter:
    calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0


class CommStats:
    """Per-collective counters of one rank, and ``seconds`` per phase of the exchange: ``start`` (on the
    backward path), ``finish`` (the wait before the step) and ``codec`` (compressors and memory, in both)."""

    def __init__(self) -> None:
        self._by_collective: dict[str, Counter] = defaultdict(Counter)
        self.seconds: dict[str, float] = defaultdict(float)

    def record(self, collective: str, sent: int, received: int) -> None:
        counter = self._by_collective[collective]
        counter.calls += 1
        counter.bytes_sent += int(sent)
        counter.bytes_received += int(received)

    @property
    def bytes_sent(self) -> int:
        return sum(c.bytes_sent for c in self._by_collective.values())

    @property
    def bytes_received(self) -> int:
        return sum(c.bytes_received for c in self._by_collective.values())

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {name: asdict(c) for name, c in sorted(self._by_collective.items())}

    def reset(self) -> None:
        self._by_collective.clear()
        self.seconds.clear()


def ring_allreduce_bytes(nbytes: int, size: int) -> int:
    """Bytes one rank sends (and receives) in a ring allreduce of ``nbytes``."""
    return 0 if size <= 1 else 2 * (size - 1) * nbytes // size


def reduce_scatter_bytes(nbytes: int, size: int) -> int:
    """Bytes one rank sends (and receives) in a ring reduce-scatter of ``nbytes``: half an allreduce's."""
    return 0 if size <= 1 else (size - 1) * nbytes // size


def alltoall_bytes(sent: int, kept: int, received: int) -> tuple[int, int]:
    """Bytes one rank sends and receives in an alltoall that sends ``sent`` bytes (its own piece,
    ``kept`` bytes, included: it never leaves the rank) and gets back ``received`` (that piece too)."""
    return sent - kept, received - kept
