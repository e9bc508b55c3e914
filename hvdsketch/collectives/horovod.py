"""Horovod's collectives as a communicator, for either framework.

A round's messages are grouped by kind and dtype (TensorFlow's grouped ops
take one dtype): ``average`` and ``max`` messages go through
``hvd.grouped_allreduce``, ``allgather`` (sizes may differ by rank) and
``bor`` (an allgather folded with bitwise OR, since Horovod has no bitwise
reduction) through ``hvd.grouped_allgather``. With PyTorch every group is
started asynchronously before any is waited for, so Horovod negotiates and
fuses the whole round in one cycle instead of one blocking call after
another; TensorFlow's ops are scheduled by TensorFlow.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Sequence

from hvdsketch.collectives.stats import CommStats, ring_allreduce_bytes
from hvdsketch.compress.base import Message
from hvdsketch.ops import backend

#: The reduction ops and the Horovod collective each travels in.
KINDS = {"average": "allreduce", "max": "allreduce", "allgather": "allgather", "bor": "allgather"}


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
        groups: dict[tuple[str, str, str], list[int]] = {}  # (collective, op, dtype) -> message indices
        for i, m in enumerate(messages):
            if m.op not in KINDS:
                raise ValueError(f"hvdsketch: unknown reduction op {m.op!r}")
            op = m.op if KINDS[m.op] == "allreduce" else "gather"
            groups.setdefault((KINDS[m.op], op, backend(m.tensor).dtype_name(m.tensor)), []).append(i)
        started = [(key, picked, self._start(key[0], key[1], [messages[i].tensor for i in picked]))
                   for key, picked in groups.items()]
        out: list[Any] = [None] * len(messages)
        for (collective, op, _), picked, handle in started:
            results = self.hvd.synchronize(handle) if self._asynchronous else handle
            tensors = [messages[i].tensor for i in picked]
            if collective == "allreduce":
                wire = ring_allreduce_bytes(sum(backend(t).nbytes(t) for t in tensors), self.size)
                self.stats.record(f"allreduce.{op}", wire, wire)
                for i, result in zip(picked, results):
                    out[i] = result
                continue
            for i, gathered in zip(picked, results):
                m, ops = messages[i], backend(messages[i].tensor)
                sent, total = ops.nbytes(m.tensor), ops.nbytes(gathered)
                # a graph-mode allgather's size is known only at run time: count equal shares
                received = sent * (self.size - 1) if total is None else total - sent
                self.stats.record(m.op, sent * (self.size - 1), received)
                out[i] = gathered if m.op == "allgather" else ops.bitwise_or_rows(
                    ops.reshape(gathered, (self.size, -1)))
        return out

    @property
    def _asynchronous(self) -> bool:
        return hasattr(self.hvd, "grouped_allgather_async")  # horovod.torch

    def _start(self, collective: str, op: str, tensors: list[Any]) -> Any:
        """A handle of the group's collective (PyTorch), or its results (TensorFlow)."""
        if collective == "allreduce":
            hvd_op = self.hvd.Average if op == "average" else self.hvd.Max
            if self._asynchronous:
                return self.hvd.grouped_allreduce_async(tensors, op=hvd_op)
            return self.hvd.grouped_allreduce(tensors, op=hvd_op)
        if self._asynchronous:
            return self.hvd.grouped_allgather_async(tensors)
        return self.hvd.grouped_allgather(tensors)
