"""The residual kept in count-sketch space, as FetchSGD does (Rothchild et al., ICML 2020).

A count sketch (Charikar et al., 2002) of ``rows x cols`` cells holds a
vector ``e`` as ``S[j, bucket_j(i)] += sign_j(i) * e_i``. It is linear,
``S(a) + S(b) = S(a + b)``, so residuals can be *accumulated* in it without
ever being materialised: this store keeps ``S_e`` instead of ``e``.

Before compression it gives back only the heavy hitters: every coordinate is
estimated as ``median_j sign_j(i) S[j, bucket_j(i)]`` and the ``k`` largest
estimates, ``ê``, are added to the gradient; what stays behind is
``S_e - S(ê)``, so mass not yet recovered is delayed, not dropped. After
compression the new residual ``r`` is folded in: ``S_e <- S_e - S(ê) + S(r)``.

Hashes come from :class:`hvdsketch.compress.hashing.HashFamily`, drawn once
per tensor name (the sketch lives across steps, so they never change).
Coordinates are hashed a chunk at a time, chunks being the support units of a
:class:`hvdsketch.compress.sketch.Layout`, so no hash table the size of the
tensor is ever built. When the sketch would not be smaller than the tensor,
the residual is kept dense in float32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, Iterator, Sequence

from hvdsketch.compress.hashing import HashFamily
from hvdsketch.compress.support import Layout
from hvdsketch.memory.stores import ITEMSIZE, Fp32, State, Store, numel


@dataclass(frozen=True)
class SketchStore(Store):
    """Residual accumulated in a count sketch; heavy hitters recovered each step.

    Options (flag ``sketch:key=value,...``):
      ratio    sketch cells (rows x cols) as a fraction of the tensor's elements (default 0.1)
      rows     hash rows; estimates take the median over rows (default 5)
      recover  coordinates recovered per step, as a fraction of cols (default 0.1)
      seed     base hash seed (default 0)
    """

    name: ClassVar[str] = "sketch"
    #: Coordinates hashed at once.
    chunk: ClassVar[int] = 1 << 20

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
        return Fp32().nbytes(shape) if cols is None else ITEMSIZE["float32"] * self.rows * cols

    def _hashes(self, name: str, cols: int) -> HashFamily:
        return HashFamily.draw(self.rows, cols, self.seed, name)

    def _chunks(self, ops: ModuleType, n: int, like: Any) -> Iterator[tuple[int, Any]]:
        """``(start, coordinates)`` of each chunk on ``like``'s device, one chunk in memory at a time."""
        layout = Layout(n, -(-n // self.chunk), self.chunk)
        for unit in range(layout.units):
            yield unit * self.chunk, ops.to_device(layout.coordinates(ops, ops.constant([unit], "int64")), like)

    def _sketch(self, ops: ModuleType, hashes: HashFamily, coords: Any, values: Any) -> Any:
        """``S(v)`` of the vector holding ``values`` at ``coords`` (float32, ``rows x cols``)."""
        return ops.stack([ops.scatter_add(hashes.cols, hashes.bucket(ops, j, coords),
                                          hashes.sign(ops, j, coords, "float32") * values)
                          for j in range(hashes.rows)])

    def _estimate(self, ops: ModuleType, hashes: HashFamily, cells: Any, coords: Any) -> Any:
        """``median_j sign_j(i) S[j, bucket_j(i)]`` for every ``i`` in ``coords``."""
        rows = ops.stack([hashes.sign(ops, j, coords, "float32") * ops.gather(cells[j], hashes.bucket(ops, j, coords))
                          for j in range(hashes.rows)])
        return rows[0] if hashes.rows == 1 else ops.sort0(rows)[(hashes.rows - 1) // 2]

    def take(self, ops: ModuleType, state: State, name: str, like: Any) -> tuple[Any, State | None]:
        if "e" in state:
            return Fp32().take(ops, state, name, like)
        cells, shape = state["S"], ops.shape(like)
        n = numel(shape)
        hashes = self._hashes(name, ops.shape(cells)[1])
        k = min(n, math.ceil(self.recover * hashes.cols))
        found, values = [], []
        for _, coords in self._chunks(ops, n, cells):  # the k largest estimates of each chunk, then of all chunks
            estimate = self._estimate(ops, hashes, cells, coords)
            best = ops.topk_abs(estimate, k)
            found.append(ops.gather(coords, best))
            values.append(ops.gather(estimate, best))
        found, values = ops.concat(found), ops.concat(values)
        best = ops.topk_abs(values, k)
        found, values = ops.gather(found, best), ops.gather(values, best)
        residual = ops.reshape(ops.cast(ops.scatter(n, found, values), ops.dtype_name(like)), shape)
        return residual, {"S": cells - self._sketch(ops, hashes, found, values)}

    def put(self, ops: ModuleType, held: State | None, residual: Any, name: str) -> State:
        n = numel(ops.shape(residual))
        cols = self.cols(n)
        if cols is None:
            return Fp32().put(ops, held, residual, name)
        hashes = self._hashes(name, cols)
        flat = ops.cast(ops.flatten(residual), "float32")
        cells = held["S"] if held is not None else 0
        for start, coords in self._chunks(ops, n, flat):
            cells = cells + self._sketch(ops, hashes, coords, flat[start:start + self.chunk])
        return {"S": cells}
