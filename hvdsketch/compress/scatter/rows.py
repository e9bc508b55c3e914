"""The exact sparse reduce-scatter: each block's non-zero rows, and their indices, to the block's owner.

An embedding's gradient under FSDP is a dense tensor whose rows are mostly zero.
Every rank finds its non-zero rows (units: the rows of a ``(N * rows, width)``
tensor, blocks of ``block`` elements of a flat one), and sends each to the owner
of the block it lies in, FSDP's fixed owner, in two rounds::

    1. alltoall   how many rows this rank sends each owner (one integer each)
    2. alltoall   the rows' indices within the owner's block (int32), and
       alltoall   their values, in the tensor's dtype or the ``wire`` dtype
       -> each owner adds the rows it received into its block and divides by N

Nothing is rounded unless ``wire`` narrows the values, so the average is exact; with a 16-bit ``wire`` what the
rounding took from this rank's rows is its residual.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hvdsketch.compress import sizing
from hvdsketch.compress.base import Exchange, Message, Round, TensorContext
from hvdsketch.compress.scatter.base import ScatterCompressor, Units, block_shape, equal_splits
from hvdsketch.compress.scatter.dense import accumulator
from hvdsketch.ops import backend
from hvdsketch.ops.contract import Ops


@dataclass(frozen=True)
class ScatterRows(ScatterCompressor):
    """Each block's non-zero rows (units) and their indices to the block's owner; exact (see the module).

    Host syncs: two (how many rows go to each owner, and come from each rank).

    Options (flag ``rows:wire=bfloat16``):
      wire   values travel as float16, bfloat16 or float32 (default: the tensor's dtype, exact)
      block  elements per unit of a flat tensor (default 256)
    """

    name: ClassVar[str] = "rows"
    host_sized: ClassVar[bool] = True

    wire: str | None = None
    block: int = 256

    def __post_init__(self) -> None:
        sizing.check_wire(self.wire)
        if self.block < 1:
            raise ValueError("block must be >= 1")

    def exchange(self, tensor: Any, ctx: TensorContext) -> Exchange:
        ops, dtype = backend(tensor), backend(tensor).dtype_name(tensor)
        layout = Units.rows(ctx, self.block)
        matrix = layout.matrix(ops, tensor)
        nonzero = ops.nonzero_rows(matrix)  # sorted: by owner, then by row
        owner = nonzero // layout.units
        counts = ops.scatter_add(layout.size, owner, ops.zeros(ops.shape(nonzero)[0], "int64", nonzero) + 1)
        (incoming,) = yield Round([Message(counts, "alltoall", **equal_splits(1, layout.size))])
        sending = [int(c) for c in ops.to_numpy(counts)]
        arriving = [int(c) for c in ops.to_numpy(incoming)]
        rows = ops.gather(matrix, nonzero)
        wire = ops.cast(rows, self.wire or dtype)
        indices = ops.cast(nonzero - owner * layout.units, "int32")
        residual = None if (self.wire or dtype) == dtype else (
            lambda: self._residual(ops, layout, nonzero, rows, wire, ctx))
        received = yield Round([
            Message(indices, "alltoall", splits=tuple(sending), received=tuple(arriving)),
            Message(ops.flatten(wire), "alltoall", splits=tuple(c * layout.unit_len for c in sending),
                    received=tuple(c * layout.unit_len for c in arriving))], residual)
        return self.decompress(received, (dtype, layout), ctx), ctx.state

    def _residual(self, ops: Ops, layout: Units, nonzero: Any, rows: Any, wire: Any, ctx: TensorContext) -> Any:
        """What the wire's rounding took from this rank's rows, as a dense tensor of ``ctx.shape``."""
        lost = rows - ops.cast(wire, ops.dtype_name(rows))
        flat = ops.scatter(layout.size * layout.units * layout.unit_len,
                           ops.outer_add(nonzero * layout.unit_len, ops.arange(layout.unit_len, like=nonzero)),
                           ops.flatten(lost))
        return layout.unpadded(ops, flat, ctx)

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        raise NotImplementedError("rows sizes its second round from its first: see exchange()")

    def decompress(self, reduced: Any, local: tuple[str, Units], ctx: TensorContext) -> Any:
        """This rank's block: the rows received added into zeros, in rank order, divided by ``N``."""
        indices, values = reduced
        dtype, layout = local
        ops = backend(values)
        total = accumulator(dtype) if (self.wire or dtype) != dtype else dtype
        rows = ops.reshape(ops.cast(values, total), (-1, layout.unit_len))
        sums = ops.add_rows(ops.zeros((layout.units, layout.unit_len), total, values), ops.cast(indices, "int64"), rows)
        block = ops.flatten(sums / layout.size)
        if layout.padded:
            block = block[:layout.block_len]
        return ops.reshape(ops.cast(block, dtype), block_shape(ctx))
