"""Error feedback that stays sparse: a residual lives only where this rank sent or held values."""
from __future__ import annotations

import numpy as np
import pytest

from dataclasses import dataclass
from typing import ClassVar

from hvdsketch.compress import RowSparse, TensorContext, create
from hvdsketch.compress.sketch import SparseSketch
from hvdsketch.exchange.flight import Flight
from hvdsketch.memory import Memory
from tests.peer_cases import lockstep

SHAPE = (2000, 8)


def rows_of(seed: int, count: int) -> np.ndarray:
    return np.sort(np.random.default_rng(seed).choice(SHAPE[0], count, replace=False))


def gradient(rows: np.ndarray, seed: int) -> np.ndarray:
    g = np.zeros(SHAPE, np.float32)
    g[rows] = np.random.default_rng(seed).standard_normal((len(rows), SHAPE[1]))
    return g


def residual_rows(memory: Memory, name: str) -> set[int]:
    """The rows ``memory`` holds a residual on for ``name``: the non-zero rows of a dense residual,
    the rows of a row-sparse one."""
    slot = memory.state_dict()["slots"].get(name)
    if slot is None:
        return set()
    if "e" in slot:
        e = np.asarray(slot["e"]).reshape(SHAPE[0], -1)
        return set(np.flatnonzero(np.any(e != 0, axis=1)).tolist())
    return set(np.asarray(slot["ri" if "ri" in slot else "i"]).tolist())


def reduce_by_op(pending):
    out = []
    for same in zip(*pending):
        tensors = [m.tensor for m in same]
        out.append(np.bitwise_or.reduce(tensors) if same[0].op == "bor" else
                   np.concatenate(tensors) if same[0].op == "allgather" else np.mean(tensors, axis=0))
    return out


@pytest.mark.parametrize("flag", ["sketch:error=0.5", "sketch:error=0.5,density=0.02", "sketch:error=1,rows=3",
                                  "union:error=2"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "rowsparse"])
def test_residual_support_stays_within_what_was_sent_or_held(flag, sparse):
    """Two ranks with disjoint rows, five steps of error feedback: each rank's residual is non-zero
    only on rows it sent this step or held from before, never on the other rank's rows."""
    size = 2
    compressors = [create(flag) for _ in range(size)]
    memories = [Memory() for _ in range(size)]
    held = [set() for _ in range(size)]
    for step in range(5):
        sent = [rows_of(100 * step + r, 30) for r in range(size)]
        sent[1] = np.setdiff1d(sent[1], sent[0])
        grads = [gradient(sent[r], 7 * step + r) for r in range(size)]
        tensors = [RowSparse(sent[r], grads[r][sent[r]], SHAPE) if sparse else grads[r] for r in range(size)]
        flights = [Flight(c, t, TensorContext("emb", SHAPE, step, size, r), m)
                   for r, (c, t, m) in enumerate(zip(compressors, tensors, memories))]
        lockstep(flights, reduce_by_op)
        for r in range(size):
            now = residual_rows(memories[r], "emb")
            allowed = held[r] | set(sent[r].tolist())
            assert now <= allowed, f"step {step} rank {r}: residual on rows {sorted(now - allowed)[:5]} never sent"
            held[r] = now


@dataclass(frozen=True)
class Spy(SparseSketch):
    """The sketch, noting the kind of tensor each exchange is given."""

    seen: ClassVar[list] = []

    def exchange(self, tensor, ctx):
        Spy.seen.append(type(tensor))
        return (yield from super().exchange(tensor, ctx))


@pytest.mark.parametrize("store", ["fp32", "topk:ratio=0.05", "sketch:ratio=0.2"])
def test_row_sparse_gradients_stay_row_sparse_through_error_feedback(store):
    """The exchanger hands a row-sparse gradient to the sketch as rows although a memory keeps its
    residual; fp32 keeps every row the residual has, topk:ratio the rows of largest norm (at most
    ratio x elements: a bounded support however many rows earlier steps touched), sketch its cells."""
    from hvdsketch.collectives.mpi import MPICommunicator
    from hvdsketch.memory import create as create_memory
    from tests.peer_cases import exchanger

    memory = create_memory(store)
    steps = exchanger(MPICommunicator(), {"emb": Spy(error=1.0)}, memory)
    Spy.seen.clear()
    for step in range(4):
        rows = rows_of(50 * step, 40)
        out = steps.exchange({"emb": RowSparse(rows, gradient(rows, step)[rows], SHAPE)})["emb"]
        assert step == 0 or isinstance(out, RowSparse)
        if store.startswith("topk") and step > 0:  # the first exchange is dense: nothing left out
            assert 0 < len(residual_rows(memory, "emb")) <= int(np.ceil(0.05 * SHAPE[0]))
    assert Spy.seen == [RowSparse] * 4
