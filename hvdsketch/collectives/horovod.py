"""Horovod's collectives as a communicator, for either framework.

``average`` and ``max`` messages go through ``hvd.grouped_allreduce`` (one
fused collective per op and dtype); ``allgather`` through ``hvd.allgather`` (sizes may
differ by rank); ``bor`` through an allgather folded with bitwise OR, since
Horovod has no bitwise reduction.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Sequence

from hvdsketch.collectives.stats import CommStats, ring_allreduce_bytes
from hvdsketch.compress.base import Message
from hvdsketch.ops import backend


class HorovodCommunicator:
    """Reduce messages with ``hvd`` = ``horovod.torch`` or ``horovod.tensorflow``."""

    def __init__(self, hvd: ModuleType) -> None:
        self.hvd = hvd
        self.stats = CommStats()

    @property
    def rank(self) -> int:
        return self.hvd.rank()

    @property
    def size(self) -> int:
        return self.hvd.size()

    def reduce(self, messages: Sequence[Message]) -> list[Any]:
        out: list[Any] = [None] * len(messages)
        groups: dict[tuple[str, str], list[int]] = {}  # one grouped allreduce per op and dtype (TF needs one dtype)
        for i, m in enumerate(messages):
            if m.op in ("average", "max"):
                groups.setdefault((m.op, backend(m.tensor).dtype_name(m.tensor)), []).append(i)
        for (op, _), picked in groups.items():
            tensors = [messages[i].tensor for i in picked]
            hvd_op = self.hvd.Average if op == "average" else self.hvd.Max
            for i, result in zip(picked, self.hvd.grouped_allreduce(tensors, op=hvd_op)):
                out[i] = result
            nbytes = sum(backend(t).nbytes(t) for t in tensors)
            wire = ring_allreduce_bytes(nbytes, self.size)
            self.stats.record(f"allreduce.{op}", wire, wire)
        for i, m in enumerate(messages):
            if m.op in ("allgather", "bor"):
                ops = backend(m.tensor)
                gathered = self.hvd.allgather(m.tensor)
                sent, total = ops.nbytes(m.tensor), ops.nbytes(gathered)
                # a graph-mode allgather's size is known only at run time: count equal shares
                received = sent * (self.size - 1) if total is None else total - sent
                self.stats.record(m.op, sent * (self.size - 1), received)
                out[i] = gathered if m.op == "allgather" else ops.bitwise_or_rows(
                    ops.reshape(gathered, (self.size, -1)))
            elif m.op not in ("average", "max"):
                raise ValueError(f"hvdsketch: unknown reduction op {m.op!r}")
        return out
