"""Deep Gradient Compression (Lin, Han, Mao, Wang & Dally, ICLR 2018)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Sequence

from hvdsketch.compress import seeds, sparse
from hvdsketch.compress.base import Compressor, Exchange, Message, Round, TensorContext
from hvdsketch.compress.state import require_eager, scratch
from hvdsketch.ops import backend
from hvdsketch.ops.contract import Ops


@dataclass(frozen=True)
class DGCState:
    """What DGC remembers of a tensor between steps."""

    #: The momentum-corrected gradient ``u`` (masked where sent); ``None`` before the first step.
    velocity: Any = None
    #: The memory the next ``u`` is written into, so this record stays as it was.
    spare: Any = scratch()


@dataclass(frozen=True)
class DeepGradientCompression(Compressor):
    """Sampled-threshold sparsification with momentum correction and local gradient clipping.

    Per tensor on each of ``N`` ranks, with momentum ``m`` (Sec. 3)::

        g   <- g * min(1, (clip / sqrt(N)) / ||g||_2)     local gradient clipping
        u_t  = m u_{t-1} + g                              momentum correction:
        v_t  = v_{t-1} + u_t                              accumulate velocity, not gradient
        thr  = ceil(ratio * s)-th largest |v_t| of s = ceil(sample * n) sampled coordinates
        send v_t[i] where |v_t[i]| >= thr, at most k = ceil(ratio * n) (the largest: hierarchical selection)
        u_t, v_t <- 0 where sent                          momentum factor masking

    The sent (index, value) pairs are allgathered and averaged (:mod:`hvdsketch.compress.sparse`). Momentum is
    applied here (:meth:`prepare`): step with plain SGD. ``v`` is the error feedback, part of the method
    (``feedback``); ``u`` is the tensor's state (:class:`DGCState`). The threshold sample is drawn with
    replacement; ``ratio=1,sample=1`` sends everything. The paper's warm-up is a schedule of ``ratio`` left to
    the caller.

    Host syncs: one, how many coordinates reach the sampled threshold.

    Options (flag ``dgc:ratio=0.01,momentum=0.9``):
      ratio     fraction of coordinates sent, in (0, 1] (default 0.01; the paper uses 0.001)
      momentum  momentum m, in [0, 1) (default 0.9)
      clip      global L2 norm bound per tensor, scaled by N^-1/2 on each rank; none: no clipping
      sample    fraction of coordinates sampled for the threshold, in (0, 1] (default 0.01)
      seed      base seed of the threshold sample (default 0)
    """

    name: ClassVar[str] = "dgc"
    overflows: ClassVar[bool] = True
    feedback: ClassVar[bool] = True
    State: ClassVar[type] = DGCState

    ratio: float = 0.01
    momentum: float = 0.9
    clip: float | None = None
    sample: float = 0.01
    seed: int = 0

    def __post_init__(self) -> None:
        sparse.check_fraction("ratio", self.ratio)
        sparse.check_fraction("sample", self.sample)
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.clip is not None and not self.clip > 0:
            raise ValueError(f"clip must be > 0 or none, got {self.clip}")

    def traceable(self) -> bool:
        """No: the velocity is kept in Python alone (:meth:`prepare` refuses a graph being traced)."""
        return False

    def prepare(self, tensor: Any, ctx: TensorContext) -> tuple[Any, TensorContext]:
        """``u_t = m u_{t-1} + clip(g)``, which error feedback accumulates, kept in the context's state."""
        ops = backend(tensor)
        require_eager(ops, tensor, self.name)
        u = self._clipped(ops, tensor, ctx.world_size)
        if not self.momentum:
            return u, ctx
        velocity = ctx.state.velocity
        if velocity is None:  # the first step: memory of the state's own (not the gradient's)
            u = ops.into(ops.zeros(ctx.shape, ops.dtype_name(u), u), u) if ops.writable else u
        else:
            u = ops.axpy(self.momentum, velocity, u, ctx.state.spare if ops.writable else None)
        return u, replace(ctx, state=DGCState(u, spare=velocity))

    def exchange(self, tensor: Any, ctx: TensorContext) -> Exchange:
        """Send the selection of ``v_t`` (``tensor``), then zero the momentum where sent (after the round: the
        residual and the values sent may read ``u``'s memory)."""
        messages, indices = self.compress(tensor, ctx)
        reduced = yield Round(messages, lambda: self.residual(tensor, messages, indices, ctx))
        state = ctx.state
        if self.momentum:
            ops = backend(tensor)
            u = state.velocity
            state = DGCState(ops.zero_at(u, indices, u if ops.writable else None), spare=state.spare)
        return self.decompress(reduced, indices, ctx), state

    def _clipped(self, ops: Ops, g: Any, world_size: int) -> Any:
        if self.clip is None:
            return g
        bound = self.clip / math.sqrt(world_size)
        return g * (bound / ops.clip(ops.reduce_sum(g * g) ** 0.5, low=bound))

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        """The sampled-threshold selection of ``tensor`` (here, ``v_t``)."""
        ops = backend(tensor)
        flat = ops.flatten(tensor)
        n = math.prod(ctx.shape)
        s = sparse.count(self.sample, n)
        if s == n:
            sampled = flat
        else:
            u = ops.uniform(s, seeds.derive(self.seed, ctx.name, ctx.step, self.name), flat)
            sampled = ops.gather(flat, ops.clip(ops.cast(ops.floor(u * n), "int64"), high=n - 1))
        top = ops.topk_abs(sampled, sparse.count(self.ratio, s))
        threshold = ops.reduce_min(abs(ops.gather(sampled, top)))
        indices = ops.select_abs_at_least(flat, threshold, sparse.count(self.ratio, n))
        return sparse.messages(ops, indices, ops.gather(flat, indices)), indices

    def residual(self, tensor: Any, messages: Sequence[Message], indices: Any, ctx: TensorContext) -> Any:
        """``v_t`` with what was sent set to 0 (the values travel exactly)."""
        return backend(tensor).zero_at(tensor, indices)

    def decompress(self, reduced: Sequence[Any], indices: Any, ctx: TensorContext) -> Any:
        return sparse.average(reduced, ctx)
