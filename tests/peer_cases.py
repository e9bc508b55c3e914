"""Inputs and references shared by the unit and MPI tests of the peer compressors.

Every rank builds every rank's gradient from one seed. :func:`simulate` runs
one compressor object per simulated rank in a single process, each with its
own state, and performs the collectives in process (mean, rank-ordered
concatenation): the result that Horovod's collectives must reproduce. Where a
method is deterministic, :func:`independent` gives its average from a
from-scratch NumPy formula as well.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pytest

from hvdsketch.collectives import reduce
from hvdsketch.compress import Compressor, TensorContext, create
from hvdsketch.compress.base import Message
from hvdsketch.exchange.flight import Flight
from hvdsketch.compress.state import StateTable
from hvdsketch.exchange import Exchanger
from hvdsketch.memory import Memory
from hvdsketch.ops import backend
from hvdsketch.policy import Policy

NAME = "layer.weight"
NAN_FLAGS = ["topk:ratio=0.05", "dgc:ratio=0.05", "qsgd", "terngrad", "efsignsgd", "powersgd:rank=2"]
STEPS = 3


@dataclass(frozen=True)
class Case:
    flag: str
    shape: tuple[int, ...] = (48, 20)
    low_rank: int | None = None  # the average over ranks then has at most this rank
    memory: bool = False  # error feedback from a residual memory given to the exchanger
    exact: bool = False  # the result must equal the dense average
    rows: int | None = None  # only this many rows non-zero (each rank and step its own), else dense

    def __str__(self) -> str:
        sparse = f"/{self.rows}rows" if self.rows else ""
        return f"{self.flag}{list(self.shape)}{sparse}{'+memory' if self.memory else ''}"


CASES = [
    Case("topk:ratio=0.05"),
    Case("topk:ratio=0.05", memory=True),
    Case("randomk:ratio=0.1"),
    Case("dgc:ratio=0.05,sample=0.25"),
    Case("dgc:ratio=0.05,momentum=0.5,clip=3,sample=1"),
    Case("qsgd:levels=4,bucket=64"),
    Case("terngrad", (7, 5, 3)),
    Case("efsignsgd", (333,)),
    Case("powersgd:rank=2"),
    Case("powersgd:rank=2", (30,)),  # a vector goes dense
    Case("topk:ratio=1", exact=True),
    Case("randomk:ratio=1", (97,), exact=True),
    Case("dgc:ratio=1,sample=1", exact=True),
    Case("powersgd:rank=3", (40, 24), low_rank=3, exact=True),
    Case("union", (400, 8), rows=30, exact=True),
    Case("union", (3000,), rows=2, exact=True),  # a vector: blocks of 256 elements as units
    Case("allgather", (400, 8), rows=30, exact=True),
    Case("allgather", (400, 8), exact=True),  # dense: gathered once, then dense
    Case("allgather:wire=float16", (400, 8), rows=30, memory=True),
    Case("union:error=2,rows=3", (400, 8), rows=30, memory=True),
    Case("balanced", (400, 8), rows=30, exact=True),
    Case("balanced", (3000,), rows=2, exact=True),  # a vector: blocks of 256 elements as units
    Case("balanced", (400, 8), exact=True),  # dense: every row on every rank
    Case("balanced:wire=float16", (400, 8), rows=30, memory=True),
    Case("sketch:error=0.5,rows=3", (2000, 8), rows=20),
    Case("sketch:error=1", (2000, 8), rows=20, memory=True),  # float16 cells: unit tests (sums round by order)
    Case("sketch:error=0.5,block=16", (4096,), rows=40, memory=True),  # a vector: blocks, a dense residual
]


@dataclass(frozen=True)
class World:
    """One rank's view of an MPI test: its place, a communicator, and the framework's conversion
    from NumPy."""

    size: int
    rank: int
    communicator: Any
    convert: Callable[[np.ndarray], Any]


class Given(Policy):
    """Each tensor's compressor by name, as a test gives them."""

    def __init__(self, compressors: dict[str, Compressor]) -> None:
        self.given = compressors

    def compressor(self, ctx: TensorContext) -> Compressor:
        return self.given[ctx.name]

    def compressors(self) -> dict[str, Compressor]:
        return {str(c): c for c in self.given.values()}


def exchanger(communicator: Any, compressors: dict[str, Compressor], memory: Any = None,
              step: int = 0, states: StateTable | None = None, **options: Any) -> Exchanger:
    """An exchanger over ``communicator`` giving each named tensor its compressor, at ``step``, with
    the tensors' states in ``states`` where given (a table kept across exchangers) and the
    exchanger's ``options``."""
    out = Exchanger(Given(compressors), communicator, memory, **options)
    out.step = step
    if states is not None:
        out.table.records = states
    return out


