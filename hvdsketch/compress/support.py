"""Where a gradient's non-zeros are: row-sparse gradients, and tensors cut into support units.

An embedding's gradient (``nn.Embedding(sparse=True)``, ``tf.IndexedSlices``)
arrives as the rows it touched, :class:`RowSparse`; sparse methods keep it that
way end to end. A :class:`Layout` cuts any tensor into *support units* (rows of
a tensor of rank >= 2, blocks of elements of a vector), the granularity at
which bitmaps mark non-zeros.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Sequence

from hvdsketch.ops import backend


@dataclass(frozen=True)
class RowSparse:
    """A gradient given as distinct row indices and their rows (``nn.Embedding(sparse=True)``,
    ``tf.IndexedSlices``), never materialised dense."""

    indices: Any
    values: Any
    dense_shape: tuple[int, ...]

    def to_dense(self) -> Any:
        """The dense tensor (rows given twice are summed), on the values' device; no host sync."""
        ops = backend(self.values)
        row_len = math.prod(self.dense_shape[1:])
        indices = ops.cast(self.indices, "int64")
        coords = ops.outer_add(indices * row_len, ops.arange(row_len, indices))
        dense = ops.scatter_add(math.prod(self.dense_shape), coords, ops.flatten(self.values))
        return ops.reshape(dense, self.dense_shape)


@dataclass(frozen=True)
class Layout:
    """How a tensor of ``numel`` elements splits into ``units`` support units of ``unit_len``."""

    numel: int
    units: int
    unit_len: int

    @classmethod
    def of(cls, shape: Sequence[int], block: int) -> "Layout":
        numel = math.prod(shape)
        if len(shape) >= 2 and shape[0] > 0:
            return cls(numel, shape[0], numel // shape[0])
        return cls(numel, -(-numel // block), block)

    def coordinates(self, ops: ModuleType, units: Any) -> Any:
        """Flat indices of every element of the given int64 ``units``, on their device (a host sync
        only where the last unit is partial: how many of its coordinates exist depends on the units)."""
        coords = ops.outer_add(units * self.unit_len, ops.arange(self.unit_len, units))
        if self.units * self.unit_len == self.numel:
            return coords
        return ops.where_less(coords, self.numel)


def values_of(tensor: Any) -> Any:
    """The values of a dense or row-sparse gradient (what has a dtype and a device)."""
    return tensor.values if isinstance(tensor, RowSparse) else tensor
