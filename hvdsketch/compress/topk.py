"""Top-k sparsification (Aji & Heafield, EMNLP 2017; Stich, Cordonnier & Jaggi, NeurIPS 2018)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from hvdsketch.compress import sparse
from hvdsketch.compress.base import Compressor, Message, TensorContext
from hvdsketch.compress.support import RowSparse
from hvdsketch.ops import backend


@dataclass(frozen=True)
class TopK(Compressor):
    """Send the ``k = ceil(ratio * n)`` coordinates of largest magnitude, allgathered as (index, value).

    The ``top_k`` operator of Stich et al. 2018 (Sec. 2); every rank averages all ranks' pairs
    (:mod:`hvdsketch.compress.sparse`). It is biased: use error feedback (``memory=``). ``ratio=1`` is exact.
    A row-sparse gradient is selected from its rows without densifying it.

    Host syncs: none for a dense gradient; one for a row-sparse one (its distinct rows).

    Options (flag ``topk:ratio=0.01``):
      ratio   fraction of coordinates kept, in (0, 1] (default 0.01)
    """

    name: ClassVar[str] = "topk"
    row_sparse: ClassVar[bool] = True

    ratio: float = 0.01

    def __post_init__(self) -> None:
        sparse.check_fraction("ratio", self.ratio)

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        k = sparse.count(self.ratio, math.prod(ctx.shape))
        if isinstance(tensor, RowSparse) and backend(tensor.values).is_symbolic(tensor.values):
            tensor = tensor.to_dense()  # inside tf.function the row count is known only at run time
        if isinstance(tensor, RowSparse):
            ops = backend(tensor.values)
            rows, values = ops.coalesce_rows(tensor.indices, tensor.values)
            row_len = math.prod(ctx.shape[1:])
            coords, flat = ops.outer_add(rows * row_len, ops.arange(row_len, rows)), ops.flatten(values)
            if k >= ops.shape(flat)[0]:
                return sparse.messages(ops, coords, flat), None
            chosen = ops.topk_abs(flat, k)
            return sparse.messages(ops, ops.gather(coords, chosen), ops.gather(flat, chosen)), None
        ops = backend(tensor)
        flat = ops.flatten(tensor)
        indices = ops.topk_abs(flat, k)
        return sparse.messages(ops, indices, ops.gather(flat, indices)), None

    def decompress(self, reduced: Sequence[Any], state: Any, ctx: TensorContext) -> Any:
        return sparse.average(reduced, ctx)
