"""State a compressor keeps between steps, per tensor name.

Compressors are frozen dataclasses whose fields are the flag's options; what
they must remember (DGC's velocity, PowerSGD's warm-start Q) lives in fields
made by :func:`private_state`, which stay out of the constructor, ``repr``,
``==`` and the flag. Each rank's compressor object holds
its own state, and :func:`export_state` / :func:`import_state` carry it through
a checkpoint as numpy arrays, so a resumed run continues as the uninterrupted one.
"""
from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any, Callable, Mapping

import numpy as np

#: Turns a checkpoint's array back into the back-end tensor for the named tensor (its device, say).
Convert = Callable[[str, np.ndarray], Any]


def private_state(factory: Callable[[], Any] = dict) -> Any:
    """A dataclass field holding per-tensor state, not an option."""
    return dataclasses.field(default_factory=factory, init=False, compare=False, repr=False)


def require_eager(ops: ModuleType, tensor: Any, method: str) -> None:
    """Raise ``ValueError`` if ``tensor`` is being traced into a graph (``tf.function``): state kept
    in Python would be read and written once, at tracing, and never advance between steps."""
    if ops.is_symbolic(tensor):
        raise ValueError(f"hvdsketch: {method} keeps per-tensor state between steps in Python, which "
                         f"tf.function would freeze at tracing; run the exchange eagerly (outside tf.function)")


def _per_name(compressor: Any) -> dict[str, dict[str, Any]]:
    """The compressor's private-state fields, each as its dict of tensor name -> value."""
    return {f.name: getattr(compressor, f.name) for f in dataclasses.fields(compressor) if not f.init and not f.compare}


def export_state(compressor: Any) -> dict[str, dict[str, np.ndarray]]:
    """The compressor's private state as numpy arrays, by field and tensor name (empty fields left out)."""
    from hvdsketch.ops import backend

    def to_numpy(value: Any) -> np.ndarray:
        return np.asarray(value) if isinstance(value, (int, float)) else backend(value).to_numpy(value)

    return {field: {name: to_numpy(v) for name, v in state.items()}
            for field, state in _per_name(compressor).items() if state}


def import_state(compressor: Any, state: Mapping[str, Mapping[str, np.ndarray]], convert: Convert) -> None:
    """Replace the compressor's private state by :func:`export_state`'s; counters (0-d integer arrays)
    come back as ints, tensors through ``convert``."""
    fields = _per_name(compressor)
    unknown = set(state) - set(fields)
    if unknown:
        raise ValueError(f"hvdsketch: {compressor} keeps no state {sorted(unknown)} (a checkpoint of another method?)")
    for field, target in fields.items():
        target.clear()
        for name, array in state.get(field, {}).items():
            array = np.asarray(array)
            counter = array.ndim == 0 and np.issubdtype(array.dtype, np.integer)
            target[name] = int(array) if counter else convert(name, array)
