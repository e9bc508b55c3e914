"""State a compressor keeps between steps, per tensor name.

Compressors are frozen dataclasses whose fields are the flag's options; what
they must remember (DGC's velocity, PowerSGD's warm-start Q, an error-feedback
residual) lives in fields made by :func:`private_state`, which stay out of the
constructor, ``repr``, ``==`` and the flag. Each rank's compressor object holds
its own state.
"""
from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any, Callable


def private_state(factory: Callable[[], Any] = dict) -> Any:
    """A dataclass field holding per-tensor state, not an option."""
    return dataclasses.field(default_factory=factory, init=False, compare=False, repr=False)


def require_eager(ops: ModuleType, tensor: Any, method: str) -> None:
    """Raise ``ValueError`` if ``tensor`` is being traced into a graph (``tf.function``): state kept
    in Python would be read and written once, at tracing, and never advance between steps."""
    if ops.is_symbolic(tensor):
        raise ValueError(f"hvdsketch: {method} keeps per-tensor state between steps in Python, which "
                         f"tf.function would freeze at tracing; run the exchange eagerly (outside tf.function)")


class LocalResidual:
    """A compressor's own error-feedback memory (a :class:`~hvdsketch.compress.base.ResidualMemory`):
    one full-precision residual per tensor name, ``e = compensated - estimate``.

    Methods whose error feedback is part of the algorithm (DGC's accumulation,
    PowerSGD's and EF-SignSGD's residual) use it when no memory is passed to
    :meth:`~hvdsketch.compress.base.Compressor.exchange`.
    """

    def __init__(self) -> None:
        self._residuals: dict[str, Any] = {}

    def compensate(self, name: str, tensor: Any) -> Any:
        residual = self._residuals.get(name)
        return tensor if residual is None else tensor + residual

    def update(self, name: str, compensated: Any, estimate: Any) -> None:
        self._residuals[name] = compensated - estimate
