"""Supports that test an exact sparse method, shared by the unit and MPI tests.

Each scenario gives every rank's rows of a ``SHAPE`` row-sparse gradient (small
integers, so every sum is exact in float32 and float16 alike): rows no two
ranks share, rows every rank shares, the last rank empty, every rank empty,
and supports whose union is every row (each rank a part, and each rank all).
Every rank builds every rank's gradient, so each can compute the dense average
the exchange must give bit for bit.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from hvdsketch.compress import RowSparse, TensorContext, create
from hvdsketch.ops import backend
from tests.peer_cases import exchange_jobs

SHAPE = (600, 4)
SCENARIOS = ("disjoint", "overlap", "one_empty", "all_empty", "union_is_every_row", "every_row_everywhere")
FLAGS = ("balanced", "balanced:wire=float16")


def rows_of(scenario: str, rank: int, size: int) -> np.ndarray:
    """The sorted rows rank ``rank`` of ``size`` touches in ``scenario``."""
    rng = np.random.default_rng([3, rank])
    every = np.arange(SHAPE[0])
    if scenario == "disjoint":
        return every[every % size == rank][::3]
    if scenario == "overlap":
        return np.random.default_rng(3).choice(SHAPE[0], 50, replace=False)
    if scenario == "one_empty":
        return np.zeros(0, np.int64) if rank == size - 1 else rng.choice(SHAPE[0], 50, replace=False)
    if scenario == "all_empty":
        return np.zeros(0, np.int64)
    if scenario == "union_is_every_row":  # each rank its stripe and a random 100 more
        return np.union1d(every[every % size == rank], rng.choice(SHAPE[0], 100, replace=False))
    if scenario == "every_row_everywhere":
        return every
    raise ValueError(scenario)


def gradient(scenario: str, rank: int, size: int) -> np.ndarray:
    """Rank ``rank``'s dense gradient: its rows hold small positive integers."""
    g = np.zeros(SHAPE, np.float32)
    rows = np.sort(rows_of(scenario, rank, size))
    values = np.random.default_rng([5, rank]).integers(1, 5, (len(rows), SHAPE[1]))  # no sum cancels to zero
    g[rows] = values
    return g


def dense_average(scenario: str, size: int) -> np.ndarray:
    return sum(gradient(scenario, r, size) for r in range(size)) / size


def row_sparse(scenario: str, rank: int, size: int, convert: Callable[[np.ndarray], Any]) -> RowSparse:
    """Rank ``rank``'s gradient as rows (each given twice, halves of it, as autograd gives a word twice)."""
    g = gradient(scenario, rank, size)
    rows = np.sort(rows_of(scenario, rank, size)).astype(np.int64)
    return RowSparse(convert(np.tile(rows, 2)), convert(np.tile(g[rows] / 2, (2, 1))), SHAPE)


def check(flag: str, scenario: str, size: int, rank: int, communicator: Any,
          convert: Callable[[np.ndarray], Any]) -> Any:
    """The exchange of ``scenario``'s gradient by ``flag`` over ``communicator`` equals the dense
    average, as rows: the result (for more checks)."""
    ctx = TensorContext("emb.weight", SHAPE, 1, size, rank)
    (out,) = exchange_jobs(communicator, [(create(flag), row_sparse(scenario, rank, size, convert), ctx)])
    assert isinstance(out, RowSparse)
    ops = backend(out.values)
    truth = dense_average(scenario, size)
    np.testing.assert_array_equal(ops.to_numpy(out.to_dense()), truth, err_msg=f"{flag} {scenario}")
    np.testing.assert_array_equal(np.sort(ops.to_numpy(out.indices)), np.flatnonzero(np.any(truth != 0, axis=1)))
    return out
