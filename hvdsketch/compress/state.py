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

A graph being traced (``tf.function``) runs many steps without Python, so it cannot
hand records back: where one is traced, the table holds the record's arrays in
memory the graph reads and writes at each run (:func:`holding`, a ``tf.Variable`` in
TensorFlow), and the traced exchange writes its next record into that memory
(:func:`written`) instead of giving it back. Eager steps, checkpoints and loads then
read and write the same memory, so the graph and Python never part ways.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from hvdsketch.ops import backend
from hvdsketch.ops.contract import Ops

if TYPE_CHECKING:
    from hvdsketch.compress.base import Compressor

#: Turns a checkpoint's array back into the back-end tensor for the named tensor (its device, say).
Convert = Callable[[str, np.ndarray], Any]


def require_eager(ops: Ops, tensor: Any, method: str) -> None:
    """Raise ``ValueError`` if ``tensor`` is being traced into a graph (``tf.function``): state kept
    in Python would be read once, at tracing, and never advance between steps."""
    if ops.is_symbolic(tensor):
        raise ValueError(f"hvdsketch: {method} keeps per-tensor state between steps in Python, which "
                         f"tf.function would freeze at tracing; run the exchange eagerly (outside tf.function)")


def scratch() -> Any:
    """A state record's field holding memory reused from step to step (``None`` until made): it
    carries nothing the next step needs, so checkpoints leave it out."""
    return dataclasses.field(default=None, compare=False, repr=False, metadata={"scratch": True})


def holds(values: Iterable[Any]) -> bool:
    """Whether any of ``values`` is memory a traced graph keeps (the back-end's ``hold``)."""
    return any(_is_array(v) and backend(v).is_held(v) for v in values)


def holding(ops: Ops, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (eager) with each array in memory a traced graph keeps (ints and ``None`` as they are)."""
    return {key: ops.hold(value) if _is_array(value) else value for key, value in values.items()}


class Undo:
    """The held memory a step writes (:func:`written`, inside :func:`undoable`), with what each held
    before the step's first write, to put back where the step must leave no trace (a loss scaler
    skips it): eagerly, or in a traced graph as a branch of each of its runs."""

    def __init__(self) -> None:
        self._before: dict[int, tuple[Any, Any]] = {}

    def keep(self, held: Any) -> None:
        """Remember what ``held`` holds, before its first write of the step."""
        if id(held) not in self._before:
            self._before[id(held)] = held, backend(held).held_value(held)

    def revert(self) -> None:
        """Write back what every held memory held before the step."""
        for held, value in self._before.values():
            backend(held).assign(held, value)

    def revert_unless(self, flag: Any) -> None:
        """:meth:`revert` where the 0-d truth ``flag`` is false (in a traced graph, at each run)."""
        if self._before:
            held = next(iter(self._before.values()))[0]
            backend(held).unless(flag, self.revert)


_undo: contextvars.ContextVar[Undo | None] = contextvars.ContextVar("hvdsketch_undo", default=None)


@contextlib.contextmanager
def undoable(undo: Undo | None) -> Iterator[None]:
    """Within it, :func:`written` tells ``undo`` (where given) what it overwrites."""
    token = _undo.set(undo)
    try:
        yield
    finally:
        _undo.reset(token)


def written(kept: Mapping[str, Any], new: Mapping[str, Any], what: str) -> dict[str, Any]:
    """``new`` with each array that ``kept`` holds written into that memory, which takes its place.

    Raises ``ValueError`` where the new array's shape or dtype is not the held one's (a graph keeps
    the shapes it was traced with)."""
    out = dict(new)
    for key, old in kept.items():
        if not (_is_array(old) and backend(old).is_held(old)) or new.get(key) is old:
            continue
        ops, value = backend(old), new.get(key)
        if value is None or ops.shape(value) != ops.shape(old) or ops.dtype_name(value) != ops.dtype_name(old):
            given = None if value is None else f"{ops.dtype_name(value)} {ops.shape(value)}"
            raise ValueError(f"hvdsketch: a traced graph keeps {what}'s {key!r} as {ops.dtype_name(old)} "
                             f"{ops.shape(old)}, and a step gave {given}; run the step eagerly")
        undo = _undo.get()
        if undo is not None:
            undo.keep(old)
        ops.assign(old, value)
        out[key] = old
    return out


def _is_array(value: Any) -> bool:
    return value is not None and not isinstance(value, (int, float, str))


def _fields(record: Any) -> dict[str, Any]:
    """A record's fields but its :func:`scratch` ones."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record) if not f.metadata.get("scratch")}


