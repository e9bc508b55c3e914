"""Exact sparse exchange over the union: OR the bitmaps, then average exactly the union's units.

OmniReduce's idea (Fei et al., SIGCOMM 2021). Round one ORs the ranks' packed bitmaps of non-zero units; round
two averages one ``U x unit_len`` buffer, each rank's units at their union positions and zeros elsewhere::

    union = OR_r bitmap_r           position(u) = rank of u in union
    g_avg[union] = mean_r buffer_r                  (exact: the dense average on the union)

``error > 1`` sends a count sketch of the union in round two instead (:mod:`hvdsketch.compress.sketch`). A tensor
whose union is every unit is sent dense, without the bitmap round, for the next ``recheck`` exchanges.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from hvdsketch.compress import sizing
from hvdsketch.compress.allgather import lossy_residual
from hvdsketch.compress.base import Compressor, Exchange, Message, Round, TensorContext
from hvdsketch.compress.hashing import HashFamily
from hvdsketch.compress.sketch import hash_units, recover, sketch_cells
from hvdsketch.compress.support import Layout, RowSparse, count_units, from_units, units_of, values_of
from hvdsketch.ops import backend


@dataclass(frozen=True)
class Union(Compressor):
    """OR the ranks' bitmaps, then average the union's units exactly (or a sketch of them, ``error > 1``).

    Options (flag ``union:key=value,...``):
      wire     values (or cells) travel as float16, bfloat16 or float32 (default: the tensor's dtype)
      error    unset (default): exact; > 1: a count sketch of the union at this relative L2 error
      rows     hash rows of that sketch (default 1)
      block    elements per unit for vectors (default 256)
      seed     base hash seed of that sketch (default 0)
      recheck  exchanges a tensor whose union is every unit goes dense, without the bitmap round (default 16)
    """

    name: ClassVar[str] = "union"
    row_sparse: ClassVar[bool] = True
    State: ClassVar[type] = sizing.LatchState

    wire: str | None = None
    error: float | None = None
    rows: int = 1
    block: int = 256
    seed: int = 0
    recheck: int = 16

    def __post_init__(self) -> None:
        sizing.check_wire(self.wire)
        if self.error is not None and not self.error > 1:
            raise ValueError("error must be > 1 (a sketch after the union round is only worth it when smaller "
                             "than the union's values; leave it unset for the exact union)")
        if self.rows < 1:
            raise ValueError("rows must be >= 1")
        if self.block < 1:
            raise ValueError("block must be >= 1")
        if self.recheck < 1:
            raise ValueError("recheck must be >= 1")

    def exchange(self, tensor: Any, ctx: TensorContext) -> Exchange:
        values = values_of(tensor)
        ops, dtype = backend(values), backend(values).dtype_name(values)
        layout = Layout.of(ctx.shape, self.block)
        dense_for = ctx.state.dense_for
        dense, learn = sizing.latched(dense_for)
        if dense:
            whole = tensor.to_dense() if isinstance(tensor, RowSparse) else tensor
            (reduced,) = yield Round([Message(ops.flatten(whole), "average")], lambda: None)
            result = ops.reshape(reduced, ctx.shape)
            full = learn and not ops.is_symbolic(result) and count_units(result, layout) == layout.units
            return result, sizing.LatchState(sizing.release(dense_for, full, self.recheck))
        messages, (units, unit_values) = self.compress(tensor, ctx)
        union = self.decompress((yield Round(messages)), units, ctx)
        count = ops.shape(union)[0]
        if self.error is None:
            result = yield from self._values(ctx, layout, units, unit_values, union, count, dtype)
        else:
            result = yield from self._sketch(ctx, layout, units, unit_values, union, count, dtype)
        full = not ops.is_symbolic(union) and self.error is None and count == layout.units
        return (from_units(ops, layout, union, result, ctx.shape, isinstance(tensor, RowSparse), ctx.out, tensor),
                sizing.LatchState(sizing.release(dense_for, full, self.recheck)))

    def _values(self, ctx: TensorContext, layout: Layout, units: Any, values: Any, union: Any, count: Any,
                dtype: str) -> Exchange:
        """Round two, exact: each rank's units at their union positions, averaged."""
        ops = backend(values)
        position = ops.gather(ops.scatter(layout.units, union, ops.arange(count, like=union)), units)
        sent = ops.cast(values, self.wire or dtype)
        coords = ops.outer_add(position * layout.unit_len, ops.arange(layout.unit_len, like=units))
        buffer = ops.scatter(count * layout.unit_len, coords, ops.flatten(sent))
        residual = (lambda: None) if (self.wire or dtype) == dtype else (
            lambda: lossy_residual(ops, layout, units, values, sent, ctx.shape))
        (reduced,) = yield Round([Message(buffer, "average")], residual)
        return ops.reshape(ops.cast(reduced, dtype), (-1, layout.unit_len))

    def _sketch(self, ctx: TensorContext, layout: Layout, units: Any, values: Any, union: Any, count: int,
                dtype: str) -> Exchange:
        """Round two, ``error > 1``: a count sketch sized for the union every rank now knows."""
        ops = backend(values)
        cols = max(1, math.ceil(count * layout.unit_len / self.error**2))
        hashes = HashFamily.draw(self.rows, cols, self.seed, ctx.name, ctx.step)
        hashed = hash_units(ops, hashes, layout, units, dtype)
        cells = ops.cast(sketch_cells(ops, cols, hashed, values), self.wire or dtype)

        def residual() -> Any:
            own = recover(ops, cols, hashed, ops.cast(cells, dtype), layout.unit_len)
            return from_units(ops, layout, units, values - own, ctx.shape, row_sparse=True)

        (reduced,) = yield Round([Message(cells, "average")], residual)
        return recover(ops, cols, hash_units(ops, hashes, layout, union, dtype), ops.cast(reduced, dtype),
                       layout.unit_len)

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], tuple[Any, Any]]:
        """Round one: this rank's bitmap of non-zero units, packed; it keeps its units and values."""
        layout = Layout.of(ctx.shape, self.block)
        ops, units, values = units_of(tensor, layout)
        return [Message(ops.pack_bits(ops.indicator(layout.units, units, "uint8")), "bor")], (units, values)

    def decompress(self, reduced: Any, local: Any, ctx: TensorContext) -> Any:
        """The union round one's reduction shows: sorted int64 unit indices (round two follows)."""
        ops = backend(reduced[0])
        return ops.positive(ops.unpack_bits(reduced[0])[:Layout.of(ctx.shape, self.block).units])
