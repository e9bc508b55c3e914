"""Sparse payloads: chosen coordinates of a flat tensor as (index, value) pairs, allgathered.

Indices travel as an int64 message, values as one of the tensor's dtype; counts may differ by rank. The average
over ``N`` ranks, a coordinate chosen by several ranks adding up their values, is::

    g_avg = scatter_add(indices, values / N)
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from hvdsketch.compress.base import Message, TensorContext
from hvdsketch.compress.support import flat_out
from hvdsketch.ops import backend
from hvdsketch.ops.contract import Ops


def check_fraction(name: str, value: float) -> None:
    """Raise ``ValueError`` unless ``0 < value <= 1``."""
    if not 0 < value <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {value}")


def count(fraction: float, n: int) -> int:
    """How many of ``n`` coordinates a ``fraction`` keeps: ``ceil(fraction * n)``, at least 1."""
    return min(n, max(1, math.ceil(fraction * n)))


def messages(ops: Ops, indices: Any, values: Any) -> list[Message]:
    """The two allgather messages of a sparse payload."""
    return [Message(ops.cast(indices, "int64"), "allgather"), Message(values, "allgather")]


def average(reduced: Sequence[Any], ctx: TensorContext) -> Any:
    """The dense average over ``ctx.world_size`` ranks of allgathered ``(indices, values)``."""
    indices, values = reduced
    ops = backend(values)
    return ops.reshape(ops.scatter_add(math.prod(ctx.shape), indices, values / ctx.world_size,
                                       flat_out(ops, ctx.out)), ctx.shape)
