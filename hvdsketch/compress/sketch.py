"""The compressed collective sparse-sketch (Ge et al., IEEE JSAC 41(4), 2023; "S2 Reducer").

Each rank marks which *support units* of its gradient hold a non-zero — rows
of a tensor of rank >= 2, blocks of ``block`` elements of a vector — in a
bitmap, and adds every coordinate ``i`` of those units into a count sketch
``S`` of ``rows x cols`` cells (Charikar et al., 2002)::

    S[j, bucket_j(i)] += sign_j(i) * g[i]            for every row j

Count sketches with shared hashes are linear, ``S(a) + S(b) = S(a + b)``, so
one averaging allreduce of the sketches yields the sketch of the averaged
gradient, and the bitmaps, reduced in the same message (one float per unit,
> 0 meaning present), give the union support. Every rank then recovers::

    g_avg[i] ~= median_j  sign_j(i) * S_avg[j, bucket_j(i)]     for i in the union

For one row the relative L2 error of the recovery is about
``sqrt(nnz / cols)`` (collisions add the energy of ``nnz / cols`` other
coordinates to each cell), so the sketch is sized from an error target
against a bound on the union's non-zeros: ``cols = density * n / error^2``.
When sketch plus bitmap would not be smaller than the tensor, the tensor is
sent dense; the choice depends only on the shape and the options, so every
rank makes it alike.

"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, Sequence

from hvdsketch.compress.base import Compressor, Message, TensorContext
from hvdsketch.compress.hashing import HashFamily
from hvdsketch.ops import backend


@dataclass(frozen=True)
class RowSparse:
    """A gradient given as distinct row indices and their rows (``nn.Embedding(sparse=True)``,
    ``tf.IndexedSlices``), never materialised dense."""

    indices: Any
    values: Any
    dense_shape: tuple[int, ...]

    def to_dense(self) -> Any:
        """The dense tensor (rows given twice are summed)."""
        ops = backend(self.values)
        row_len = math.prod(self.dense_shape[1:])
        coords = ops.outer_add(ops.cast(self.indices, "int64") * row_len, ops.arange(row_len))
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
        """Flat indices of every element of the given units (int64)."""
        coords = ops.outer_add(units * self.unit_len, ops.arange(self.unit_len))
        if self.units * self.unit_len == self.numel:
            return coords
        return ops.where_less(coords, self.numel)


@dataclass(frozen=True)
class SketchPlan:
    layout: Layout
    cols: int


@dataclass(frozen=True)
class SparseSketch(Compressor):
    """Count sketch of the non-zeros plus a bitmap of their units, in one averaged allreduce.

    Options (flag ``sketch:key=value,...``):
      rows     hash rows; recovery takes the median over rows (default 1)
      error    target relative L2 error of the recovery, sizes cols = density*n/error^2
      density  bound on the fraction of units non-zero in the union of all ranks
      ratio    if set, size the sketch as this fraction of the tensor instead
      block    elements per support unit for vectors (default 256)
      seed     base hash seed, equal on every rank (default 0)
    """

    name: ClassVar[str] = "sketch"
    drop_in: ClassVar[bool] = True
    row_sparse: ClassVar[bool] = True

    rows: int = 1
    error: float = 0.5
    density: float = 0.05
    ratio: float | None = None
    block: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise ValueError("rows must be >= 1")
        if not 0 < self.error:
            raise ValueError("error must be > 0")
        if not 0 < self.density <= 1:
            raise ValueError("density must be in (0, 1]")
        if self.ratio is not None and not 0 < self.ratio <= 1:
            raise ValueError("ratio must be in (0, 1]")
        if self.block < 1:
            raise ValueError("block must be >= 1")

    def plan(self, shape: Sequence[int]) -> SketchPlan | None:
        """The sketch for a tensor of ``shape``, or ``None`` when dense is no larger."""
        layout = Layout.of(shape, self.block)
        if self.ratio is not None:
            cols = math.ceil(self.ratio * layout.numel / self.rows)
        else:
            nnz_bound = math.ceil(self.density * layout.units) * layout.unit_len
            cols = math.ceil(nnz_bound / self.error**2)
        cols = max(cols, 1)
        if layout.units + self.rows * cols >= layout.numel:
            return None
        return SketchPlan(layout, cols)

    def hashes(self, plan: SketchPlan, ctx: TensorContext) -> HashFamily:
        return HashFamily.draw(self.rows, plan.cols, self.seed, ctx.name, ctx.step)

    # -- compress ---------------------------------------------------------

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        if isinstance(tensor, RowSparse):
            return self._compress_rows(tensor, ctx)
        ops = backend(tensor)
        dtype = ops.dtype_name(tensor)
        flat = ops.flatten(tensor)
        plan = self.plan(ctx.shape)
        if plan is None:
            body = [flat]
        else:
            layout = plan.layout
            padded = ops.pad(flat, layout.units * layout.unit_len - layout.numel)
            support = ops.nonzero_rows(ops.reshape(padded, (layout.units, layout.unit_len)))
            coords = layout.coordinates(ops, support)
            body = self._sketch(ops, plan, ctx, support, coords, ops.gather(flat, coords), dtype)
        return [Message(ops.concat(body), "average")], (plan, False)

    def _compress_rows(self, grad: RowSparse, ctx: TensorContext) -> tuple[list[Message], Any]:
        ops = backend(grad.values)
        dtype = ops.dtype_name(grad.values)
        plan = self.plan(ctx.shape)
        rows, values = ops.coalesce_rows(grad.indices, grad.values)
        if plan is None:
            layout = Layout.of(ctx.shape, self.block)
            body = [ops.scatter(layout.numel, layout.coordinates(ops, rows), ops.flatten(values))]
        else:
            coords = plan.layout.coordinates(ops, rows)
            body = self._sketch(ops, plan, ctx, rows, coords, ops.flatten(values), dtype)
        return [Message(ops.concat(body), "average")], (plan, True)

    def _sketch(self, ops: ModuleType, plan: SketchPlan, ctx: TensorContext,
                support: Any, coords: Any, values: Any, dtype: str) -> list[Any]:
        hashes = self.hashes(plan, ctx)
        cells = [ops.scatter_add(plan.cols, hashes.bucket(ops, j, coords),
                                 hashes.sign(ops, j, coords, dtype) * values)
                 for j in range(self.rows)]
        return [ops.indicator(plan.layout.units, support, dtype), *cells]

    # -- decompress -------------------------------------------------------

    def decompress(self, reduced: Sequence[Any], state: tuple[SketchPlan | None, bool],
                   ctx: TensorContext) -> Any:
        """The averaged gradient on the union support; a :class:`RowSparse` one for row-sparse input."""
        plan, row_sparse = state
        payload = reduced[0]
        ops = backend(payload)
        dtype = ops.dtype_name(payload)
        if plan is None:
            return ops.reshape(payload, ctx.shape)
        layout = plan.layout
        bitmap, *cells = ops.split(payload, [layout.units] + [plan.cols] * self.rows)
        support = ops.positive(bitmap)
        coords = layout.coordinates(ops, support)
        hashes = self.hashes(plan, ctx)
        estimates = ops.stack([hashes.sign(ops, j, coords, dtype) * ops.gather(cells[j], hashes.bucket(ops, j, coords))
                               for j in range(self.rows)])
        median = estimates[0] if self.rows == 1 else ops.sort0(estimates)[(self.rows - 1) // 2]
        if row_sparse:
            return RowSparse(support, ops.reshape(median, (-1, *ctx.shape[1:])), tuple(ctx.shape))
        return ops.reshape(ops.scatter(layout.numel, coords, median), ctx.shape)
