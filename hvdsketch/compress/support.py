"""Where a gradient's non-zeros are: row-sparse gradients (:class:`RowSparse`), and tensors cut into support units.

A :class:`Layout` cuts a tensor into *support units* (rows of a tensor of rank >= 2, blocks of a vector);
:func:`units_of` finds a gradient's non-zero units, :func:`from_units` puts units back into a tensor.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from hvdsketch.ops import backend
from hvdsketch.ops.contract import Ops


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


def is_passthrough(tensor: Any) -> bool:
    """Integer and empty tensors are averaged as they are: there is nothing to compress."""
    if isinstance(tensor, RowSparse):
        return False
    ops = backend(tensor)
    return not ops.is_floating(tensor) or 0 in ops.shape(tensor)


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

    @property
    def ragged(self) -> bool:
        """True when the last unit is shorter than the others (a vector not a multiple of the block)."""
        return self.units * self.unit_len != self.numel

    def coordinates(self, ops: Ops, units: Any) -> Any:
        """Flat indices of every element of the int64 ``units`` (a host sync where the last unit is partial)."""
        coords = ops.outer_add(units * self.unit_len, ops.arange(self.unit_len, like=units))
        return ops.where_less(coords, self.numel) if self.ragged else coords

    def matrix(self, ops: Ops, flat: Any) -> Any:
        """The flat tensor as ``units x unit_len``, zero-padded if ragged (a view when it is not)."""
        if self.ragged:
            flat = ops.pad(flat, self.units * self.unit_len - self.numel)
        return ops.reshape(flat, (self.units, self.unit_len))


def units_of(tensor: Any, layout: Layout) -> tuple[Ops, Any, Any]:
    """``(ops, units, values)``: the sorted int64 indices of the non-zero units of ``tensor`` (dense or
    :class:`RowSparse`, coalesced) and their values as a ``len(units) x unit_len`` matrix, zero-padded."""
    if isinstance(tensor, RowSparse):
        ops = backend(tensor.values)
        units, values = ops.coalesce_rows(tensor.indices, tensor.values)
        return ops, units, ops.reshape(values, (-1, layout.unit_len))
    ops = backend(tensor)
    matrix = layout.matrix(ops, ops.flatten(tensor))
    units = ops.nonzero_rows(matrix)
    return ops, units, ops.gather(matrix, units)


def count_units(tensor: Any, layout: Layout) -> int:
    """How many units of the dense ``tensor`` hold a non-zero (a host sync)."""
    ops = backend(tensor)
    return ops.shape(ops.nonzero_rows(layout.matrix(ops, ops.flatten(tensor))))[0]


def from_units(ops: Ops, layout: Layout, units: Any, values: Any, shape: Sequence[int],
               row_sparse: bool, out: Any = None, source: Any = None) -> Any:
    """The tensor of ``shape`` holding ``values`` (``len(units) x unit_len``) at ``units``, zero elsewhere: a
    :class:`RowSparse` when ``row_sparse`` and the units are rows, else dense, written into ``out`` when given
    and not ragged. Where ``out`` is the memory of ``source`` (the dense tensor sent), only ``units`` are written."""
    if row_sparse and len(shape) >= 2:
        return RowSparse(units, ops.reshape(values, (-1, *shape[1:])), tuple(shape))
    coords = ops.outer_add(units * layout.unit_len, ops.arange(layout.unit_len, like=units))
    into = None if layout.ragged else flat_out(ops, out)
    clean = into is not None and source is not None and not isinstance(source, RowSparse) and ops.same_memory(out, source)
    flat = ops.scatter(layout.units * layout.unit_len, coords, ops.flatten(values), into, clear=not clean)
    return ops.reshape(flat[:layout.numel] if layout.ragged else flat, shape)


def flat_out(ops: Ops, out: Any) -> Any:
    """``out`` (a result's memory, :attr:`TensorContext.out`) as the vector a scatter writes into."""
    return None if out is None else ops.reshape(out, (-1,))


def values_of(tensor: Any) -> Any:
    """The values of a dense or row-sparse gradient (what has a dtype and a device)."""
    return tensor.values if isinstance(tensor, RowSparse) else tensor
