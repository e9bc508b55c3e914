"""Every compressor through hvdsketch's exchange over the MPI layer (numpy arrays and PyTorch tensors)
matches the in-process reference built from all ranks' inputs (tests/peer_cases.py); the exact
sparse methods equal the dense average."""
import numpy as np
import pytest
import torch

from hvdsketch.compress.base import Message
from tests import peer_cases as cases

CONVERT = {"numpy": np.asarray, "torch": torch.from_numpy}


@pytest.fixture(params=list(CONVERT))
def world(request, mpi):
    return cases.World(mpi.size, mpi.rank, mpi, CONVERT[request.param])


@pytest.mark.parametrize("case", cases.CASES, ids=str)
def test_matches_reference(world, case):
    cases.check_exchange(case, world)


def test_all_compressors_in_one_lock_step_exchange(world):
    cases.check_lock_step(world)


@pytest.mark.parametrize("flag", cases.NAN_FLAGS + ["union", "allgather", "sketch:density=0.5"])
def test_a_nan_on_one_rank_fails_on_every_rank(world, flag):
    cases.check_nan_fails_everywhere(flag, world, FloatingPointError)


def test_bfloat16_tensors_travel_as_bfloat16(mpi):
    x = torch.full((1000,), 1.5, dtype=torch.bfloat16)
    mpi.stats.reset()
    (out,) = mpi.start([Message(x, "average")], "bf16").wait()
    assert out.dtype == torch.bfloat16 and torch.equal(out, x)
    sent = mpi.stats.snapshot()["allreduce.average"]["bytes_sent"]
    assert sent <= 2 * 1000 * 2  # 2 bytes an element on the wire

