"""Inputs and references shared by the PyTorch and TensorFlow MPI tests of the sketch.

Every rank builds every rank's gradient from one seed, so each rank can
compute the exact dense average that Horovod's allreduce should give.
"""
from __future__ import annotations

import numpy as np

EXACT_SHAPE = (50_000, 8)
EXACT_SPEC = "sketch:ratio=0.25,rows=3"
LOSSY_SHAPE = (2_000, 16)
LOSSY_SPEC = "sketch:error=0.5,density=0.05"


def row_sparse_gradient(rank: int, shape: tuple[int, int], rows: int, integer: bool, seed: int = 7) -> np.ndarray:
    """A gradient with ``rows`` non-zero rows, different on every rank; small integers if ``integer``
    (so every sum is exact and any difference from the dense average is the sketch's)."""
    rng = np.random.default_rng([seed, rank])
    g = np.zeros(shape, dtype=np.float32)
    picked = rng.choice(shape[0], size=rows, replace=False)
    values = rng.integers(-8, 9, size=(rows, shape[1])) if integer else rng.standard_normal((rows, shape[1]))
    g[picked] = values
    return g


def dense_average(size: int, shape: tuple[int, int], rows: int, integer: bool) -> np.ndarray:
    return sum(row_sparse_gradient(r, shape, rows, integer) for r in range(size)) / size


def relative_error(estimate: np.ndarray, truth: np.ndarray) -> float:
    return float(np.linalg.norm(estimate - truth) / np.linalg.norm(truth))


def error_bound(spec_cols: int, truth: np.ndarray) -> float:
    """Three times the count sketch's expected relative error ``sqrt(nnz / cols)`` for one row."""
    return 3 * float(np.sqrt(np.count_nonzero(np.any(truth != 0, axis=1)) * truth.shape[1] / spec_cols))
