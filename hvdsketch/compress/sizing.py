"""Sizes every rank agrees on without a round: from the previous step's reduced result, equal on every rank.

Sizes are *levels*: a bound of ``ceil(grow^level)`` units, the smallest level above ``headroom`` times the count
seen. A level rises as soon as the count outgrows it and falls only when it is two levels below, so message sizes
repeat across steps. A tensor not worth sending sparse is *latched* dense for ``recheck`` exchanges, the last of
which counts its dense result's units again.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


def level_of(count: float, headroom: float, grow: float) -> int:
    """The smallest level whose bound holds ``headroom * count`` (at least one unit)."""
    return max(0, math.ceil(math.log(max(count * headroom, 1.0)) / math.log(grow) - 1e-9))


def bound_of(level: int, grow: float, cap: int) -> int:
    """Units a plan at ``level`` is sized for, at most ``cap``."""
    return min(cap, math.ceil(grow ** level - 1e-9))


def next_level(level: int | None, count: float, headroom: float, grow: float) -> int:
    """The level after seeing ``count``: up at once, down only past one level of slack."""
    needed = level_of(count, headroom, grow)
    return needed if level is None or needed > level or needed < level - 1 else level


@dataclass(frozen=True)
class LatchState:
    """What a method that may latch a tensor dense remembers of it between steps."""

    #: Exchanges left that go dense at once (0: not latched).
    dense_for: int = 0


def latched(dense_for: int) -> tuple[bool, bool]:
    """``(dense, learn)`` with ``dense_for`` latched exchanges left: whether to go dense, and whether to count."""
    return dense_for > 0, dense_for == 1


def release(dense_for: int, dense_next: bool, recheck: int) -> int:
    """Latched exchanges left after this one: one fewer, or ``recheck`` where ``dense_next`` latches it anew."""
    if dense_for > 1:
        return dense_for - 1
    return recheck if dense_next else 0


#: A union more than this many times its plan's bound is warned about, once per tensor.
OVERFLOW = 2.0

#: Bytes per element of the dtypes values travel in.
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8, "uint8": 1}
#: The formats values may travel in (``wire=`` of the sparse methods); unset: the tensor's own dtype.
WIRES = ("float16", "bfloat16", "float32")


def check_wire(wire: str | None) -> None:
    """Raise ``ValueError`` unless ``wire`` is ``None`` or one of :data:`WIRES`."""
    if wire is not None and wire not in WIRES:
        raise ValueError(f"wire must be one of {', '.join(WIRES)}, got {wire!r}")
