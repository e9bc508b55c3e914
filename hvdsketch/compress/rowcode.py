"""A sorted set of unit indices as bytes: a packed bitmap or sorted deltas, whichever is smaller.

Over ``n`` units, a bitmap costs ``ceil(n / 8)`` bytes, ``k`` sorted indices as deltas ``k * w`` bytes (``w`` of
1, 2, 4 or 8 holding the largest gap). A two-number header ``[kind, count]`` says which (kind 0: bitmap; else the
delta width); both travel as ``uint8``::

    deltas = units - [0, units[:-1]]        units = cumsum(deltas)
    bytes  = little-endian base-256 digits of each delta, w a delta
"""
from __future__ import annotations

from typing import Any

from hvdsketch.ops.contract import Ops

BITMAP = 0
#: Byte widths a delta may take.
WIDTHS = (1, 2, 4, 8)


def size(kind: int, count: int, n: int) -> int:
    """Bytes of the code described by the header ``[kind, count]`` over ``n`` units."""
    return -(-n // 8) if kind == BITMAP else count * kind


def encode(ops: Ops, units: Any, n: int) -> tuple[tuple[int, int], Any]:
    """``((kind, count), code)``: the sorted int64 ``units`` (of ``n``) as the smaller code, ``uint8``
    on their device (a host sync: the largest gap sets the width)."""
    count = ops.shape(units)[0]
    deltas = units - ops.concat([ops.zeros(1, "int64", units), units[:-1]]) if count else units
    largest = int(ops.to_numpy(ops.reduce_max(deltas))) if count else 0
    width = next(w for w in WIDTHS if w == 8 or largest < 256 ** w)
    if size(BITMAP, count, n) <= count * width:
        return (BITMAP, count), ops.pack_bits(ops.indicator(n, units, "uint8"))
    digits = [(deltas // 256 ** j) % 256 for j in range(width)]
    return (width, count), ops.cast(ops.flatten(ops.transpose(ops.stack(digits))), "uint8")


def decode(ops: Ops, kind: int, count: int, code: Any, n: int) -> Any:
    """The sorted int64 units a code of :func:`encode` holds (a host sync for a bitmap's count)."""
    if kind == BITMAP:
        return ops.positive(ops.unpack_bits(code)[:n])
    digits = ops.reshape(ops.cast(code, "int64"), (count, kind))
    scale = ops.constant([256 ** j for j in range(kind)], "int64", like=digits)
    return ops.cumsum(ops.reduce_sum(digits * scale, axis=1))
