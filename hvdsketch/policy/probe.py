"""Probe the link: what one allreduce costs in latency and in bytes per second.

Every rank times allreduces of a tiny tensor and of :data:`PROBE_BYTES` through the gradients' communicator,
all ranks at once, so the link is seen shared as in training. With ``t_s`` and ``t_b`` their median times
(after one untimed round each)::

    latency   = t_s
    bandwidth = 2 (N-1)/N * b / (t_b - t_s)        (bytes one rank sends per second)
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Any

from hvdsketch.collectives import Communicator, reduce
from hvdsketch.compress import Message
from hvdsketch.ops import backend
from hvdsketch.policy.cost import Link, wire_bytes

#: Bytes of the big probe allreduce (a few MB: long enough to time, short enough not to matter).
PROBE_BYTES = 4 << 20


def probe(communicator: Communicator, like: Any, nbytes: int = PROBE_BYTES, repeats: int = 3) -> Link:
    """The :class:`Link` measured on this rank (float32 allreduces on ``like``'s device)."""
    ops = backend(like)
    small = ops.zeros(1, "float32", like)
    big = ops.zeros(max(1, nbytes // 4), "float32", like)

    def typical(tensor: Any) -> float:
        times = []
        for _ in range(repeats + 1):  # the first is untimed
            start = time.perf_counter()
            ops.to_numpy(reduce(communicator, [Message(tensor, "average")], f"hvdsketch.probe.{ops.shape(tensor)[0]}")[0])
            times.append(time.perf_counter() - start)
        return statistics.median(times[1:])

    latency = typical(small)
    if communicator.size == 1:
        return Link(latency, math.inf)  # nothing goes on a wire
    transfer = max(typical(big) - latency, 1e-9)
    return Link(latency, wire_bytes("average", ops.nbytes(big), communicator.size) / transfer)
