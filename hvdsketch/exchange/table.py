"""Every tensor's state kept between steps, in one table: its compressor's record and its residual.

A tensor's record (PowerSGD's ``Q``, DGC's velocity, the sketch's sizing) is kept by name in a
:class:`~hvdsketch.compress.state.StateTable`; its residual in the user's
:class:`~hvdsketch.memory.Memory` (the plan: name to store), or, without one, in the float32 store of a
method whose error feedback is its own (:attr:`~hvdsketch.compress.Compressor.feedback`). The table
snapshots, restores, saves and loads them together.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from hvdsketch.compress import Compressor
from hvdsketch.compress.state import Convert, StateTable
from hvdsketch.memory import Memory
from hvdsketch.memory.residual import Snapshot
from hvdsketch.memory.stores import Fp32


@dataclasses.dataclass(frozen=True)
class Kept:
    """The table at one moment (:meth:`TensorTable.snapshot`): no copies (records and residuals are
    replaced, never written in place, eagerly)."""

    records: dict[str, Any]
    residuals: tuple[Snapshot, ...]  # each of :attr:`TensorTable.memories`'s, in order


class TensorTable:
    """Each tensor's compressor record and residual.

    Args:
        memory: the residual memory of every tensor, or ``None``: then only methods with their own error
            feedback keep residuals, in float32.
    """

    def __init__(self, memory: Memory | None) -> None:
        self.memory = memory
        self.records = StateTable()
        self._own = Memory(default=Fp32(), spec="fp32")

    def memory_for(self, compressor: Compressor) -> Memory | None:
        """Where ``compressor``'s residuals are kept (``None``: nowhere)."""
        if self.memory is not None:
            return self.memory
        return self._own if compressor.feedback else None

    @property
    def memories(self) -> list[Memory]:
        return [m for m in (self.memory, self._own) if m is not None]

    def residual_bytes(self) -> int:
        """Bytes of every residual kept, on the tensors' devices and on the host."""
        return sum(m.nbytes() + m.host_nbytes() for m in self.memories)

    def snapshot(self) -> Kept:
        return Kept(self.records.snapshot(), tuple(m.snapshot() for m in self.memories))

    def restore(self, kept: Kept, only: Mapping[str, tuple[int, ...]] | None = None, records: bool = True) -> None:
        """Put back what :meth:`snapshot` took: every tensor's state, or that of the tensors ``only``
        maps to their dense shapes; without ``records``, their residuals alone."""
        if records:
            self.records.restore(kept.records, None if only is None else list(only))
        for memory, residuals in zip(self.memories, kept.residuals):
            memory.restore(residuals, only)

    def state_dict(self, residuals: bool = True) -> dict[str, Any]:
        """The records (``"states"``) and both memories as numpy arrays and plain values; without
        ``residuals``, the memories' plans alone."""
        return {"states": self.records.state_dict() if residuals else {},
                "memory": None if self.memory is None else self.memory.state_dict(residuals),
                "own_memory": self._own.state_dict(residuals)}

    def load_state_dict(self, state: Mapping[str, Any], convert: Convert, create: Callable[[str], Compressor]) -> None:
        """Replace every record and residual by :meth:`state_dict`'s: what ``state`` leaves out starts afresh."""
        self.records.load_state_dict(state.get("states") or {}, convert, create)
        for memory, key in ((self.memory, "memory"), (self._own, "own_memory")):
            if memory is not None:
                memory.load_state_dict(state.get(key) or memory.state_dict(residuals=False))


__all__ = ["Kept", "TensorTable"]
