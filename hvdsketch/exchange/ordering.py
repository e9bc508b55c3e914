"""Launching rounds in one order on every rank, for communicators that match collectives by order.

MPI (:class:`~hvdsketch.collectives.mpi.MPICommunicator`) matches collectives by call order, and gradient
hooks can fire in different orders on different ranks, so rounds launch in one order (:class:`LaunchOrder`)::

    (round 0, t_0), (round 0, t_1), ..., (round 0, t_n), (round 1, t_0), ...

A submitted round launches once every earlier ``(round, tensor)`` has launched or cannot exist. The earliest
unlaunched round waits only for its tensor's previous round, launched on every rank: it cannot deadlock.
"""
from __future__ import annotations

from typing import Callable, Sequence


class LaunchOrder:
    """The canonical launch order of one step's rounds over ``names``."""

    def __init__(self, names: Sequence[str]) -> None:
        if len(set(names)) != len(names):
            raise ValueError("hvdsketch: the launch order names a tensor twice")
        self.names = list(names)
        self.round = self.position = 0
        self._queued: dict[str, tuple[int, Callable[[], None]]] = {}
        self._rounds: dict[str, int] = {}  # finished tensor -> its number of rounds

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def submit(self, name: str, round_index: int, launch: Callable[[], None]) -> None:
        """``launch()`` starts round ``round_index`` of ``name``: call it when the order allows."""
        if name not in self.names:
            raise RuntimeError(f"hvdsketch: {name!r} is not one of the tensors this step exchanges in order "
                               f"({len(self.names)} expected); every rank must exchange the same tensors")
        self._queued[name] = (round_index, launch)
        self._pump()

    def finished(self, name: str, rounds: int) -> None:
        """``name``'s exchange ended after ``rounds`` rounds: it holds no later round back."""
        self._rounds[name] = rounds
        self._pump()

    @property
    def done(self) -> bool:
        return len(self._rounds) == len(self.names)

    @property
    def blocker(self) -> str:
        """The tensor whose next round the order waits for (its previous round, in flight, or its start)."""
        return self.names[self.position]

    def _pump(self) -> None:
        while not self.done:
            name = self.names[self.position]
            queued = self._queued.get(name)
            if queued is not None and queued[0] == self.round:
                del self._queued[name]
                queued[1]()
            elif self._rounds.get(name, self.round + 1) > self.round:
                return  # this tensor's round is not ready yet: everything after it waits
            self.position += 1
            if self.position == len(self.names):
                self.round, self.position = self.round + 1, 0