def exchange_jobs(communicator: Any, jobs: Sequence[tuple[Compressor, Any, TensorContext]],
                  memory: Any = None, states: StateTable | None = None, **options: Any) -> list[Any]:
    """The averaged ``(compressor, tensor, ctx)`` jobs, in order, exchanged as one step (the tensors'
    states from ``states`` and back, where given; the exchanger's ``options``)."""
    results = exchanger(communicator, {ctx.name: c for c, _, ctx in jobs}, memory, jobs[0][2].step,
                        states, **options).exchange({ctx.name: t for _, t, ctx in jobs})
    return [results[ctx.name] for _, _, ctx in jobs]


def gradient(rank: int, step: int, case: Case, seed: int = 11) -> np.ndarray:
    """Rank ``rank``'s float32 gradient at ``step``; with ``low_rank`` r, ``A_rank B`` with ``B``
    shared by all ranks, so the average has rank <= r."""
    rng = np.random.default_rng([seed, rank, step])
    if case.rows is not None:  # a vector's "rows" are elements
        g = np.zeros(case.shape, np.float32)
        rows = g.reshape(case.shape[0], -1)
        rows[rng.choice(case.shape[0], case.rows, replace=False)] = rng.standard_normal((case.rows, rows.shape[1]))
        return g
    if case.low_rank is None:
        return rng.standard_normal(case.shape).astype(np.float32)
    shared = np.random.default_rng([seed, step]).standard_normal((case.low_rank, case.shape[1]))
    return (rng.standard_normal((case.shape[0], case.low_rank)) @ shared).astype(np.float32)


def dense_average(size: int, step: int, case: Case) -> np.ndarray:
    return np.mean([gradient(r, step, case).astype(np.float64) for r in range(size)], axis=0)


def reduce_in_process(messages: Sequence[Message], rank: int = 0) -> Any:
    """What a communicator returns to ``rank`` for the same message from every rank (the same to
    every rank, but for an alltoall: the pieces each rank sent ``rank``)."""
    tensors = [m.tensor for m in messages]
    ops = backend(tensors[0])
    if messages[0].op == "alltoall":
        return ops.concat([ops.split(m.tensor, m.splits)[rank] for m in messages])
    if messages[0].op == "allgather":
        return ops.concat(tensors)
    if messages[0].op == "bor":
        return ops.bitwise_or_rows(ops.stack(tensors))
    if messages[0].op in ("average", "sum"):
        total = ops.reduce_sum(ops.stack(tensors), axis=0)
        return total / len(tensors) if messages[0].op == "average" else total
    raise ValueError(f"no in-process reduction for {messages[0].op!r}")


def lockstep(flights: Sequence[Flight], reduce: Callable[[list[list[Message]]], list[Any]] | None = None
             ) -> tuple[list[list[Message]], list[Any]]:
    """Drive one flight per simulated rank in lock step, each round's messages reduced by
    ``reduce(per_rank_messages)`` (default: :func:`reduce_in_process` position by position; an
    alltoall's, which differ by rank, always so); returns
    rank 0's messages of every round and every rank's result."""
    reduce = reduce or (lambda pending: [reduce_in_process(same) for same in zip(*pending)])
    rounds = []
    while True:
        pending = [f.messages for f in flights]
        rounds.append(pending[0])
        for f in flights:
            f.settle()
        reduced = reduce(pending)
        done = [f.advance([reduce_in_process(same, r) if same[0].op == "alltoall" else result
                           for same, result in zip(zip(*pending), reduced)]) for r, f in enumerate(flights)]
        if any(done):
            assert all(done), "ranks disagree on the number of rounds"
            return rounds, [f.result for f in flights]


def simulate(case: Case, size: int, convert: Callable[[np.ndarray], Any], steps: int = STEPS,
             name: str = NAME) -> list[list[Any]]:
    """``results[t][r]``: rank ``r``'s result at step ``t``, every rank running its own compressor, with
    its own residual memory where the exchanger would keep one (the case's, or the method's own) and its
    own state table."""
    compressor = create(case.flag)
    memories = [Memory() if case.memory or compressor.feedback else None for _ in range(size)]
    tables = [StateTable() for _ in range(size)]
    return [lockstep([Flight(compressor, convert(gradient(r, t, case)), TensorContext(name, case.shape, t, size, r),
                             memories[r], tables[r]) for r in range(size)])[1]
            for t in range(steps)]


