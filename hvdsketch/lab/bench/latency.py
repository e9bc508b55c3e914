"""One small collective's round trip over gloo (torch.distributed) and over MPI (mpi4py), in one run.

::

    launch/cluster.sh --rate 1gbit -np 2 -- hvdsketch bench latency

Every rank times the same calls in the same processes, on the same links: MPI's
``Allreduce`` and gloo's ``all_reduce`` and ``all_gather`` of 8 int64, gloo's
``all_gather`` as one ``isend`` and ``irecv`` per peer, and an allgather of
fastText's rows a step (364 KB) by MPI and by gloo both ways. For each, rank 0
prints the mean call of each of ``--batches`` batches of ``--calls`` calls,
their median (min..max over the batches), after ``--warmup`` calls; then the
median and the 90th percentile of the single calls (a collective that waits for
a thread to be scheduled shows there as a tail). The ranks and the gloo
rendezvous are :mod:`hvdsketch.lab.bench.ddp`'s.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

#: A fastText step's allgather: 1,400 rows of 64 float32 and their index.
ROWS_BYTES = 1400 * 65 * 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", type=int, default=5, help="batches of calls timed (default 5)")
    parser.add_argument("--calls", type=int, default=200, help="calls a batch (default 200)")
    parser.add_argument("--warmup", type=int, default=30, help="calls before timing (default 30)")


def timed(call: Callable[[], Any], batches: int, calls: int, warmup: int) -> str:
    """A line: the median mean call over ``batches`` of ``calls`` (min..max), and the median and
    90th percentile of the single calls, in microseconds."""
    import numpy as np

    for _ in range(warmup):
        call()
    means, single = [], []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(calls):
            before = time.perf_counter()
            call()
            single.append((time.perf_counter() - before) * 1e6)
        means.append((time.perf_counter() - start) / calls * 1e6)
    p50, p90 = np.percentile(single, [50, 90])
    return (f"{statistics.median(means):8.0f} us ({min(means):.0f}..{max(means):.0f}); "
            f"single calls: median {p50:.0f}, 90th percentile {p90:.0f} us")


def point_to_point(gathered: list[Any], mine: Any) -> None:
    """An all_gather as one ``isend`` and one ``irecv`` per peer (gloo runs point-to-point on the
    caller's thread)."""
    import torch.distributed as dist

    rank = dist.get_rank()
    works = [work for peer in range(len(gathered)) if peer != rank
             for work in (dist.isend(mine, peer), dist.irecv(gathered[peer], peer))]
    gathered[rank].copy_(mine)
    for work in works:
        work.wait()


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    from hvdsketch.lab.bench.ddp import gloo_group, launch_env

    if min(args.batches, args.calls) < 1 or args.warmup < 0:
        raise SystemExit("hvdsketch bench latency: --batches and --calls must be >= 1, --warmup >= 0")
    rank, size, _ = launch_env()
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    with gloo_group(rank, size):
        small, got = np.zeros(8, np.int64), np.empty(8, np.int64)
        tensor = torch.zeros(8, dtype=torch.int64)
        parts = [torch.empty_like(tensor) for _ in range(size)]
        rows = torch.zeros(ROWS_BYTES, dtype=torch.uint8)
        gathered = [torch.empty_like(rows) for _ in range(size)]
        every = np.empty(size * rows.numel(), np.uint8)
        cases = [("MPI Allreduce, 8 int64", lambda: comm.Allreduce(small, got)),
                 ("gloo all_reduce, 8 int64", lambda: dist.all_reduce(tensor)),
                 ("gloo all_gather, 8 int64", lambda: dist.all_gather(parts, tensor)),
                 ("gloo isend/irecv, 8 int64", lambda: point_to_point(parts, tensor)),
                 ("MPI Allgather, 364 KB", lambda: comm.Allgather(rows.numpy(), every)),
                 ("gloo all_gather, 364 KB", lambda: dist.all_gather(gathered, rows)),
                 ("gloo isend/irecv, 364 KB", lambda: point_to_point(gathered, rows))]
        for name, call in cases:
            line = timed(call, args.batches, args.calls, args.warmup)
            if rank == 0:
                print(f"{name:28s} {line}", flush=True)
    return 0
