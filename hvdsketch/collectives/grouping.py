"""What every framework's communicator does alike: group a round's messages, count their bytes.

Messages are grouped by kind and dtype (:func:`group`): ``average``, ``sum`` and ``max`` fused in one allreduce,
``allgather`` and ``bor`` together, each ``alltoall`` and ``reduce_scatter`` alone. Their bytes are counted by
the formulas of :mod:`~hvdsketch.collectives.stats` whichever library moves them, so reports of :mod:`.horovod`
and :mod:`.torchdist` compare.
"""
from __future__ import annotations

from typing import Any, Sequence

from hvdsketch.collectives.stats import CommStats, alltoall_bytes, reduce_scatter_bytes, ring_allreduce_bytes
from hvdsketch.compress.base import Message
from hvdsketch.ops import backend

#: The reduction ops and the collective each travels in.
KINDS = {"average": "allreduce", "sum": "allreduce", "max": "allreduce", "allgather": "allgather",
         "bor": "allgather", "alltoall": "alltoall", "reduce_scatter": "reduce_scatter"}


def group(messages: Sequence[Message]) -> dict[tuple[str, str], list[int]]:
    """Message indices by ``(group, dtype)``, groups in order of first appearance: the op itself for
    allreduces, ``"gather"`` for allgathers and bitwise ORs, ``"alltoall<i>"`` for alltoall ``i``
    (``"reduce_scatter<i>"`` alike); an unknown op is a ``ValueError`` naming the valid ones."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, m in enumerate(messages):
        if m.op not in KINDS:
            raise ValueError(f"hvdsketch: unknown reduction op {m.op!r}; valid: {', '.join(KINDS)}")
        op = m.op if KINDS[m.op] == "allreduce" else "gather" if KINDS[m.op] == "allgather" else f"{m.op}{i}"
        groups.setdefault((op, backend(m.tensor).dtype_name(m.tensor)), []).append(i)
    return groups


def count_allreduce(stats: CommStats, op: str, messages: Sequence[Message], size: int) -> None:
    """Count one fused allreduce of ``messages`` by ``op`` over ``size`` ranks (the ring's bytes)."""
    wire = ring_allreduce_bytes(sum(backend(m.tensor).nbytes(m.tensor) for m in messages), size)
    stats.record(f"allreduce.{op}", wire, wire)


def count_alltoall(stats: CommStats, message: Message, received: Any, rank: int) -> None:
    """Count one alltoall: ``message`` cut by its splits, ``received`` what came back to ``rank``."""
    ops = backend(message.tensor)
    rows, nbytes = ops.shape(message.tensor)[0], ops.nbytes(message.tensor)
    kept = message.splits[rank] * nbytes // rows if rows else 0
    stats.record("alltoall", *alltoall_bytes(ops.nbytes(message.tensor), kept, ops.nbytes(received)))


def count_reduce_scatter(stats: CommStats, message: Message, size: int) -> None:
    """Count one reduce-scatter of ``message`` over ``size`` ranks (the ring's bytes)."""
    wire = reduce_scatter_bytes(backend(message.tensor).nbytes(message.tensor), size)
    stats.record("reduce_scatter", wire, wire)


def gathered(stats: CommStats, message: Message, rows: Any, size: int) -> Any:
    """Count one allgather of ``message`` (``rows``: every rank's, in rank order) and give its
    result: the rows themselves, or for ``bor`` their bitwise OR."""
    ops = backend(message.tensor)
    sent, total = ops.nbytes(message.tensor), ops.nbytes(rows)
    # a graph-mode allgather's size is known only at run time: count equal shares
    received = sent * (size - 1) if total is None else total - sent
    stats.record(message.op, sent * (size - 1), received)
    return rows if message.op == "allgather" else ops.bitwise_or_rows(ops.reshape(rows, (size, -1)))
