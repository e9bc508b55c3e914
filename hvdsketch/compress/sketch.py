"""The compressed collective sparse-sketch (Ge et al., IEEE JSAC 41(4), 2023; "S2 Reducer").

Each rank marks which *support units* of its gradient hold a non-zero — rows
of a tensor of rank >= 2, blocks of ``block`` elements of a vector — in a
bitmap, and adds every coordinate ``i`` of those units into a count sketch
``S`` of ``rows x cols`` cells (Charikar et al., 2002)::

    S[j, bucket_j(i)] += sign_j(i) * g[i]            for every row j

Count sketches with shared hashes are linear, ``S(a) + S(b) = S(a + b)``, so
one averaging allreduce of the sketches yields the sketch of the averaged
gradient, and the OR of the bitmaps gives the union support. Every rank then
recovers::

    g_avg[i] ~= median_j  sign_j(i) * S_avg[j, bucket_j(i)]     for i in the union

For one row the relative L2 error of the recovery is about
``sqrt(nnz / cols)`` (collisions add the energy of ``nnz / cols`` other
coordinates to each cell), so the sketch is sized from an error target
against the union's non-zeros: ``cols = nnz_union / error^2``. By default the
union itself comes first: one bitwise-OR reduction of the bitmaps packed to
bits (``units / 8`` bytes a tensor) gives every rank the same union, then the
sketch sized for it travels alone in one averaging allreduce. Ranks' supports
overlap (frequent words are in every rank's batch), so the union is smaller
than the sum of the ranks' counts: 66% of it for the LSTM's embedding at 4
ranks, less at more. With the ``density`` option the union is bounded in
advance by ``density * units`` and the bitmap rides in the same averaged
message as the cells (one float per unit, > 0 meaning present): one
allreduce in all, as Horovod's drop-in path and ``tf.function`` need. When the
sketch would not be smaller than the tensor, the tensor is sent dense; both
sizings use numbers every rank shares, so every rank makes the same choice. A
tensor the union sends dense is sent dense without the bitmap round until its
``recheck``-th exchange from then (every rank counts the same exchanges), so a
dense-gradient model pays that round once in ``recheck`` steps, not every
step.

"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, Sequence

from hvdsketch.compress.base import Compressor, Exchange, Message, Round, TensorContext
from hvdsketch.compress.hashing import HashFamily
from hvdsketch.compress.state import private_state
from hvdsketch.compress.support import Layout, RowSparse
from hvdsketch.ops import backend


@dataclass(frozen=True)
class SketchPlan:
    """A sketch of ``cols`` columns over ``layout``."""

    layout: Layout
    cols: int


@dataclass(frozen=True)
class SparseSketch(Compressor):
    """Count sketch of the non-zeros plus a bitmap of their units, in one averaged allreduce.

    Options (flag ``sketch:key=value,...``):
      rows     hash rows; recovery takes the median over rows (default 1)
      error    target relative L2 error of the recovery, sizes cols = nnz_union/error^2
      density  a fixed bound on the fraction of units non-zero in the union of all ranks;
               unset (default), the ranks OR their bitmaps first each step and size the
               sketch for the union, so dense tensors go dense and sparse ones get a fitting sketch
      ratio    if set, size the sketch as this fraction of the tensor instead
      block    elements per support unit for vectors (default 256)
      seed     base hash seed, equal on every rank (default 0)
      recheck  with density unset: a tensor the ranks found dense is sent dense without the
               bitmap round until every recheck-th exchange (default 16; 1: every time)
    """

    name: ClassVar[str] = "sketch"
    row_sparse: ClassVar[bool] = True

    rows: int = 1
    error: float = 0.5
    density: float | None = None
    ratio: float | None = None
    block: int = 256
    seed: int = 0
    recheck: int = 16
    _dense_for: dict = private_state()  # tensor name -> exchanges left that go dense at once (equal on every rank)

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise ValueError("rows must be >= 1")
        if not 0 < self.error:
            raise ValueError("error must be > 0")
        if self.density is not None and not 0 <= self.density <= 1:
            raise ValueError("density must be in [0, 1]")
        if self.ratio is not None and not 0 < self.ratio <= 1:
            raise ValueError("ratio must be in (0, 1]")
        if self.block < 1:
            raise ValueError("block must be >= 1")
        if self.recheck < 1:
            raise ValueError("recheck must be >= 1")

    @property
    def drop_in(self) -> bool:  # type: ignore[override]
        """One allreduce carries the exchange only when the sketch is sized in advance."""
        return self.density is not None or self.ratio is not None

    def exchange(self, tensor: Any, ctx: TensorContext) -> Exchange:
        """With ``density`` unset: first OR the ranks' bitmaps into the union, then send the sketch
        sized for it, or the dense tensor."""
        if self.drop_in:
            return (yield from super().exchange(tensor, ctx))
        left = self._dense_for.pop(ctx.name, 0)
        if left > 1:
            self._dense_for[ctx.name] = left - 1
            return (yield from self._send(tensor, ctx, plan=None))
        layout = Layout.of(ctx.shape, self.block)
        found = self._nonzeros(tensor, layout)
        ops, support = found[:2]
        if ops.is_symbolic(support):
            raise ValueError("hvdsketch: inside tf.function the sketch cannot agree on its size each step; "
                             "give it a fixed bound, e.g. sketch:density=0.05")
        (bits,) = yield Round([Message(ops.pack_bits(ops.indicator(layout.units, support, "uint8")), "bor")])
        union = ops.positive(ops.unpack_bits(bits)[:layout.units])
        plan = self.plan(ctx.shape, ops.shape(union)[0])
        if plan is None:
            if self.recheck > 1:
                self._dense_for[ctx.name] = self.recheck
            return (yield from self._send(tensor, ctx, plan=None))
        return (yield from self._send(tensor, ctx, plan=plan, union=union, found=found))

    def _send(self, tensor: Any, ctx: TensorContext, **options: Any) -> Exchange:
        """The last round: the cells (or the dense tensor) as :meth:`compress` makes them with ``options``."""
        messages, state = self.compress(tensor, ctx, **options)
        reduced = yield Round(messages, lambda: self.residual(tensor, messages, state, ctx))
        return self.decompress(reduced, state, ctx)

    def plan(self, shape: Sequence[int], units_bound: int | None = None) -> SketchPlan | None:
        """The sketch for a tensor of ``shape`` whose union has at most ``units_bound`` non-zero
        units (default: ``density`` of them), or ``None`` when dense is no larger."""
        layout = Layout.of(shape, self.block)
        if self.ratio is not None:
            cols = math.ceil(self.ratio * layout.numel / self.rows)
        else:
            if units_bound is None:
                if self.density is None:
                    raise ValueError("the sketch's size is agreed per step; give density= to fix it in advance")
                units_bound = math.ceil(self.density * layout.units)
            cols = math.ceil(units_bound * layout.unit_len / self.error**2)
        cols = max(cols, 1)
        bitmap = layout.units if self.drop_in else 0  # floats in the averaged message; else bits sent before
        if bitmap + self.rows * cols >= layout.numel:
            return None
        return SketchPlan(layout, cols)

    def hashes(self, plan: SketchPlan, ctx: TensorContext) -> HashFamily:
        return HashFamily.draw(self.rows, plan.cols, self.seed, ctx.name, ctx.step)

    # -- compress ---------------------------------------------------------

    @staticmethod
    def _nonzeros(tensor: Any, layout: Layout) -> tuple[ModuleType, Any, Any, Any]:
        """``(ops, support, coords, values)``: the non-zero units, their coordinates and values."""
        if isinstance(tensor, RowSparse):
            ops = backend(tensor.values)
            support, values = ops.coalesce_rows(tensor.indices, tensor.values)
            return ops, support, layout.coordinates(ops, support), ops.flatten(values)
        ops = backend(tensor)
        flat = ops.flatten(tensor)
        padded = ops.pad(flat, layout.units * layout.unit_len - layout.numel)
        support = ops.nonzero_rows(ops.reshape(padded, (layout.units, layout.unit_len)))
        coords = layout.coordinates(ops, support)
        return ops, support, coords, ops.gather(flat, coords)

    def compress(self, tensor: Any, ctx: TensorContext, plan: SketchPlan | None | str = "fixed",
                 union: Any = None, found: tuple | None = None) -> tuple[list[Message], Any]:
        """The sketch cells, after the bitmap unless the ranks' ``union`` support is known already
        (or the dense tensor when ``plan`` is ``None``); ``plan`` defaults to the one fixed by the
        options; ``found``: the tensor's :meth:`_nonzeros`, when the caller has them already."""
        plan = self.plan(ctx.shape) if plan == "fixed" else plan
        row_sparse = isinstance(tensor, RowSparse)
        if plan is None:
            dense = tensor.to_dense() if row_sparse else tensor
            return [Message(backend(dense).flatten(dense), "average")], (plan, row_sparse, None)
        layout = Layout.of(ctx.shape, self.block)
        ops, support, coords, values = found or self._nonzeros(tensor, layout)
        dtype = ops.dtype_name(values)
        hashes = self.hashes(plan, ctx)
        cells = ops.concat([ops.scatter_add(plan.cols, hashes.bucket(ops, j, coords),
                                            hashes.sign(ops, j, coords, dtype) * values)
                            for j in range(self.rows)])
        if union is not None:
            return [Message(cells, "average")], (plan, row_sparse, union)
        bitmap = ops.indicator(layout.units, support, dtype)
        return [Message(ops.concat([bitmap, cells]), "average")], (plan, row_sparse, None)

    # -- decompress -------------------------------------------------------

    def decompress(self, reduced: Sequence[Any], state: tuple[SketchPlan | None, bool, Any],
                   ctx: TensorContext) -> Any:
        """The averaged gradient on the union support; a :class:`RowSparse` one for row-sparse input."""
        plan, row_sparse, union = state
        ops = backend(reduced[-1])
        dtype = ops.dtype_name(reduced[-1])
        if plan is None:
            return ops.reshape(reduced[0], ctx.shape)
        layout = plan.layout
        if union is not None:
            support, payload = union, reduced[0]
        else:
            bitmap, payload = ops.split(reduced[0], [layout.units, plan.cols * self.rows])
            support = ops.positive(bitmap)
        cells = ops.split(payload, [plan.cols] * self.rows)
        coords = layout.coordinates(ops, support)
        hashes = self.hashes(plan, ctx)
        estimates = ops.stack([hashes.sign(ops, j, coords, dtype) * ops.gather(cells[j], hashes.bucket(ops, j, coords))
                               for j in range(self.rows)])
        median = estimates[0] if self.rows == 1 else ops.sort0(estimates)[(self.rows - 1) // 2]
        if row_sparse:
            return RowSparse(support, ops.reshape(median, (-1, *ctx.shape[1:])), tuple(ctx.shape))
        return ops.reshape(ops.scatter(layout.numel, coords, median), ctx.shape)
