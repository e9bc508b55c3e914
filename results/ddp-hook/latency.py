"""One small collective's round trip over gloo (torch.distributed) and over MPI (mpi4py), in one run.

    bash launch/cluster.sh --rate 1gbit -np 2 -- python results/ddp-hook/latency.py

Each line: the mean call of each of 5 batches of 200 calls, their median (min..max over the batches),
after 30 warm-up calls; then the median and the 90th percentile of the 1,000 single calls (a collective
that waits for a thread to be scheduled shows there as a tail a few milliseconds long).
"""
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from hvdsketch.lab.bench.ddp import _store


def timed(call, batches: int = 5, calls: int = 200) -> str:
    for _ in range(30):
        call()
    times, single = [], []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(calls):
            before = time.perf_counter()
            call()
            single.append((time.perf_counter() - before) * 1e6)
        times.append((time.perf_counter() - start) / calls * 1e6)
    p50, p90 = np.percentile(single, [50, 90])
    return (f"{statistics.median(times):8.0f} us ({min(times):.0f}..{max(times):.0f}); "
            f"single calls: median {p50:.0f}, 90th percentile {p90:.0f} us")


def direct(gathered: list[torch.Tensor], mine: torch.Tensor) -> None:
    """An all_gather as one isend and one irecv per peer (gloo runs point-to-point on the caller's thread)."""
    rank = dist.get_rank()
    works = [work for peer in range(len(gathered)) if peer != rank
             for work in (dist.isend(mine, peer), dist.irecv(gathered[peer], peer))]
    gathered[rank].copy_(mine)
    for work in works:
        work.wait()


def main() -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=_store(rank, size), rank=rank, world_size=size)
    small, got = np.zeros(8, np.int64), np.empty(8, np.int64)
    tensor = torch.zeros(8, dtype=torch.int64)
    parts = [torch.empty_like(tensor) for _ in range(size)]
    rows = torch.zeros(1400 * 65 * 4, dtype=torch.uint8)  # a fastText step's allgather: 1,400 rows of 64 + index
    gathered = [torch.empty_like(rows) for _ in range(size)]
    every = np.empty(size * rows.numel(), np.uint8)
    cases = [("MPI Allreduce, 8 int64", lambda: comm.Allreduce(small, got)),
             ("gloo all_reduce, 8 int64", lambda: dist.all_reduce(tensor)),
             ("gloo all_gather, 8 int64", lambda: dist.all_gather(parts, tensor)),
             ("gloo isend/irecv, 8 int64", lambda: direct(parts, tensor)),
             ("MPI Allgather, 364 KB", lambda: comm.Allgather(rows.numpy(), every)),
             ("gloo all_gather, 364 KB", lambda: dist.all_gather(gathered, rows)),
             ("gloo isend/irecv, 364 KB", lambda: direct(gathered, rows))]
    for name, call in cases:
        line = timed(call)
        if rank == 0:
            print(f"{name:28s} {line}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
