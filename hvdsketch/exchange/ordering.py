"""Launching rounds in one order on every rank, for communicators that match collectives by order.

Horovod matches collectives by name, so each rank may start its tensors when
their gradients are ready, in whatever order backward produces them. MPI
matches them by the order of calls (:class:`~hvdsketch.collectives.mpi.MPICommunicator`),
and gradient hooks can fire in different orders on different ranks (a
parameter without a gradient on one rank is started only in ``synchronize()``).
So for such a communicator the exchanger launches rounds in a canonical order
that every rank shares: round by round, and within a round tensor by tensor in
the order of :class:`LaunchOrder`'s names::

    (round 0, t_0), (round 0, t_1), ..., (round 0, t_n), (round 1, t_0), ...

A round that is ready is *submitted*; it is launched once every earlier
``(round, tensor)`` of that order has been launched or is known not to exist
(the tensor finished in fewer rounds). Every rank launches the same sequence,
and the earliest round not yet launched only waits for its own tensor's
previous round, which every rank has launched: no rank waits for a collective
another rank has not reached, so the rule cannot deadlock. First rounds stream
out as gradients become ready, in the canonical order; an adapter that knows
the usual order of its gradients (backward: last layer first) gives that order
so the queue rarely holds one back.
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
