"""The residual kept in count-sketch space, as FetchSGD does (Rothchild et al., ICML 2020).

A count sketch (Charikar et al., 2002) is linear, ``S(a) + S(b) = S(a + b)``, so residuals accumulate in it
without ever being materialised: the store keeps ``S_e`` and a mark per support unit the residual touched.
Before compression it gives back the ``k`` largest estimates ``ê`` (``median_j sign_j(i) S[j, bucket_j(i)]``
over the marked units; rows for a row-sparse gradient) and keeps ``S_e - S(ê)``, so unrecovered mass is
delayed, not dropped; after, it folds in the new residual ``r``: ``S_e <- S_e - S(ê) + S(r)``. Hashes
(:class:`hvdsketch.compress.hashing.HashFamily`) are drawn once per tensor name. Where the sketch would not be
smaller than the tensor, the residual is kept in float32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Sequence

from hvdsketch.compress.hashing import HashFamily
from hvdsketch.compress.sketch import hash_units, median, sketch_cells
from hvdsketch.compress.support import Layout, RowSparse, units_of, values_of
from hvdsketch.memory.stores import ITEMSIZE, Fp32, State, Store, numel
from hvdsketch.ops.contract import Ops


@dataclass(frozen=True)
class SketchStore(Store):
    """Residual accumulated in a count sketch; heavy hitters recovered each step.

    Options (flag ``sketch:key=value,...``):
      ratio    sketch cells (rows x cols) as a fraction of the tensor's elements (default 0.1)
      rows     hash rows; estimates take the median over rows (default 5)
      recover  elements recovered per step, as a fraction of cols (default 0.1)
      seed     base hash seed (default 0)
    """

    name: ClassVar[str] = "sketch"
    row_sparse: ClassVar[bool] = True
    #: Elements per support unit of a vector.
    block: ClassVar[int] = 4096
    #: Elements hashed at once.
    batch: ClassVar[int] = 1 << 20

    ratio: float = 0.1
    rows: int = 5
    recover: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.ratio <= 1:
            raise ValueError("ratio must be in (0, 1]")
        if self.rows < 1:
            raise ValueError("rows must be >= 1")
        if not 0 < self.recover <= 1:
            raise ValueError("recover must be in (0, 1]")

    def cols(self, n: int) -> int | None:
        """Columns of the sketch for ``n`` elements, or ``None`` when dense is no larger."""
        cols = max(1, math.ceil(self.ratio * n / self.rows))
        return None if self.rows * cols >= n else cols

    def nbytes(self, shape: Sequence[int]) -> int:
        cols = self.cols(numel(shape))
        if cols is None:
            return Fp32().nbytes(shape)
        return ITEMSIZE["float32"] * self.rows * cols + Layout.of(shape, self.block).units

    def _hashes(self, name: str, cols: int) -> HashFamily:
        return HashFamily.draw(self.rows, cols, self.seed, name)

    def _batches(self, ops: Ops, layout: Layout, units: Any) -> Iterator[slice]:
        """Consecutive slices of ``units`` of at most :attr:`batch` elements."""
        per = max(1, self.batch // max(layout.unit_len, 1))
        for start in range(0, ops.shape(units)[0], per):
            yield slice(start, start + per)

    def take(self, ops: Ops, state: State, name: str, like: Any) -> tuple[Any, State | None]:
        if "S" not in state:
            return Fp32().take(ops, state, name, like)
        shape = tuple(like.dense_shape) if isinstance(like, RowSparse) else ops.shape(like)
        layout = Layout.of(shape, self.block)
        cells = state["S"]
        hashes = self._hashes(name, ops.shape(cells)[1])
        k = math.ceil(self.recover * hashes.cols)
        rows = ops.split(ops.flatten(cells), [hashes.cols] * hashes.rows)
        found, values = [], []
        marked = ops.positive(state["held"])
        for part in self._batches(ops, layout, marked):  # the k largest of each batch, then of all
            units = marked[part]
            estimates = [s * ops.gather(row, b) for row, (b, s) in
                         zip(rows, hash_units(ops, hashes, layout, units, "float32"))]
            estimate = median(ops, estimates)
            coords = ops.outer_add(units * layout.unit_len, ops.arange(layout.unit_len, like=units))
            if layout.ragged:  # the last unit's padding is no coordinate: its estimates count as zero
                estimate = estimate * ops.cast(coords < layout.numel, "float32")
                coords = coords % layout.numel
            best = ops.topk_abs(estimate, k)
            found.append(ops.gather(coords, best))
            values.append(ops.gather(estimate, best))
        if not found:
            return None, state
        found, values = ops.concat(found), ops.concat(values)
        best = ops.topk_abs(values, k)
        found, values = ops.gather(found, best), ops.gather(values, best)
        units, offsets = found // layout.unit_len, found % layout.unit_len
        given = ops.stack([ops.scatter_add(hashes.cols, hashes.element_buckets(ops, j, units, offsets,
                                                                                 layout.unit_len, layout.units),
                                           hashes.element_signs(ops, j, units, offsets, layout.unit_len, "float32",
                                                                layout.units) * values)
                           for j in range(hashes.rows)])
        dtype = ops.dtype_name(values_of(like))
        if isinstance(like, RowSparse):
            count = ops.shape(found)[0]
            one_hot = ops.scatter(count * layout.unit_len, ops.arange(count, like=found) * layout.unit_len + offsets,
                                  values)
            rows_of, summed = ops.coalesce_rows(units, ops.reshape(one_hot, (count, layout.unit_len)))
            residual = RowSparse(rows_of, ops.cast(ops.reshape(summed, (-1, *shape[1:])), dtype), shape)
        else:
            residual = ops.reshape(ops.cast(ops.scatter_add(layout.numel, found, values), dtype), shape)
        return residual, {"S": cells - given, "held": state["held"]}

    def put(self, ops: Ops, held: State | None, residual: Any, name: str) -> State:
        shape = tuple(residual.dense_shape) if isinstance(residual, RowSparse) else ops.shape(residual)
        cols = self.cols(numel(shape))
        if cols is None:
            return Fp32().put(ops, held, residual, name)
        layout = Layout.of(shape, self.block)
        hashes = self._hashes(name, cols)
        ops, units, values = units_of(residual, layout)
        values = ops.cast(values, "float32")
        cells = held["S"] if held is not None else ops.zeros((self.rows, cols), "float32", values)
        for part in self._batches(ops, layout, units):
            cells = cells + ops.reshape(sketch_cells(ops, cols, hash_units(ops, hashes, layout, units[part], "float32"),
                                                     values[part]), (self.rows, cols))
        mark = ops.indicator(layout.units, units, "uint8")
        if held is not None:
            mark = ops.reduce_max(ops.stack([held["held"], mark]), axis=0)
        return {"S": cells, "held": mark}