def topk_average(size: int, case: Case, ratio: float) -> np.ndarray:
    """Mean over ranks of each rank's gradient with all but its ceil(ratio n) largest magnitudes zeroed."""
    total = np.zeros(int(np.prod(case.shape)))
    for r in range(size):
        g = gradient(r, 0, case).astype(np.float64).reshape(-1)
        keep = np.argsort(-np.abs(g), kind="stable")[:int(np.ceil(ratio * g.size))]
        total[keep] += g[keep]
    return (total / size).reshape(case.shape)


def efsign_average(size: int, case: Case) -> np.ndarray:
    """Mean over ranks of ``||g||_1 / d * sign(g)`` (sign(0) = +1), the first step of EF-SignSGD."""
    grads = [gradient(r, 0, case).astype(np.float64) for r in range(size)]
    return np.mean([np.abs(g).mean() * np.where(g >= 0, 1.0, -1.0) for g in grads], axis=0)


def independent(case: Case, size: int) -> np.ndarray | None:
    """A from-scratch NumPy reference for the first step of a deterministic lossy case."""
    if case.flag.startswith("topk:") and not case.memory:
        return topk_average(size, case, float(case.flag.split("=")[1]))
    if case.flag == "efsignsgd":
        return efsign_average(size, case)
    return None


def assert_close(actual: np.ndarray, desired: np.ndarray, what: str) -> None:
    """Equal up to float32 rounding, relative to the largest entry (PowerSGD's QR amplifies it)."""
    np.testing.assert_allclose(actual, desired, rtol=1e-4, atol=1e-4 * float(np.abs(desired).max()), err_msg=what)


def check_exchange(case: Case, world: World) -> None:
    """Run ``case`` for :data:`STEPS` steps through the exchanger over ``world``'s communicator and
    compare every step with :func:`simulate` (and :func:`independent`); check every rank ends with
    the same bits."""
    size, rank, convert = world.size, world.rank, world.convert
    reference = simulate(case, size, convert)
    first = independent(case, size)
    steps = exchanger(world.communicator, {NAME: create(case.flag)}, Memory() if case.memory else None)
    for t in range(STEPS):
        got = steps.exchange({NAME: convert(gradient(rank, t, case))})[NAME]
        ops = backend(got)
        assert ops.shape(got) == case.shape
        result = ops.to_numpy(got)
        assert_close(result, ops.to_numpy(reference[t][rank]), f"{case} step {t} against the simulation")
        if case.exact:
            assert_close(result, dense_average(size, t, case), f"{case} step {t} against the dense average")
        elif t == 0 and first is not None:
            assert_close(result, first, f"{case} against the NumPy formula")
        (everyone,) = reduce(world.communicator, [Message(ops.flatten(got), "allgather")], "test.copies")
        copies = ops.to_numpy(everyone).reshape(size, -1)
        assert (copies == copies[0]).all(), f"{case}: ranks hold different results at step {t}"


def check_lock_step(world: World) -> None:
    """All cases' tensors in one step of the exchanger (one or two rounds, allgathers and
    allreduces) give each case's simulated first step."""
    picked = [case for case in CASES if not case.memory]
    jobs = [(create(case.flag), world.convert(gradient(world.rank, 0, case)),
             TensorContext(str(case), case.shape, 0, world.size, world.rank)) for case in picked]
    for case, got in zip(picked, exchange_jobs(world.communicator, jobs)):
        expected = simulate(case, world.size, world.convert, steps=1, name=str(case))[0][world.rank]
        assert_close(backend(got).to_numpy(got), backend(expected).to_numpy(expected), f"{case} in lock step")


def check_nan_fails_everywhere(flag: str, world: World, error: type) -> None:
    """A NaN in the last rank's gradient comes back NaN on every rank by default (for a loss scaler to
    skip the step); with ``error_if_nonfinite`` the exchange raises ``error`` on every rank; none hangs."""
    g = gradient(world.rank, 0, Case(flag))
    if world.rank == world.size - 1:
        g[5, 5] = np.nan
    job = (create(flag), world.convert(g), TensorContext(NAME, g.shape, 0, world.size, world.rank))
    (handed,) = exchange_jobs(world.communicator, [job])
    assert not np.isfinite(backend(handed).to_numpy(handed)).all()
    with pytest.raises(error, match="NaN or Inf"):
        exchange_jobs(world.communicator, [job], error_if_nonfinite=True)
