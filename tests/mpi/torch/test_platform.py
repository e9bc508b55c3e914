"""Horovod's PyTorch collectives give exact values, and mpi4py runs beside them."""
import numpy as np
import pytest
import torch
from mpi4py import MPI


def test_allreduce_sum_and_average_are_exact(hvd):
    n = hvd.size()
    x = torch.arange(6, dtype=torch.float32) + hvd.rank()
    expected = torch.arange(6, dtype=torch.float32) * n + sum(range(n))
    assert torch.equal(hvd.allreduce(x, op=hvd.Sum, name="platform.sum"), expected)
    assert torch.equal(hvd.allreduce(x * n, op=hvd.Average, name="platform.avg"), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_allgather_concatenates_varying_sizes(hvd, dtype):
    rank, n = hvd.rank(), hvd.size()
    mine = torch.full((rank + 1, 2), rank, dtype=dtype)
    gathered = hvd.allgather(mine, name=f"platform.gather.{dtype}")
    expected = torch.cat([torch.full((r + 1, 2), r, dtype=dtype) for r in range(n)])
    assert torch.equal(gathered, expected)


def test_mpi4py_interleaves_with_horovod_async(hvd, comm):
    """100 iterations of Horovod async allreduce overlapped with mpi4py on a duplicated
    communicator, including a bitwise-OR allreduce of packed bits; no deadlock, right answers."""
    rank, n = hvd.rank(), hvd.size()
    assert comm.Get_size() == n and comm.Get_rank() == rank
    assert comm != MPI.COMM_WORLD
    for step in range(100):
        handle = hvd.allreduce_async(torch.full((1000,), float(rank + step)), op=hvd.Sum, name=f"inter.{step}")
        bits = np.zeros(64, dtype=bool)
        bits[(rank * 7 + step) % 64] = True
        packed = np.packbits(bits)
        union = np.empty_like(packed)
        comm.Allreduce(packed, union, op=MPI.BOR)
        total = comm.allreduce(rank * step, op=MPI.SUM)
        want = np.zeros(64, dtype=bool)
        want[[(r * 7 + step) % 64 for r in range(n)]] = True
        assert np.array_equal(np.unpackbits(union).astype(bool), want)
        assert total == step * n * (n - 1) // 2
        result = hvd.synchronize(handle)
        assert torch.all(result == sum(r + step for r in range(n)))
