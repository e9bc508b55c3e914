"""The sparse sketch (S2 Reducer, Ge et al., IEEE JSAC 41(4), 2023): a count sketch plus a bitmap, in one round.

Each rank marks the *support units* holding a non-zero (:class:`~hvdsketch.compress.support.Layout`) in a
bitmap and adds every coordinate ``i`` of them into a ``rows x cols`` count sketch (Charikar et al., 2002;
hashes in :mod:`hvdsketch.compress.hashing`)::

    S[j, bucket_j(i)] += sign_j(i) * g[i]            for every row j

Count sketches with shared hashes are linear, so one averaging allreduce of the cells gives the sketch of the
average, and the OR of the bitmaps its union support; every rank then recovers (median over rows)::

    g_avg[i] ~= median_j  sign_j(i) * S_avg[j, bucket_j(i)]     for i in the union

One row's relative L2 error is about ``sqrt(nnz_union / cols)``, so a union of ``U`` units needs
``cols = U unit_len / error^2``; ``U`` is planned from the previous step's union
(:mod:`hvdsketch.compress.sizing`). A tensor whose sketch would not be smaller is sent dense. The residual is
this rank's values minus its own sketch's estimate of them, on its own units only.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from hvdsketch.compress import sizing
from hvdsketch.compress.base import Compressor, Exchange, Message, Round, TensorContext
from hvdsketch.compress.hashing import HashFamily
from hvdsketch.compress.support import Layout, RowSparse, count_units, from_units, units_of, values_of
from hvdsketch.ops import backend
from hvdsketch.ops.contract import Ops

#: ``compress``'s default plan: the one the tensor's state gives for this exchange.
NEXT = "next"


@dataclass(frozen=True)
class SketchState:
    """What the sketch remembers of a tensor between steps (equal on every rank)."""

    #: The planned size's level (:mod:`~hvdsketch.compress.sizing`); ``None`` before any union was seen.
    level: int | None = None
    #: Exchanges left that go dense at once (0: not latched).
    dense_for: int = 0
    #: 1 once a union that overflowed its plan was warned about.
    warned: int = 0


@dataclass(frozen=True)
class SketchPlan:
    """A sketch of ``cols`` columns per row over ``layout``, sized for a union of ``bound`` units."""

    layout: Layout
    cols: int
    bound: int | None


@dataclass
class Sent:
    """What a rank sent in one exchange, for its residual and the recovery."""

    plan: SketchPlan | None
    row_sparse: bool
    dtype: str
    units: Any = None
    values: Any = None
    hashed: list | None = None  # per sketch row: (buckets, signs) of this rank's units
    hashes: HashFamily | None = None
    union: int | None = None    # units in the reduced bitmap, once recovered
    warned: bool = False        # whether the recovery warned that the union overflowed the plan
    source: Any = None          # the tensor the units came from (the result may go into its memory)


def hash_units(ops: Ops, hashes: HashFamily, layout: Layout, units: Any, dtype: str) -> list[tuple[Any, Any]]:
    """Per sketch row, the buckets and signs of every element of ``units`` (row-major)."""
    return [(hashes.buckets(ops, j, units, layout.unit_len, layout.units),
             hashes.signs(ops, j, units, layout.unit_len, dtype, layout.units)) for j in range(hashes.rows)]


def sketch_cells(ops: Ops, cols: int, hashed: list[tuple[Any, Any]], values: Any) -> Any:
    """The ``rows x cols`` cells, flat, of the elements ``values`` whose buckets and signs are ``hashed``."""
    flat = ops.flatten(values)
    rows = [ops.scatter_add(cols, buckets, signs * flat) for buckets, signs in hashed]
    return rows[0] if len(rows) == 1 else ops.concat(rows)


def recover(ops: Ops, cols: int, hashed: list[tuple[Any, Any]], cells: Any, unit_len: int) -> Any:
    """The median over rows of ``sign * cell`` for every hashed element, as ``units x unit_len``."""
    rows = ops.split(cells, [cols] * len(hashed))
    estimates = [signs * ops.gather(row, buckets) for row, (buckets, signs) in zip(rows, hashed)]
    return ops.reshape(median(ops, estimates), (-1, unit_len))


def median(ops: Ops, xs: Sequence[Any]) -> Any:
    """Element-wise median of equal-shaped tensors (even count: the mean of the two middle values)."""
    if len(xs) == 1:
        return xs[0]
    if len(xs) == 2:
        return (xs[0] + xs[1]) / 2
    if len(xs) == 3:
        pair = ops.stack(xs[:2])
        low, high = ops.reduce_min(pair, axis=0), ops.reduce_max(pair, axis=0)
        return ops.reduce_max(ops.stack([low, ops.reduce_min(ops.stack([high, xs[2]]), axis=0)]), axis=0)
    ordered, middle = ops.sort0(ops.stack(xs)), len(xs) // 2
    return ordered[middle] if len(xs) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@dataclass(frozen=True)
class SparseSketch(Compressor):
    """Count sketch of the non-zeros plus a bitmap of their units, in one round sized in advance.

    Options (flag ``sketch:key=value,...``):
      rows      hash rows; recovery takes the median over rows (default 1)
      error     target relative L2 error of the recovery: cols = bound * unit_len / error^2 (default 0.5)
      density   the first exchange's bound on the union's fraction of units; unset (default): dense first
      ratio     size the sketch as this fraction of the tensor instead, the same every step
      headroom  factor on the union seen last when sizing the next step (default 1.1)
      grow      planned sizes are powers of this factor, so message sizes repeat (default 1.25)
      wire      cells travel as float16, bfloat16 or float32 (default: the tensor's dtype)
      bitmap    bits (packed, OR-reduced; default) or float (one float a unit in the cells' averaged message)
      block     elements per support unit for vectors (default 256)
      seed      base hash seed, equal on every rank (default 0)
      recheck   exchanges a tensor not worth sketching goes dense before it is counted again (default 16)
    """

    name: ClassVar[str] = "sketch"
    overflows: ClassVar[bool] = True
    row_sparse: ClassVar[bool] = True
    State: ClassVar[type] = SketchState

    rows: int = 1
    error: float = 0.5
    density: float | None = None
    ratio: float | None = None
    headroom: float = 1.1
    grow: float = 1.25
    wire: str | None = None
    bitmap: str = "bits"
    block: int = 256
    seed: int = 0
    recheck: int = 16

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise ValueError("rows must be >= 1")
        if not 0 < self.error:
            raise ValueError("error must be > 0")
        if self.density is not None and not 0 < self.density <= 1:
            raise ValueError(f"density must be in (0, 1] (the fraction of units the union may hold), got {self.density}")
        if self.ratio is not None and not 0 < self.ratio <= 1:
            raise ValueError("ratio must be in (0, 1]")
        if self.headroom < 1:
            raise ValueError("headroom must be >= 1")
        if self.grow <= 1:
            raise ValueError("grow must be > 1")
        sizing.check_wire(self.wire)
        if self.bitmap not in ("bits", "float"):
            raise ValueError("bitmap must be bits or float")
        if self.block < 1:
            raise ValueError("block must be >= 1")
        if self.recheck < 1:
            raise ValueError("recheck must be >= 1")

    @property
    def drop_in(self) -> bool:  # type: ignore[override]
        """One averaged message carries the exchange when the bitmap rides in it as floats."""
        return self.bitmap == "float"

    @property
    def sized_in_advance(self) -> bool:
        """True when ``density`` or ``ratio`` fixes the size, so no per-step state decides it."""
        return self.density is not None or self.ratio is not None

    def traceable(self) -> bool:
        """Only when :attr:`sized_in_advance`: otherwise the plan's level changes the messages' shapes."""
        return self.sized_in_advance

    def one_message(self) -> "SparseSketch":
        return self if self.drop_in else dataclasses.replace(self, bitmap="float")

    def plan(self, shape: Sequence[int], bound: int | None = None, dtype: str = "float32") -> SketchPlan | None:
        """The sketch of a union of at most ``bound`` units (default: ``density``); ``None`` if dense is no larger."""
        layout = Layout.of(shape, self.block)
        if self.ratio is not None:
            cols = math.ceil(self.ratio * layout.numel / self.rows)
        else:
            if bound is None:
                if self.density is None:
                    raise ValueError("the sketch is sized from the union seen last; give density= to bound it")
                bound = math.ceil(self.density * layout.units)
            cols = math.ceil(max(bound, 1) * layout.unit_len / self.error**2)
        cols = max(cols, 1)
        cell = sizing.ITEMSIZE[self.wire or dtype]
        bitmap = -(-layout.units // 8) if self.bitmap == "bits" else layout.units * cell
        if bitmap + self.rows * cols * cell >= layout.numel * sizing.ITEMSIZE[dtype]:
            return None
        return SketchPlan(layout, cols, bound)

    def next_plan(self, ctx: TensorContext, dtype: str) -> tuple[SketchPlan | None, bool]:
        """This exchange's plan from the shared state (``None``: dense), and whether to count its dense result."""
        if self.ratio is not None:
            return self.plan(ctx.shape, None, dtype), False
        state = ctx.state or SketchState()
        dense, learn = sizing.latched(state.dense_for)
        if dense:
            return None, learn
        units = Layout.of(ctx.shape, self.block).units
        level = state.level
        if level is not None:
            plan = self.plan(ctx.shape, sizing.bound_of(level, self.grow, units), dtype)
            return plan, plan is None
        if self.density is not None:
            return self.plan(ctx.shape, math.ceil(self.density * units), dtype), False
        return None, True

    def _learnt(self, state: SketchState, ctx: TensorContext, sent: Sent, learn: bool, result: Any) -> SketchState:
        """The state after this exchange: the next one sized from this one's union."""
        state = dataclasses.replace(state, warned=1) if sent.warned else state
        if self.ratio is not None:
            return state
        layout = Layout.of(ctx.shape, self.block)
        count = sent.union if sent.plan is not None else count_units(result, layout) if learn else None
        level, dense_next = state.level, False
        if count is not None:
            level = sizing.next_level(level, count, self.headroom, self.grow)
            dense_next = self.plan(ctx.shape, sizing.bound_of(level, self.grow, layout.units), sent.dtype) is None
        return dataclasses.replace(state, level=level,
                                   dense_for=sizing.release(state.dense_for, dense_next, self.recheck))

    def _check_union(self, ops: Ops, ctx: TensorContext, sent: Sent, count: Any, traced: bool) -> None:
        """Warn once per tensor (``sent.warned``) when the union's ``count`` units (a host int, or a device count
        inside ``tf.function``) exceed :data:`~hvdsketch.compress.sizing.OVERFLOW` times the plan's bound.
        A ``ratio`` plan is never warned about."""
        plan = sent.plan
        if plan.bound is None or (ctx.state is not None and ctx.state.warned):
            return

        def warn(units: Any) -> None:
            if not sent.warned:  # a traced check runs every step
                sent.warned = True
                self._warn_overflow(ctx, plan, int(units), traced)

        ops.call_if(count > math.floor(sizing.OVERFLOW * max(plan.bound, 1)), warn, [count])

    def _warn_overflow(self, ctx: TensorContext, plan: SketchPlan, count: int, traced: bool) -> None:
        layout = plan.layout
        unit = "rows" if len(ctx.shape) >= 2 else f"blocks of {layout.unit_len}"
        error = math.sqrt(count * layout.unit_len / plan.cols)  # one row: sqrt(nnz / cols)
        then = ("inside tf.function the plan stays the one traced, so every step has that error: give a density "
                f"that holds the union (here at least {count / layout.units:.2g}; 1 sends it dense), or leave "
                "density unset with hvdsketch's tape or optimizer, which size the sketch every step"
                if traced else "the next exchanges are sized from this union (dense where a sketch of it would "
                "be no smaller)")
        warnings.warn(f"hvdsketch: {self} on {ctx.name} of shape {tuple(ctx.shape)}: its union held {count} of "
                      f"{layout.units} {unit}, {count / max(plan.bound, 1):.1f}x the {plan.bound} its plan was sized "
                      f"for, so the recovery's relative error is about {error:.2f} against error={self.error}; "
                      f"{then}", RuntimeWarning)

    def hashes(self, plan: SketchPlan, ctx: TensorContext) -> HashFamily:
        return HashFamily.draw(self.rows, plan.cols, self.seed, ctx.name, ctx.step)

    def exchange(self, tensor: Any, ctx: TensorContext) -> Exchange:
        """One round of bitmap and cells (or the dense tensor); the state then learns this step's union."""
        values = values_of(tensor)
        ops = backend(values)
        plan, learn = self.next_plan(ctx, ops.dtype_name(values))
        messages, sent = self.compress(tensor, ctx, plan)
        reduced = yield Round(messages, lambda: self.residual(tensor, messages, sent, ctx))
        result = self.decompress(reduced, sent, ctx)
        if ops.is_symbolic(values):  # inside tf.function the plan stays the one traced
            return result, ctx.state
        return result, self._learnt(ctx.state or SketchState(), ctx, sent, learn, result)

    def compress(self, tensor: Any, ctx: TensorContext, plan: SketchPlan | None | str = NEXT
                 ) -> tuple[list[Message], Sent]:
        """The bitmap and cells of ``plan`` (default: the state's next), or the dense tensor for ``None``."""
        row_sparse = isinstance(tensor, RowSparse)
        values = values_of(tensor)
        ops, dtype = backend(values), backend(values).dtype_name(values)
        if plan == NEXT:
            plan = self.next_plan(ctx, dtype)[0]
        if plan is None:
            dense = tensor.to_dense() if row_sparse else tensor
            return [Message(ops.flatten(dense), "average")], Sent(None, row_sparse, dtype)
        layout = plan.layout
        ops, units, unit_values = units_of(tensor, layout)
        hashes = self.hashes(plan, ctx)
        hashed = hash_units(ops, hashes, layout, units, dtype)
        cells = sketch_cells(ops, plan.cols, hashed, unit_values)
        wire = self.wire or dtype
        cells = ops.cast(cells, wire)
        sent = Sent(plan, row_sparse, dtype, units, unit_values, hashed, hashes, source=tensor)
        if self.bitmap == "float":
            return [Message(ops.concat([ops.indicator(layout.units, units, wire), cells]), "average")], sent
        return [Message(ops.pack_bits(ops.indicator(layout.units, units, "uint8")), "bor"),
                Message(cells, "average")], sent

    def _cells(self, ops: Ops, messages: Sequence[Any], sent: Sent) -> tuple[Any, Any]:
        """``(bitmap, cells)`` of the messages (sent or reduced); cells in the tensor's dtype."""
        layout, plan = sent.plan.layout, sent.plan
        if self.bitmap == "float":
            bitmap, cells = ops.split(messages[0], [layout.units, plan.cols * self.rows])
        else:
            bitmap, cells = messages
        return bitmap, ops.cast(cells, sent.dtype)

    def residual(self, tensor: Any, messages: Sequence[Message], sent: Sent, ctx: TensorContext) -> Any:
        """This rank's values minus its own cells' estimate, on its own units (row-sparse; empty when dense)."""
        if sent.plan is None:
            ops = backend(messages[0].tensor)
            layout = Layout.of(ctx.shape, self.block)
            return from_units(ops, layout, ops.zeros(0, "int64", messages[0].tensor),
                              ops.zeros((0, layout.unit_len), sent.dtype, messages[0].tensor), ctx.shape, row_sparse=True)
        ops = backend(sent.values)
        _, cells = self._cells(ops, [m.tensor for m in messages], sent)
        layout = sent.plan.layout
        missed = sent.values - recover(ops, sent.plan.cols, sent.hashed, cells, layout.unit_len)
        return from_units(ops, layout, sent.units, missed, ctx.shape, row_sparse=True)

    def decompress(self, reduced: Sequence[Any], sent: Sent, ctx: TensorContext) -> Any:
        """The averaged gradient on the union support; a :class:`RowSparse` one for row-sparse input."""
        ops = backend(reduced[-1])
        if sent.plan is None:
            return ops.reshape(reduced[0], ctx.shape)
        plan, layout = sent.plan, sent.plan.layout
        bitmap, cells = self._cells(ops, reduced, sent)
        mask = bitmap if self.bitmap == "float" else ops.unpack_bits(bitmap)[:layout.units]
        union = ops.positive(mask)
        traced = ops.is_symbolic(union)
        sent.union = None if traced else ops.shape(union)[0]
        self._check_union(ops, ctx, sent, ops.reduce_sum(ops.cast(mask > 0, "int64")) if traced else sent.union, traced)
        sent.hashed = None
        hashed = hash_units(ops, sent.hashes, layout, union, sent.dtype)
        estimate = recover(ops, plan.cols, hashed, cells, layout.unit_len)
        return from_units(ops, layout, union, estimate, ctx.shape, sent.row_sparse, ctx.out, sent.source)
