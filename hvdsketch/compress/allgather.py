"""Exact sparse exchange by allgather: every rank's coalesced non-zero units and their indices, in one round.

Horovod's sparse allgather, with each rank's rows coalesced first, indices as int32 where they fit and values
optionally narrower (``wire``)::

    indices = allgather(units_r)          values = allgather(values_r)      (rank order)
    g_avg   = coalesce(indices, values) / N

When the units gathered last time would cost more than a dense allreduce, the tensor is sent dense for
``recheck`` exchanges (:func:`hvdsketch.compress.sizing.latched`), decided alike on every rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hvdsketch.compress import sizing
from hvdsketch.compress.base import Compressor, Exchange, Message, Round, TensorContext
from hvdsketch.compress.support import Layout, RowSparse, count_units, from_units, units_of, values_of
from hvdsketch.ops import backend
from hvdsketch.ops.contract import Ops


def index_dtype(layout: Layout) -> str:
    """int32 where every unit index fits, else int64."""
    return "int32" if layout.units < 2**31 else "int64"


def lossy_residual(ops: Ops, layout: Layout, units: Any, values: Any, sent: Any, shape: Any) -> Any:
    """What rounding ``values`` to the wire format lost (row-sparse on a matrix's rows)."""
    return from_units(ops, layout, units, values - ops.cast(sent, ops.dtype_name(values)), shape, row_sparse=True)


@dataclass
class Gathered:
    """What a rank sent in one exchange: the dense tensor (``units`` None), or its units."""

    layout: Layout
    row_sparse: bool
    dtype: str
    units: Any = None
    values: Any = None
    sent: Any = None
    source: Any = None  # the tensor the units came from (the result may go into its memory)


@dataclass(frozen=True)
class Allgather(Compressor):
    """Every rank's coalesced non-zero units and their indices, allgathered: exact.

    Options (flag ``allgather:key=value,...``):
      wire     values travel as float16, bfloat16 or float32 (default: the tensor's dtype, exact)
      block    elements per unit for vectors (default 256)
      recheck  exchanges a tensor found cheaper dense is sent dense before it is counted again (default 16)
    """

    name: ClassVar[str] = "allgather"
    row_sparse: ClassVar[bool] = True
    State: ClassVar[type] = sizing.LatchState

    wire: str | None = None
    block: int = 256
    recheck: int = 16

    def __post_init__(self) -> None:
        sizing.check_wire(self.wire)
        if self.block < 1:
            raise ValueError("block must be >= 1")
        if self.recheck < 1:
            raise ValueError("recheck must be >= 1")

    def cheaper_dense(self, layout: Layout, gathered: int, dtype: str) -> bool:
        """Whether allgathering ``gathered`` units (all ranks') sends at least a dense ring allreduce's bytes."""
        unit = sizing.ITEMSIZE[index_dtype(layout)] + layout.unit_len * sizing.ITEMSIZE[self.wire or dtype]
        return gathered * unit >= 2 * layout.numel * sizing.ITEMSIZE[dtype]

    def exchange(self, tensor: Any, ctx: TensorContext) -> Exchange:
        """One round (two allgathers, or a dense allreduce while latched); the state learns if the next go dense."""
        dense_for = ctx.state.dense_for
        dense, learn = sizing.latched(dense_for)
        messages, gathered = self.compress(tensor, ctx, dense)
        reduced = yield Round(messages, lambda: self.residual(tensor, messages, gathered, ctx))
        result = self.decompress(reduced, gathered, ctx)
        ops = backend(values_of(result))
        count = None
        if not ops.is_symbolic(reduced[0]):
            # after a dense exchange: N times its union, the most an allgather would gather
            count = (ops.shape(reduced[0])[0] if gathered.units is not None else
                     ctx.world_size * count_units(result, gathered.layout) if learn else None)
        dense_next = count is not None and self.cheaper_dense(gathered.layout, count, gathered.dtype)
        return result, sizing.LatchState(sizing.release(dense_for, dense_next, self.recheck))

    def compress(self, tensor: Any, ctx: TensorContext, dense: bool = False) -> tuple[list[Message], Gathered]:
        """The units' indices and values to allgather, or (``dense``) the dense tensor to average."""
        values = values_of(tensor)
        ops, dtype = backend(values), backend(values).dtype_name(values)
        layout = Layout.of(ctx.shape, self.block)
        row_sparse = isinstance(tensor, RowSparse)
        if dense:
            whole = tensor.to_dense() if row_sparse else tensor
            return [Message(ops.flatten(whole), "average")], Gathered(layout, row_sparse, dtype)
        ops, units, unit_values = units_of(tensor, layout)
        sent = ops.cast(unit_values, self.wire or dtype)
        return ([Message(ops.cast(units, index_dtype(layout)), "allgather"), Message(sent, "allgather")],
                Gathered(layout, row_sparse, dtype, units, unit_values, sent, tensor))

    def residual(self, tensor: Any, messages: Any, gathered: Gathered, ctx: TensorContext) -> Any:
        """Nothing, but what a narrower wire format rounded off."""
        if gathered.units is None or (self.wire or gathered.dtype) == gathered.dtype:
            return None
        return lossy_residual(backend(gathered.values), gathered.layout, gathered.units, gathered.values,
                              gathered.sent, ctx.shape)

    def decompress(self, reduced: Any, gathered: Gathered, ctx: TensorContext) -> Any:
        """The gathered units coalesced (a unit several ranks hold, summed in rank order) over N."""
        ops = backend(reduced[-1])
        if gathered.units is None:
            return ops.reshape(reduced[0], ctx.shape)
        rows, summed = ops.coalesce_rows(reduced[0], ops.cast(reduced[1], gathered.dtype))
        return from_units(ops, gathered.layout, rows, summed / ctx.world_size, ctx.shape, gathered.row_sparse, ctx.out,
                          gathered.source)
