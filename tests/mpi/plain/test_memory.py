"""Error feedback through the exchanger over hvdsketch's MPI layer, on every rank.

Each rank holds its own shard of a least-squares problem (different data, so at
the optimum the ranks' gradients cancel but their top-k parts do not) and trains
with top-k compression and a residual memory. Every rank computes the same
averaged gradient, so the replicas stay bit-identical.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from hvdsketch.collectives.mpi import MPICommunicator
from hvdsketch.compress import TensorContext
from hvdsketch.compress import create as compressor
from hvdsketch.memory import Memory, create
from tests.peer_cases import exchange_jobs

SHAPES = {"w": (40, 5), "v": (40, 5), "b": (20,)}  # two of one shape, for the planner's shared groups
D = sum(int(np.prod(s)) for s in SHAPES.values())


def shard(rank: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + rank)
    a = rng.standard_normal((400, D))
    return a, rng.standard_normal(400) + 3 * rng.standard_normal()


def optimum(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = np.concatenate([shard(r)[0] for r in range(size)])
    b = np.concatenate([shard(r)[1] for r in range(size)])
    return a, b, np.linalg.lstsq(a, b, rcond=None)[0]


def train(mpi: MPICommunicator, memory: Memory | None, x: np.ndarray, steps: range) -> np.ndarray:
    """SGD on this rank's shard; gradients exchanged per tensor with top-5% and ``memory``."""
    topk = compressor("topk:ratio=0.05")
    a, b = shard(mpi.rank)
    for step in steps:
        grad = np.split(a.T @ (a @ x - b) / len(b), np.cumsum([np.prod(s) for s in SHAPES.values()])[:-1])
        jobs = [(topk, g.reshape(shape).astype(np.float32), TensorContext(name, shape, step, mpi.size))
                for (name, shape), g in zip(SHAPES.items(), grad)]
        averaged = exchange_jobs(mpi, jobs, memory)
        x = x - 0.1 / (1 + step / 100) * np.concatenate([g.reshape(-1) for g in averaged]).astype(np.float64)
    return x


def test_error_feedback_converges_across_ranks_where_plain_topk_stalls(mpi, comm):
    a, b, x_star = optimum(mpi.size)

    def excess(x):
        return 0.5 * np.mean((a @ x - b) ** 2) - 0.5 * np.mean((a @ x_star - b) ** 2)

    plain = train(mpi, None, np.zeros(D), range(400))
    feedback = train(mpi, create("fp32"), np.zeros(D), range(400))
    for x in (plain, feedback):
        gathered = comm.allgather(x)
        assert all(np.array_equal(gathered[0], other) for other in gathered)  # replicas agree bit for bit
    assert excess(feedback) < 1e-2 * excess(plain)


@pytest.mark.parametrize("flag", ["fp32", "fp16", "topk:ratio=0.3", "shared", "plan:budget=0.3,warmup=2"])
def test_resume_from_state_dict_is_bit_identical_to_the_uninterrupted_run(mpi, flag):
    uninterrupted = train(mpi, create(flag), np.zeros(D), range(8))
    first = create(flag)
    x = train(mpi, first, np.zeros(D), range(4))
    saved = pickle.dumps((x, first.state_dict()))  # as a checkpoint would hold it
    x, state = pickle.loads(saved)
    resumed = create(flag)
    resumed.load_state_dict(state)
    np.testing.assert_array_equal(train(mpi, resumed, x, range(4, 8)), uninterrupted)
