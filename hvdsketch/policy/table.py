"""The assignment table: which compressor each tensor got, and what it is expected to send."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class Assignment:
    """One tensor's row: its density, the compressor chosen, and the bytes one rank is expected to send per step
    with it and with a dense allreduce; ``seconds`` and ``dense_seconds``: the cost model's estimates of the
    tensor's part of the step (:func:`~hvdsketch.policy.cost.shares`), ``None`` where no model decided."""

    tensor: str
    shape: tuple[int, ...]
    density: float | None
    compressor: str
    bytes: int
    dense_bytes: int
    seconds: float | None = None
    dense_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "shape": list(self.shape)}


def format_table(rows: Sequence[Assignment], title: str) -> str:
    """A plain-text table of ``rows`` with a total line."""
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{1000 * value:.2f}"

    header = ("tensor", "shape", "density", "compressor", "MB/step", "dense MB", "ratio", "est ms", "dense ms")
    body = [(r.tensor, "x".join(map(str, r.shape)) or "scalar", "-" if r.density is None else f"{r.density:.4f}",
             r.compressor, f"{r.bytes / 1e6:.3f}", f"{r.dense_bytes / 1e6:.3f}",
             f"{r.dense_bytes / r.bytes:.1f}x" if r.bytes else "-", ms(r.seconds), ms(r.dense_seconds))
            for r in rows]
    sent, dense = sum(r.bytes for r in rows), sum(r.dense_bytes for r in rows)
    modelled = all(r.seconds is not None for r in rows) and rows
    body.append(("total", "", "", "", f"{sent / 1e6:.3f}", f"{dense / 1e6:.3f}",
                 f"{dense / sent:.1f}x" if sent else "-",
                 ms(sum(r.seconds for r in rows)) if modelled else "-",
                 ms(sum(r.dense_seconds for r in rows)) if modelled else "-"))
    widths = [max(len(row[i]) for row in (header, *body)) for i in range(len(header))]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in body]
    return "\n".join(lines)
