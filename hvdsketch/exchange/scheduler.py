"""The flights of one step: each round sent as soon as it may go, each reduction handed back as it lands.

Rounds are named ``{prefix}.{tensor}.r{round}`` alike on every rank; :meth:`Scheduler.wait_all` waits round
``k`` of every flight before round ``k + 1`` of any, so the rounds of many tensors travel together. Under
``communicator.ordered`` rounds wait in a :class:`~hvdsketch.exchange.ordering.LaunchOrder`.
"""
from __future__ import annotations

from typing import Any, Callable, ContextManager

from hvdsketch.collectives import Communicator, Handle
from hvdsketch.exchange.flight import Flight
from hvdsketch.exchange.ordering import LaunchOrder

#: The handle of a round waiting in the launch order's queue.
QUEUED = object()


class Scheduler:
    """Sends and waits for the rounds of one step's flights over ``communicator``; ``placement(name)`` is
    the context of tensor ``name``'s work, ``waiting_for`` what the last blocking wait was for."""

    def __init__(self, communicator: Communicator, prefix: str,
                 placement: Callable[[str], ContextManager[Any]]) -> None:
        self.communicator, self.prefix, self.placement = communicator, prefix, placement
        self.waiting_for = ""
        self._flights: dict[str, tuple[Flight, Any]] = {}  # handle None: done; QUEUED: not launched yet
        self._launch: LaunchOrder | None = None

    @property
    def names(self) -> list[str]:
        """The tensors whose exchange started this step."""
        return list(self._flights)

    def __contains__(self, name: str) -> bool:
        return name in self._flights

    def __len__(self) -> int:
        return len(self._flights)

    def begin(self, order: list[str] | None) -> None:
        """A step's first flight is coming: launch in ``order`` where the communicator needs one."""
        self._launch = LaunchOrder(order) if order is not None and getattr(self.communicator, "ordered", False) \
            else None

    def wait(self, handle: Handle, waiting_for: str) -> list[Any]:
        """``handle.wait()``, blocking in the communicator, remembering what for."""
        self.waiting_for = waiting_for
        return handle.wait()

    def submit(self, name: str, flight: Flight) -> None:
        """Send ``flight``'s current round (in a launch order, once it allows), then keep its residual."""
        self._queue(name, flight)
        flight.settle()

    def progress(self) -> None:
        """Move on, without blocking, every flight whose early round (one settling nothing yet) has landed."""
        for name, (flight, handle) in list(self._flights.items()):
            if handle not in (None, QUEUED) and flight.round.residual is None and handle.test():
                self._advance(name, flight, handle.wait())

    def wait_all(self) -> dict[str, Any]:
        """Every flight of the step to its end; their results by name."""
        if self._launch is not None:
            self._in_order()
        while any(handle is not None for _, handle in self._flights.values()):
            for name, (flight, handle) in list(self._flights.items()):
                if handle is not None:
                    self._advance(name, flight, self.wait(handle, name))
        return {name: flight.result for name, (flight, _) in self._flights.items()}

    def complete(self, name: str) -> Any:
        """Drive ``name``'s flight to its end now and return its result (outside a launch order only)."""
        if self._launch is not None:
            raise RuntimeError("hvdsketch: a tensor exchanged in a launch order cannot be completed alone")
        flight, handle = self._flights[name]
        while handle is not None:
            self._advance(name, flight, self.wait(handle, name))
            flight, handle = self._flights[name]
        return flight.result

    def codec_seconds(self) -> float:
        """The time this step's flights spent in their compressors and memories."""
        return sum(flight.seconds for flight, _ in self._flights.values())

    def clear(self) -> None:
        """Forget this step's flights (ended, or broken off: their rounds never finish)."""
        self._flights.clear()
        self._launch = None

    def _queue(self, name: str, flight: Flight) -> None:
        if self._launch is None:
            self._flights[name] = (flight, self._send_round(flight))
            return
        self._flights[name] = (flight, QUEUED)
        self._launch.submit(name, flight.index, lambda: self._flights.__setitem__(name, (flight, self._send_round(flight))))

    def _send_round(self, flight: Flight) -> Handle:
        return self.communicator.start(flight.messages, f"{self.prefix}.{flight.ctx.name}.r{flight.index}")

    def _advance(self, name: str, flight: Flight, reduced: list[Any]) -> None:
        """Give ``flight`` its round's reduction and send its next round, if any."""
        with self.placement(name):
            if flight.advance(reduced):
                self._flights[name] = (flight, None)
                if self._launch is not None:
                    self._launch.finished(name, flight.index + 1)
            else:
                self.submit(name, flight)

    def _in_order(self) -> None:
        """Wait, round by round in the launch order, for the round the order is held at."""
        missing = [name for name in self._launch.names if name not in self._flights]
        if missing:
            raise RuntimeError(f"hvdsketch: {len(missing)} expected tensor(s) were not started this step "
                               f"({', '.join(missing[:3])}); every rank must exchange the same tensors")
        while not self._launch.done:
            name = self._launch.blocker
            flight, handle = self._flights[name]
            self._advance(name, flight, self.wait(handle, name))
