"""What launch/cluster.sh's links carry, measured with plain mpi4py; run as its ranks.

::

    launch/cluster.sh --rate 200mbit -np 4 -- python tests/cluster_probe.py --mb 10 --repeat 3

Rank 0 prints one JSON line:

- ``allreduce_s``: the median time of ``comm.Allreduce`` of MB megabytes of float32 (the ring
  algorithm if the caller forces it with ``OMPI_MCA_coll_tuned_*``), and its model
  ``allreduce_model_s``: a ring allreduce of S bytes at N ranks moves 2 (N-1)/N S through every
  rank's upload and download, so it takes 2 (N-1)/N S / R on per-rank links and N times that,
  2 (N-1) S / R, on one link shared by all ranks;
- ``p2p_mbit``: rank 0 sending the buffer to rank 1, alone on the network: one link's rate;
- ``ring_mbit``: every rank sending the buffer to the next one at the same time, the slowest
  rank's throughput: R on per-rank links, R / N on one shared link (``link_mbit_model``).

The two rates are the fastest of the repeats (what a link can carry: a busy CPU on this shared
machine only ever slows a transfer down), the allreduce's time their median.

R is the TCP payload a link carries: ``HVDSKETCH_CLUSTER_RATE`` (tc's units: kbit, mbit, gbit)
times ``wire_efficiency``, (MTU - 52) / (MTU + 14), as tbf counts whole Ethernet frames and each
carries 52 bytes of IP and TCP headers (with timestamps): 0.956 at MTU 1500.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time

import numpy as np
from mpi4py import MPI

UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def bits_per_second(rate: str) -> float:
    if rate == "none":  # unshaped: the models are 0 s and infinite rates
        return float("inf")
    match = re.fullmatch(r"([0-9.]+)([kmgt]?)bit", rate.lower())
    if not match:
        raise ValueError(f"rate {rate!r} is not N[k|m|g]bit")
    return float(match.group(1)) * UNITS[match.group(2)]


def link_mtu() -> int:
    """The MTU of this namespace's link: eth0 on per-rank links, else the loopback."""
    for dev in ("eth0", "lo"):
        path = f"/sys/class/net/{dev}/mtu"
        if os.path.exists(path):
            return int(open(path).read())
    return 1500


def timed(comm: MPI.Comm, fn) -> float:
    """Seconds from a common start until every rank is done with fn."""
    comm.Barrier()
    start = time.perf_counter()
    fn()
    return comm.allreduce(time.perf_counter() - start, op=MPI.MAX)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=10, help="buffer size in MB (10^6 bytes)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    nbytes = int(args.mb * 1e6) // 4 * 4
    send = np.ones(nbytes // 4, np.float32)
    recv = np.empty_like(send)
    mtu = link_mtu()
    efficiency = (mtu - 52) / (mtu + 14)
    payload = bits_per_second(os.environ["HVDSKETCH_CLUSTER_RATE"]) * efficiency
    links = os.environ.get("HVDSKETCH_CLUSTER_LINKS", "per-rank")
    sharing = size if links == "shared" else 1  # ranks moving data at once through one link

    comm.Allreduce(send, recv)  # connections up and their TCP windows open before anything is timed
    allreduce = [timed(comm, lambda: comm.Allreduce(send, recv)) for _ in range(args.repeat)]

    def p2p() -> None:
        if rank == 0:
            comm.Send(send, dest=1)
        elif rank == 1:
            comm.Recv(recv, source=0)

    def ring() -> None:
        comm.Sendrecv(send, dest=(rank + 1) % size, recvbuf=recv, source=(rank - 1) % size)

    p2p_s = [timed(comm, p2p) for _ in range(args.repeat)] if size > 1 else [float("nan")]
    ring_s = [timed(comm, ring) for _ in range(args.repeat)]
    if rank == 0:
        print(json.dumps({
            "ranks": size, "bytes": nbytes, "links": links, "mtu": mtu,
            "rate_mbit": payload / efficiency / 1e6, "wire_efficiency": efficiency,
            "allreduce_s": statistics.median(allreduce), "allreduce_all_s": allreduce,
            "allreduce_model_s": 2 * (size - 1) / size * nbytes * 8 * sharing / payload,
            "p2p_mbit": nbytes * 8 / min(p2p_s) / 1e6, "p2p_mbit_model": payload / 1e6,
            "ring_mbit": nbytes * 8 / min(ring_s) / 1e6,
            "link_mbit_model": payload / sharing / 1e6,
        }), flush=True)


if __name__ == "__main__":
    main()
