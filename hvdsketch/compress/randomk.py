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

    #: Exchanges of the tensor so far: mixed into the seed, so a name and step seen again (Horovod's
    #: drop-in path, where both are only the shape and 0) draws another set.
    calls: int = 0


@dataclass(frozen=True)
class RandomK(Compressor):
    """Send ``k = ceil(ratio * n)`` coordinates drawn uniformly without replacement, the same on every rank.

    The coordinate set ``S`` (the ``k`` largest of ``n`` seeded uniform keys, a
    uniformly random ``k``-subset) comes from a seed mixed from ``seed``, the
    tensor's name and the step, so every rank picks the same ``S`` and one
    averaging allreduce of the ``k`` values carries the exchange: random-k drops
    into Horovod's ``compression=``. With ``scale`` the values are multiplied by
    ``n / k``, the unbiased estimator ``Q(g)_i = Z_i g_i / p_i`` of Wangni et al.
    2018 (Sec. 2) with every coordinate kept with probability ``p_i = k / n``::

        E[(n / k) g_i 1[i in S]] = g_i

    Without it, it is the ``rand_k`` operator that Stich et al. 2018 pair with
    error feedback (``memory=``, the exchanger's residual memory). ``ratio=1`` is exact.

    In Horovod's drop-in path the name is only the shape and the step stays 0,
    so a per-name call counter (:class:`RandomKState`), advanced alike on every rank as long as all
    ranks compress their tensors in the same order, changes ``S`` every call.
    Inside ``tf.function`` name, step and counter are read when it is traced, and
    a trace keeps no state (it advances no counter), so every rank's graph draws the same ``S``
    (a rank that traces again, on a smaller last batch, agrees with the others).

    Host syncs: none (the keys are drawn on the tensor's device).

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
