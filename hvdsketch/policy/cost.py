"""The cost model of a per-tensor choice: seconds on the wire plus seconds of compute.

A compressor ``c``'s exchange of one tensor costs one rank, per step::

    t(c) = wire(c) / bandwidth  +  calls(c) * latency  +  compute(c)

``wire(c)``: the bytes this rank sends in the collectives of ``c``'s messages (:func:`wire_bytes`; bytes that
depend on the other ranks' supports are priced from the union given: :func:`union_bytes`, :func:`balanced_bytes`).
``bandwidth`` and ``latency``: the link as all ranks share it (:mod:`hvdsketch.policy.probe`). ``calls(c)``: the
collectives beyond the fused allreduce dense tensors ride in anyway; :func:`step_seconds` prices a whole step
instead, one latency per collective it launches. ``compute(c)``: compress plus decompress, timed on the real
tensor (:func:`measure`).
"""
from __future__ import annotations

import math
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Sequence

from hvdsketch.collectives.grouping import group
from hvdsketch.collectives.stats import reduce_scatter_bytes, ring_allreduce_bytes
from hvdsketch.compress import Compressor, Message, RowSparse, TensorContext
from hvdsketch.compress.local import run_alone
from hvdsketch.compress.support import Layout, values_of
from hvdsketch.ops import backend
from hvdsketch.spec import SpecError

#: Bits per second of each unit of ``bandwidth=`` (tc's names, as ``launch/cluster.sh --rate``).
BIT_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
#: Seconds of each unit of ``latency=``.
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
#: Elements per support unit of a vector in the density statistics (the sketch's default block).
BLOCK = 256


def _quantity(text: str, units: dict[str, float], what: str) -> float:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]+)\s*", text.lower())
    if not match or match.group(2) not in units:
        raise SpecError(f"{what} {text!r}: expected a number and a unit, one of {', '.join(units)} "
                        f"(e.g. 1{next(iter(reversed(units)))})")
    value = float(match.group(1)) * units[match.group(2)]
    if not value > 0:
        raise SpecError(f"{what} {text!r} must be > 0")
    return value


def parse_bandwidth(text: str) -> float:
    """Bytes per second of ``"1gbit"``, ``"100mbit"``, ...; raises :class:`SpecError`."""
    return _quantity(text, BIT_UNITS, "bandwidth") / 8


def parse_latency(text: str) -> float:
    """Seconds of ``"50us"``, ``"1ms"``, ...; raises :class:`SpecError`."""
    return _quantity(text, TIME_UNITS, "latency")


@dataclass(frozen=True)
class Link:
    """What one collective costs a rank: ``latency`` seconds plus bytes over ``bandwidth`` (bytes/s)."""

    latency: float
    bandwidth: float

    def seconds(self, wire: float, calls: int = 0) -> float:
        return wire / self.bandwidth + calls * self.latency


def wire_bytes(op: str, nbytes: int, size: int, ring_bor: bool = False) -> int:
    """Bytes one rank sends to reduce a message of ``nbytes`` by ``op`` over ``size`` ranks; ``bor``
    is a ring allreduce where ``ring_bor`` (the MPI layer), an allgather otherwise (Horovod); an
    alltoall sends all but its own piece, priced as an even cut."""
    if op in ("average", "sum", "max") or (op == "bor" and ring_bor):
        return ring_allreduce_bytes(nbytes, size)
    if op in ("alltoall", "reduce_scatter"):
        return reduce_scatter_bytes(nbytes, size)
    return (size - 1) * nbytes  # allgather, and bor (an allgather folded with OR in Horovod)


