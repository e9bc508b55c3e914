"""What compression saved on this rank: the bytes it sent against a dense ring allreduce of the same
gradients, the time spent, the residuals kept, and the policy's per-tensor choices."""
from __future__ import annotations

from typing import Any

from hvdsketch.collectives.stats import ring_allreduce_bytes
from hvdsketch.exchange.exchanger import Exchanger


def report_of(exchanger: Exchanger, dense_bytes: int, sent: int | None = None, steps: int | None = None
           ) -> dict[str, Any]:
    """The report of ``exchanger``'s exchanges, whose gradients held ``dense_bytes`` in all.

    ``sent`` and ``steps`` default to what the exchanger counted itself; a front end that also
    counts steps run inside a traced graph (TensorFlow) gives its totals. ``bytes_dense_allreduce``
    is what a ring allreduce of those gradients sends a rank (``2 (N - 1) / N`` of their bytes),
    ``ratio`` that over ``bytes_sent``; ``assignment`` is the policy's table (``None`` for a single
    compressor, or before it decided)."""
    stats = exchanger.communicator.stats
    sent = stats.bytes_sent if sent is None else sent
    dense = ring_allreduce_bytes(dense_bytes, exchanger.communicator.size)
    table = exchanger.policy.assignment
    return {"compression": str(exchanger.policy), "steps": exchanger.step if steps is None else steps,
            "bytes_sent": sent, "bytes_dense_allreduce": dense, "ratio": dense / sent if sent else float("nan"),
            "assignment": None if table is None else [row.to_dict() for row in table],
            "seconds": dict(stats.seconds),
            "residual_bytes": sum(m.nbytes() + m.host_nbytes() for m in (exchanger.memory, exchanger.own_memory)
                                  if m is not None),
            "collectives": stats.snapshot()}