class StateTable:
    """Each tensor's state record, by name, with the compressor that made it."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple["Compressor", Any]] = {}

    def get(self, name: str, compressor: "Compressor") -> Any:
        """The record ``compressor`` left for tensor ``name``, else its initial one (``None`` for a
        method without state)."""
        kept, record = self._entries.get(name, (None, None))
        return record if kept == compressor else compressor.initial_state()

    def _held(self, name: str, compressor: "Compressor") -> Any:
        """Tensor ``name``'s record under ``compressor`` if a traced graph holds its arrays, else ``None``."""
        kept, record = self._entries.get(name, (None, None))
        return record if kept == compressor and record is not None and holds(_fields(record).values()) else None

    def hold(self, name: str, compressor: "Compressor", record: Any, ops: Ops) -> Any:
        """For a graph being traced: ``record`` (eager, tensor ``name``'s under ``compressor``) kept
        with its arrays :func:`holding`; the table's own where it holds them already."""
        held = self._held(name, compressor)
        if held is None:
            held = dataclasses.replace(record, **holding(ops, _fields(record)))
            self._entries[name] = compressor, held
        return held

    def put(self, name: str, compressor: "Compressor", record: Any, traced: bool = False) -> None:
        """Keep ``record`` as tensor ``name``'s state under ``compressor``, its arrays written into
        the memory of a held record. ``traced``: ``record`` is a graph's being traced, of which only
        what is held is kept (written at each run)."""
        held = self._held(name, compressor)
        if held is not None and record is not None:
            record = dataclasses.replace(record, **written(_fields(held), _fields(record),
                                                           f"tensor {name!r}'s {compressor} state"))
        if traced:
            return
        if record is None:
            self.forget(name)
        else:
            self._entries[name] = compressor, record

    def snapshot(self) -> dict[str, tuple["Compressor", Any]]:
        """Every record now, to :meth:`restore` after a step that must leave no trace. No copy:
        records are frozen and an exchange gives back a new one (a held record's memory, written in
        place by a traced graph, is not covered)."""
        return dict(self._entries)

    def restore(self, snapshot: Mapping[str, tuple["Compressor", Any]], only: Iterable[str] | None = None) -> None:
        """Put back the records :meth:`snapshot` took (and drop those made since): every one, or
        ``only`` those of the named tensors."""
        for name in set(snapshot) | set(self._entries) if only is None else only:
            if name in snapshot:
                self._entries[name] = snapshot[name]
            else:
                self._entries.pop(name, None)

    def forget(self, name: str) -> None:
        """Drop tensor ``name``'s record: its compressor starts again from its initial state."""
        self._entries.pop(name, None)

    def clear(self) -> None:
        self._entries.clear()

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """Every record as ``{"compressor": flag, "state": {field: numpy array or int}}`` by name (a
        field that is ``None``, and a :func:`scratch` one, left out)."""
        return {name: {"compressor": str(compressor),
                       "state": {key: _to_numpy(value) for key, value in _fields(record).items() if value is not None}}
                for name, (compressor, record) in self._entries.items()}

    def load_state_dict(self, saved: Mapping[str, Mapping[str, Any]], convert: Convert,
                        create: Callable[[str], "Compressor"]) -> None:
        """Replace every record by :meth:`state_dict`'s: each under the compressor ``create`` makes
        of its flag, its arrays through ``convert`` (ints as ints). A record a traced graph holds is
        written into its memory; raises ``ValueError`` (and loads nothing) where ``saved`` has none
        for it under the compressor the graph keeps."""
        held = {name: (compressor, record) for name, (compressor, record) in self._entries.items()
                if self._held(name, compressor) is not None}
        lacking = sorted(name for name, (compressor, _) in held.items()
                         if saved.get(name, {}).get("compressor") != str(compressor))
        if lacking:
            raise ValueError(f"hvdsketch: a traced graph keeps the state of {lacking} under its compressor, "
                             f"and this checkpoint has none for them under it; load it before the first "
                             f"traced step (or trace anew)")
        self._entries = {}
        for name, entry in saved.items():
            compressor = create(entry["compressor"])
            fields = {key: value if isinstance(value, (int, float)) else convert(name, np.asarray(value))
                      for key, value in entry["state"].items()}
            self._entries[name] = compressor, compressor.State(**fields)
        for name, (compressor, record) in held.items():
            loaded = self._entries[name][1]
            self._entries[name] = compressor, record
            self.put(name, compressor, loaded)


def _to_numpy(value: Any) -> Any:
    """A copy (a record's memory may be updated in place after the checkpoint was taken: DGC's)."""
    if isinstance(value, (int, float)):
        return value
    return np.array(backend(value).to_numpy(value), copy=True)
