"""The balanced exact method over the MPI layer (its alltoallv, counted): the dense average in every
support scenario (tests/exact_cases.py), with numpy arrays and PyTorch tensors."""
import numpy as np
import pytest
import torch

from tests import exact_cases as cases

CONVERT = {"numpy": np.asarray, "torch": torch.from_numpy}


@pytest.mark.parametrize("kind", list(CONVERT))
@pytest.mark.parametrize("flag", cases.FLAGS)
@pytest.mark.parametrize("scenario", cases.SCENARIOS)
def test_equals_the_dense_average(mpi, scenario, flag, kind):
    cases.check(flag, scenario, mpi.size, mpi.rank, mpi, CONVERT[kind])


def test_alltoallv_sends_each_rank_its_piece_and_counts_what_leaves(mpi):
    """Rank r sends q + 1 rows of value 100 r + q to rank q; its own piece never leaves it."""
    size, rank = mpi.size, mpi.rank
    splits = [q + 1 for q in range(size)]
    x = np.concatenate([np.full((q + 1, 3), 100 * rank + q, np.float32) for q in range(size)])
    before = mpi.stats.snapshot().get("alltoall", {"bytes_sent": 0, "bytes_received": 0})
    got = mpi.ialltoallv(x, splits).wait()
    want = np.concatenate([np.full((rank + 1, 3), 100 * q + rank, np.float32) for q in range(size)])
    np.testing.assert_array_equal(got, want)
    after = mpi.stats.snapshot()["alltoall"]
    row = 3 * 4
    assert after["bytes_sent"] - before["bytes_sent"] == (sum(splits) - splits[rank]) * row + 16 * (size - 1)
    assert after["bytes_received"] - before["bytes_received"] == (size - 1) * (rank + 1) * row + 16 * (size - 1)


def test_alltoallv_with_bad_splits_on_one_rank_fails_on_every_rank(mpi):
    x = np.zeros((mpi.size, 2), np.float32)
    splits = [1] * mpi.size if mpi.rank else [2] * mpi.size  # rank 0's do not add up to its rows
    with pytest.raises(ValueError, match="alltoallv"):
        mpi.ialltoallv(x, splits).wait()
