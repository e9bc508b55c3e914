"""PowerSGD: rank-r compression by one power iteration (Vogels, Karimireddy & Jaggi, NeurIPS 2019)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from hvdsketch.compress import seeds
from hvdsketch.compress.base import Compressor, Exchange, Message, Round, TensorContext
from hvdsketch.ops import backend


@dataclass(frozen=True)
class PowerSGDState:
    """What PowerSGD remembers of a tensor between steps."""

    #: The last step's averaged ``Q`` (``m x r``), the next step's warm start; ``None`` before the
    #: first exchange and with ``warm_start=false`` (every step draws its own).
    q: Any = None


@dataclass(frozen=True)
class PowerSGD(Compressor):
    """Each tensor, viewed as an ``n x m`` matrix ``M = G + E`` (first dimension by the rest,
    ``E`` the error-feedback residual), is exchanged in two averaging allreduces (Algorithm 1)::

        P = M Q;     P <- mean over ranks of P;    P^ = orthogonalize(P)
        Q = M^T P^;  Q <- mean over ranks of Q;    result P^ Q^T,   E <- M - P^ Q_local^T

    ``Q`` travels as ``Q^T = P^^T M`` (:meth:`project`). It is warm-started from the previous step's averaged ``Q``
    (Sec. 3), initially seeded uniform from ``seed`` and the name, equal on every rank; ``warm_start=false`` draws
    a fresh one every step. Error feedback (Algorithm 2) is part of the method (``feedback``). Orthogonalization is
    a reduced QR (in float32 for 16-bit gradients). Tensors of rank < 2, matrices where ``r (n + m) >= n m``, and
    every tensor in the first ``start`` steps (PyTorch's ``start_powerSGD_iter``) are averaged dense.

    Host syncs: none.

    Options (flag ``powersgd:rank=2``):
      rank        rank r of the approximation, >= 1 (default 1)
      seed        base seed of the initial Q (default 0)
      warm_start  start from the last step's averaged Q (default true), or from a fresh one
      start       steps averaged dense before the first compressed one (default 0)
    """

    name: ClassVar[str] = "powersgd"
    overflows: ClassVar[bool] = True
    feedback: ClassVar[bool] = True
    State: ClassVar[type] = PowerSGDState

    rank: int = 1
    seed: int = 0
    warm_start: bool = True
    start: int = 0

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"rank must be >= 1, got {self.rank}")
        if self.start < 0:
            raise ValueError(f"start must be >= 0, got {self.start}")

    def matrix(self, shape: Sequence[int]) -> tuple[int, int] | None:
        """The ``(n, m)`` matrix view of a tensor of ``shape``, or ``None`` when it goes dense."""
        if len(shape) < 2:
            return None
        n, m = shape[0], math.prod(shape[1:])
        return (n, m) if self.rank * (n + m) < n * m else None

    def compressed(self, ctx: TensorContext) -> tuple[int, int] | None:
        """The matrix view this step compresses the tensor of ``ctx`` in, or ``None`` for dense."""
        return self.matrix(ctx.shape) if ctx.step >= self.start else None

    def exchange(self, tensor: Any, ctx: TensorContext) -> Exchange:
        if self.compressed(ctx) is None:
            return (yield from super().exchange(tensor, ctx))
        messages, matrix = self.compress(tensor, ctx)
        p = yield Round(messages)
        messages, p_hat = self.project(p, matrix)
        q = yield Round(messages, lambda: self.residual(tensor, messages, p_hat, ctx))
        ops = backend(p_hat)
        return self.decompress(q, p_hat, ctx), PowerSGDState(ops.transpose(q[0])) if self.warm_start else ctx.state

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        """Round 1: ``P = M Q`` (or the tensor itself, where it goes dense)."""
        shape = self.compressed(ctx)
        if shape is None:
            return [Message(tensor, "average")], None
        ops = backend(tensor)
        matrix = ops.reshape(tensor, shape)
        q = self.drawn_q(matrix, ctx) if ctx.state is None or ctx.state.q is None else ctx.state.q
        return [Message(ops.matmul(matrix, q), "average")], matrix

    def drawn_q(self, like: Any, ctx: TensorContext) -> Any:
        """A start ``Q`` (``m x r``, like ``like``), uniform in [-0.5, 0.5), the same on every rank."""
        ops = backend(like)
        step = 0 if self.warm_start else ctx.step
        m = self.matrix(ctx.shape)[1]
        return ops.uniform((m, self.rank), seeds.derive(self.seed, ctx.name, step, self.name), like) - 0.5

    def traceable(self) -> bool:
        """Only with warm start and ``start=0``: otherwise the step, frozen in a traced graph, decides."""
        return self.warm_start and self.start == 0

    def held_state(self, record: PowerSGDState, like: Any, ctx: TensorContext) -> PowerSGDState:
        if record.q is None and self.matrix(ctx.shape) is not None:
            return PowerSGDState(self.drawn_q(like, ctx))
        return record

    def project(self, reduced: Sequence[Any], matrix: Any) -> tuple[list[Message], Any]:
        """Round 2: ``P^ = orthogonalize(mean P)`` and ``Q = M^T P^``, sent as ``Q^T = P^^T M`` (``r x m``)."""
        ops = backend(matrix)
        dtype = ops.dtype_name(reduced[0])
        wide = "float64" if dtype == "float64" else "float32"  # no QR takes 16-bit floats (nor keeps them finite)
        p_hat = ops.cast(ops.orthonormalize(ops.cast(reduced[0], wide)), dtype)
        return [Message(ops.matmul(ops.transpose(p_hat), matrix), "average")], p_hat

    def residual(self, tensor: Any, messages: Sequence[Message], p_hat: Any, ctx: TensorContext) -> Any:
        """``M - P^ Q_local^T`` (a new tensor; ``Q_local^T`` is the message sent)."""
        if p_hat is None:
            return super().residual(tensor, messages, p_hat, ctx)
        ops = backend(p_hat)
        matrix = ops.reshape(tensor, (ops.shape(p_hat)[0], -1))
        return ops.reshape(ops.sub_matmul(matrix, p_hat, messages[0].tensor), ctx.shape)

    def decompress(self, reduced: Sequence[Any], p_hat: Any, ctx: TensorContext) -> Any:
        if p_hat is None:
            return reduced[0]
        ops = backend(p_hat)
        out = None if ctx.out is None else ops.reshape(ctx.out, (ops.shape(p_hat)[0], -1))
        return ops.reshape(ops.matmul(p_hat, reduced[0], out), ctx.shape)