def union_bytes(shape: Sequence[int], itemsize: int, union_units: float, size: int, block: int,
                ring_bor: bool = False) -> int:
    """Bytes one rank sends in the ``union`` method: the packed bitmap's OR, then the average of the
    union's ``union_units`` units."""
    layout = Layout.of(shape, block)
    units = min(layout.units, math.ceil(union_units))
    return (wire_bytes("bor", -(-layout.units // 8), size, ring_bor)
            + ring_allreduce_bytes(units * layout.unit_len * itemsize, size))


def lower_bound(rows: int, row_bytes: int, touched: float, union: float, size: int) -> tuple[float, float]:
    """``(values, index)``: the fewest bytes one rank sends, on average, in any exact exchange of a row-sparse
    gradient of ``rows`` rows of ``row_bytes`` whose ranks touch ``touched`` rows each and ``union`` together:
    ``row_bytes * (z + (N - 2) u / N)`` of values, and for the index the smaller of a ``rows``-bit bitmap and
    ``u`` sorted rows at ``log2(rows / u)`` bits each (DESIGN.md, "Exact sparse exchange and its lower bound")."""
    if size <= 1:
        return 0.0, 0.0
    values = row_bytes * (touched + (size - 2) * union / size)
    index = min(rows / 8, union * math.log2(rows / union) / 8) if union else 0.0
    return values, index


def code_bytes(units: int, touched: float) -> float:
    """Expected bytes of ``touched`` random rows of ``units`` coded as :mod:`hvdsketch.compress.rowcode` codes them:
    the smaller of the bitmap and deltas as wide as the largest gap (about ``units / touched * ln(touched)``)."""
    if touched < 1:
        return 0.0
    gap = units / touched * max(1.0, math.log(touched))
    width = next(w for w in (1, 2, 4, 8) if w == 8 or gap < 256 ** w)
    return min(-(-units // 8), touched * width)


def balanced_bytes(units: int, unit_bytes: int, touched: float, union: float, size: int,
                   code: float | None = None, header: int = 16) -> float:
    """Bytes one rank sends, on average, in the ``balanced`` method: its rows' code (``code`` bytes, else
    :func:`code_bytes`) and ``header`` bytes to every other rank (16 over Horovod, 80 over the MPI layer), then
    the values of :func:`lower_bound`."""
    values, _ = lower_bound(units, unit_bytes, touched, union, size)
    return (size - 1) * (header + (code_bytes(units, touched) if code is None else code)) + values


def dense_bytes(shape: Sequence[int], itemsize: int, size: int) -> int:
    """Bytes one rank sends to allreduce a dense tensor of ``shape``."""
    return ring_allreduce_bytes(math.prod(shape) * itemsize, size)


@dataclass(frozen=True)
class Measurement:
    """One candidate on one tensor: the three terms of the cost model, bar the link."""

    compute: float  # seconds of compress + decompress on this rank
    wire: int       # bytes this rank sends per step
    calls: int      # collectives beyond the fused allreduce of the tensor's dtype
    #: The collectives of its rounds as ``(round, group, dtype)`` (:func:`collectives`).
    collectives: frozenset[tuple[int, str, str]] = frozenset()

    def seconds(self, link: Link) -> float:
        return link.seconds(self.wire, self.calls) + self.compute


def step_seconds(chosen: Sequence[Measurement], link: Link) -> float:
    """Seconds of one step whose tensors are exchanged as ``chosen``: every tensor's bytes and
    compute, and one latency for each collective of them all (tensors in one collective share it)."""
    return sum(shares(chosen, link))


def shares(chosen: Sequence[Measurement], link: Link) -> list[float]:
    """Each tensor's part of :func:`step_seconds`: its bytes and compute, and the latency of each of
    its collectives split evenly among the tensors in it."""
    users = Counter(key for m in chosen for key in m.collectives)
    return [m.wire / link.bandwidth + m.compute + link.latency * sum(1 / users[key] for key in m.collectives)
            for m in chosen]


def measure(compressor: Compressor, tensor: Any, ctx: TensorContext, repeats: int = 5,
            ring_bor: bool = False) -> Measurement:
    """Run ``compressor``'s whole exchange of ``tensor`` locally (each round reduced over this rank alone): the
    median of ``repeats`` timings, and the bytes its messages would put on the wire over ``ctx.world_size`` ranks
    (``ring_bor``: the communicator ORs in a ring). Runs keep no state; timing waits for the device."""
    ops = backend(values_of(tensor))
    ctx = replace(ctx, state=None)
    timings, rounds = [], []
    for _ in range(repeats):
        ops.synchronize(values_of(tensor))  # device work queued before is not the codec's
        start = time.perf_counter()
        result, rounds = run_alone(compressor, tensor if compressor.row_sparse else densified(tensor), ctx)
        ops.synchronize(values_of(result))  # on an accelerator the kernels have only been queued
        timings.append(time.perf_counter() - start)
    size = ctx.world_size
    wire = sum(wire_bytes(m.op, backend(m.tensor).nbytes(m.tensor), size, ring_bor) for r in rounds for m in r)
    launched = collectives(rounds)
    own = ops.dtype_name(values_of(tensor))
    calls = len(launched) - ((0, "average", own) in launched)
    return Measurement(statistics.median(timings), wire, calls, launched)


def densified(tensor: Any) -> Any:
    """A row-sparse gradient as the dense tensor a dense-only compressor takes (others as they are)."""
    return tensor.to_dense() if isinstance(tensor, RowSparse) else tensor


def collectives(rounds: Sequence[Sequence[Message]]) -> frozenset[tuple[int, str, str]]:
    """The collectives an exchange's rounds launch, as ``(round, group, dtype)``, a round's messages grouped as
    every communicator groups them (:func:`hvdsketch.collectives.grouping.group`)."""
    return frozenset((i, *key) for i, messages in enumerate(rounds) for key in group(messages))


def densities(tensor: Any, shape: Sequence[int], block: int) -> tuple[float, float]:
    """This rank's ``(element density, unit density)`` of a gradient: the non-zero fraction of its coordinates
    and of its support units (rows or ``block``-element blocks, :class:`Layout`); a row-sparse gradient's
    distinct rows count as fully non-zero."""
    layout = Layout.of(shape, block)
    if layout.numel == 0:
        return 0.0, 0.0
    if isinstance(tensor, RowSparse):
        ops = backend(tensor.values)
        rows = ops.shape(ops.coalesce_rows(tensor.indices, tensor.values)[0])[0]
        return rows * layout.unit_len / layout.numel, rows / layout.units
    ops = backend(tensor)
    flat = ops.flatten(tensor)
    signs = ops.sign(flat)
    elements = float(ops.to_numpy(ops.reduce_sum(signs * signs)))
    padded = ops.pad(flat, layout.units * layout.unit_len - layout.numel)
    units = ops.shape(ops.nonzero_rows(ops.reshape(padded, (layout.units, layout.unit_len))))[0]
    return elements / layout.numel, units / layout.units
