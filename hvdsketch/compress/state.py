"""What a compressor remembers of a tensor between steps, kept in one table per driver of exchanges.

Compressors are stateless values: frozen dataclasses whose fields are the flag's
options, equal when their flags are. A method that must remember something of a
tensor (PowerSGD's warm-start Q, DGC's momentum, the sketch's sizing level)
declares a small frozen record class as its ``State``, as PyTorch's
``PowerSGDState`` does for its hook. An exchange reads its tensor's record from
the context (``ctx.state``) and gives the next one back with its result
(:mod:`hvdsketch.compress.base`). A :class:`StateTable` keeps one record per
tensor name with the compressor that made it: a tensor handed to another
compressor (``auto`` deciding again) starts that one's state afresh, and two
optimizers (two tables) given one compressor never share a tensor's state. The
table's :meth:`~StateTable.state_dict` carries the records through a checkpoint
as numpy arrays and ints, so a resumed run continues as the uninterrupted one;
a :func:`scratch` field (memory a method writes every step instead of making it
anew, such as fp16's wire buffer) is left out of it and starts empty.
"""
from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

if TYPE_CHECKING:
    from hvdsketch.compress.base import Compressor

#: Turns a checkpoint's array back into the back-end tensor for the named tensor (its device, say).
Convert = Callable[[str, np.ndarray], Any]


def require_eager(ops: ModuleType, tensor: Any, method: str) -> None:
    """Raise ``ValueError`` if ``tensor`` is being traced into a graph (``tf.function``): state kept
    in Python would be read once, at tracing, and never advance between steps."""
    if ops.is_symbolic(tensor):
        raise ValueError(f"hvdsketch: {method} keeps per-tensor state between steps in Python, which "
                         f"tf.function would freeze at tracing; run the exchange eagerly (outside tf.function)")


def scratch() -> Any:
    """A state record's field holding memory reused from step to step (``None`` until made): it
    carries nothing the next step needs, so checkpoints leave it out."""
    return dataclasses.field(default=None, compare=False, repr=False, metadata={"scratch": True})


@dataclasses.dataclass
class _Entry:
    #: The compressor whose record this is; ``None`` for one loaded from a checkpoint and not yet met,
    #: whose ``saved`` fields (numpy arrays, ints) wait for the compressor of ``flag``.
    compressor: "Compressor | None"
    record: Any = None
    flag: str = ""
    saved: Mapping[str, Any] | None = None
    convert: Convert | None = None


class StateTable:
    """Each tensor's state record, by name, with the compressor that made it."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def get(self, name: str, compressor: "Compressor") -> Any:
        """The record ``compressor`` left for tensor ``name``, else its initial one (``None`` for a
        method without state)."""
        entry = self._entries.get(name)
        if entry is not None and entry.compressor is None and entry.flag == str(compressor):
            fields = {key: _from_numpy(name, value, entry.convert) for key, value in entry.saved.items()}
            entry.compressor, entry.record = compressor, compressor.State(**fields)
        if entry is not None and entry.compressor == compressor:
            return entry.record
        return compressor.initial_state()

    def put(self, name: str, compressor: "Compressor", record: Any) -> None:
        """Keep ``record`` as tensor ``name``'s state under ``compressor``."""
        if record is None:
            self._entries.pop(name, None)
        else:
            self._entries[name] = _Entry(compressor, record)

    def clear(self) -> None:
        self._entries.clear()

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """Every record as ``{"compressor": flag, "state": {field: numpy array or int}}`` by name (a
        field that is ``None``, and a :func:`scratch` one, left out)."""
        saved = {}
        for name, entry in self._entries.items():
            if entry.compressor is None:  # loaded, not met since: as it was saved
                saved[name] = {"compressor": entry.flag, "state": dict(entry.saved)}
                continue
            fields = {f.name: getattr(entry.record, f.name) for f in dataclasses.fields(entry.record)
                      if not f.metadata.get("scratch")}
            saved[name] = {"compressor": str(entry.compressor),
                           "state": {key: _to_numpy(value) for key, value in fields.items() if value is not None}}
        return saved

    def load_state_dict(self, saved: Mapping[str, Mapping[str, Any]], convert: Convert) -> None:
        """Replace every record by :meth:`state_dict`'s. Each record is made when its tensor first
        meets the compressor it was saved under (ints as ints, arrays through ``convert``); a tensor
        that meets another starts afresh."""
        self._entries = {name: _Entry(None, flag=entry["compressor"], saved=dict(entry["state"]), convert=convert)
                         for name, entry in saved.items()}


def _to_numpy(value: Any) -> Any:
    """A copy (a record's memory may be updated in place after the checkpoint was taken: DGC's)."""
    if isinstance(value, (int, float)):
        return value
    from hvdsketch.ops import backend

    return np.array(backend(value).to_numpy(value), copy=True)


def _from_numpy(name: str, value: Any, convert: Convert) -> Any:
    return value if isinstance(value, (int, float)) else convert(name, np.asarray(value))
