"""Random-k sparsification with a shared seed (Wangni et al., NeurIPS 2018; Stich et al., NeurIPS 2018)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from hvdsketch.compress import seeds, sparse
from hvdsketch.compress.base import Compressor, Exchange, Message, TensorContext
from hvdsketch.compress.support import flat_out
from hvdsketch.ops import backend


@dataclass(frozen=True)
class RandomKState:
    """What random-k remembers of a tensor between calls."""

    #: Exchanges of the tensor so far, mixed into the seed (Horovod's drop-in path repeats name and step).
    calls: int = 0


@dataclass(frozen=True)
class RandomK(Compressor):
    """Send ``k = ceil(ratio * n)`` coordinates drawn uniformly without replacement, the same on every rank.

    The coordinate set ``S`` (the ``k`` largest of ``n`` uniform keys seeded from ``seed``, the name, the step and
    the call count of :class:`RandomKState`) is the same on every rank, so one averaging allreduce of the ``k``
    values carries the exchange. With ``scale`` the values are multiplied by ``n / k``, the unbiased estimator of
    Wangni et al. 2018 (Sec. 2)::

        E[(n / k) g_i 1[i in S]] = g_i

    Without it, it is the ``rand_k`` operator that Stich et al. 2018 pair with error feedback. ``ratio=1`` is exact.

    Host syncs: none.

    Options (flag ``randomk:ratio=0.01``):
      ratio   fraction of coordinates sent, in (0, 1] (default 0.01)
      scale   multiply by n/k so the estimate is unbiased (default true)
      seed    base seed, equal on every rank (default 0)
    """

    name: ClassVar[str] = "randomk"
    overflows: ClassVar[bool] = True
    drop_in: ClassVar[bool] = True
    State: ClassVar[type] = RandomKState

    ratio: float = 0.01
    scale: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        sparse.check_fraction("ratio", self.ratio)

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        ops = backend(tensor)
        flat = ops.flatten(tensor)
        n = math.prod(ctx.shape)
        k = sparse.count(self.ratio, n)
        call = 0 if ctx.state is None else ctx.state.calls
        keys = ops.uniform(n, seeds.derive(self.seed, ctx.name, ctx.step, f"randomk.{call}"), flat)
        indices = ops.topk_abs(keys, k)
        values = ops.gather(flat, indices)
        return [Message(values * (n / k) if self.scale else values, "average")], indices

    def exchange(self, tensor: Any, ctx: TensorContext) -> Exchange:
        result, state = yield from super().exchange(tensor, ctx)
        return result, RandomKState(state.calls + 1)

    def decompress(self, reduced: Sequence[Any], indices: Any, ctx: TensorContext) -> Any:
        ops = backend(reduced[0])
        return ops.reshape(ops.scatter(math.prod(ctx.shape), indices, reduced[0], flat_out(ops, ctx.out)), ctx.shape)
