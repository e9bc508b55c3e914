"""Bytes each rank sends to average a row-sparse gradient over N = 2 .. 1024 ranks, from real supports.

**Measured** (one process): for each workload config, ``--batches`` distinct
real training batches go through the model's forward and backward pass; for
each gradient that comes back sparse (an embedding's), the rows it touches
are recorded. N ranks of one step hold N distinct batches, so the union
support at N ranks is measured as the union of N consecutive batches (the
mean over up to ``--groups`` disjoint groups); it grows more slowly than N
times one batch, because batches share their frequent words.

**Modelled** (exact, but for allgather-rows, for hvdsketch's MPI collectives, whose counters give the
same numbers: each formula is the mean over ranks of the bytes sent). A
tensor of ``R`` rows of ``w`` float32 values; ``k`` rows per rank (mean), ``U``
rows in the union::

    dense       ring allreduce                   2 (N-1)/N * R w 4
    allgather   ring allgatherv of (int64 index, value) pairs, 16-byte headers
                                                 (N-1) * (16 + k w 12)
    allgather-rows  one int64 index per row and the row, as Horovod's sparse allreduce
                gathers an embedding gradient (once coalesced; ring model)
                                                 (N-1) * k (8 + w 4)
    omnireduce  OR of a packed row bitmap, then ring allreduce of the union rows (Fei et al., 2021)
                                                 2 (N-1)/N * (ceil(R/8) + U w 4)
    sketch      OR of the packed row bitmap, then ring allreduce of the count sketch cells,
                cols = U w / error^2 (Charikar et al., 2002; Ge et al., 2023)
                                                 2 (N-1)/N * (ceil(R/8) + rows * cols * s)

sized, as the compressor sizes it, for the union every rank knows once the
bitmaps are ORed; ``s`` is the wire size of a cell (``--sketch-wire``). Cells
that would not be fewer than the tensor's values give way to the dense
tensor, as in the compressor. Allgather's bytes grow with N (every rank receives every other rank's
pairs) while the others' stay bounded by the union, so allgather wins at few
ranks and the union-sized methods at many; the table and plot say where.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from hvdsketch.lab.bench import report

ALGORITHMS = ("dense", "allgather", "allgather-rows", "omnireduce", "sketch")
HEADER_BYTES = 16  # allgatherv's per-rank header: row count and a digest
INDEX_BYTES = 8  # int64 index per element
WIRE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def dense_bytes(n: int, rows: int, width: int, itemsize: int = 4) -> float:
    return 2 * (n - 1) / n * rows * width * itemsize


def allgather_bytes(n: int, nnz_rows: float, width: int, itemsize: int = 4) -> float:
    return (n - 1) * (HEADER_BYTES + nnz_rows * width * (INDEX_BYTES + itemsize))


def allgather_rows_bytes(n: int, nnz_rows: float, width: int, itemsize: int = 4) -> float:
    return (n - 1) * nnz_rows * (INDEX_BYTES + width * itemsize)


def bitmap_bytes(n: int, rows: int) -> float:
    return 2 * (n - 1) / n * math.ceil(rows / 8)


def omnireduce_bytes(n: int, rows: int, union_rows: float, width: int, itemsize: int = 4) -> float:
    return bitmap_bytes(n, rows) + 2 * (n - 1) / n * union_rows * width * itemsize


def sketch_cells(bound_rows: float, width: int, error: float, sketch_rows: int = 1) -> int:
    """Cells of a count sketch sized for ``bound_rows`` rows of ``width`` at relative L2 ``error``."""
    return sketch_rows * math.ceil(bound_rows * width / error ** 2)


def sketch_bytes(n: int, rows: int, union_rows: float, width: int, error: float, sketch_rows: int = 1,
                 wire: int = 4, itemsize: int = 4) -> float:
    """The bitmap, then the cells, or the dense tensor when the cells would not be smaller than it."""
    cells = sketch_cells(union_rows, width, error, sketch_rows)
    payload = dense_bytes(n, rows, width, itemsize) if cells >= rows * width else 2 * (n - 1) / n * cells * wire
    return bitmap_bytes(n, rows) + payload


@dataclass(frozen=True)
class Supports:
    """What was measured for one sparse gradient."""

    workload: str
    tensor: str
    rows: int
    width: int
    batch_size: int
    per_batch: list[int]  # distinct rows each batch touches
    union: dict[int, float]  # N -> mean rows in the union of N batches
    groups: dict[int, int]  # N -> how many disjoint groups the mean is over


@dataclass(frozen=True)
class Point:
    workload: str
    tensor: str
    ranks: int
    algorithm: str
    bytes_per_rank: float


def union_growth(supports: Sequence[np.ndarray], ranks: Sequence[int], max_groups: int) -> tuple[dict[int, float], dict[int, int]]:
    """Mean size of the union of ``n`` consecutive supports, over up to ``max_groups`` disjoint groups."""
    mean, groups = {}, {}
    for n in ranks:
        count = min(len(supports) // n, max_groups)
        if count == 0:
            continue
        sizes = [len(np.unique(np.concatenate(supports[g * n:(g + 1) * n]))) for g in range(count)]
        mean[n], groups[n] = float(np.mean(sizes)), count
    return mean, groups


def measure(config_file: str, batches: int, ranks: Sequence[int], max_groups: int) -> list[Supports]:
    """Run ``batches`` real batches of the config's workload; the supports of its sparse gradients."""
    import torch

    from hvdsketch.lab.config import TrainConfig
    from hvdsketch.lab.workloads import get

    workload = get(TrainConfig.load(config_file).workload)
    model = workload.build_model()
    params = dict(model.named_parameters())
    found: dict[str, list[np.ndarray]] = {}
    for i, batch in zip(range(batches), workload.train_batches(0, 0, 1)):
        model.zero_grad(set_to_none=True)
        loss = workload.loss(model, batch)
        wanted = [params[n] for n in found] if found else list(params.values())
        torch.autograd.backward(loss, inputs=wanted)
        for name, p in params.items():
            if p.grad is not None and p.grad.is_sparse:
                found.setdefault(name, []).append(np.unique(p.grad.coalesce().indices()[0].numpy()))
        if i == 0 and not found:
            raise SystemExit(f"hvdsketch bench scaling: {workload.name} has no sparse gradient to model")
    out = []
    for name, supports in found.items():
        union, groups = union_growth(supports, ranks, max_groups)
        shape = tuple(params[name].shape)
        out.append(Supports(workload.name, name, shape[0], math.prod(shape[1:]), workload.batch_size,
                            [len(s) for s in supports], union, groups))
    return out


def model(s: Supports, error: float, sketch_rows: int, wire: int) -> list[Point]:
    """Bytes per rank of every algorithm at every N whose union was measured."""
    k = float(np.mean(s.per_batch))
    points = []
    for n, union in sorted(s.union.items()):
        if n < 2:
            continue
        values = {"dense": dense_bytes(n, s.rows, s.width),
                  "allgather": allgather_bytes(n, k, s.width),
                  "allgather-rows": allgather_rows_bytes(n, k, s.width),
                  "omnireduce": omnireduce_bytes(n, s.rows, union, s.width),
                  "sketch": sketch_bytes(n, s.rows, union, s.width, error, sketch_rows, wire)}
        points += [Point(s.workload, s.tensor, n, a, values[a]) for a in ALGORITHMS]
    return points


def winners(points: Sequence[Point], among: Sequence[str] = ALGORITHMS) -> list[tuple[int, int, str]]:
    """Runs of consecutive N with the same fewest-bytes algorithm: (first N, last N, algorithm)."""
    by_n: dict[int, dict[str, float]] = {}
    for p in points:
        if p.algorithm in among:
            by_n.setdefault(p.ranks, {})[p.algorithm] = p.bytes_per_rank
    runs: list[tuple[int, int, str]] = []
    for n in sorted(by_n):
        best = min(by_n[n], key=by_n[n].get)
        if runs and runs[-1][2] == best:
            runs[-1] = (runs[-1][0], n, best)
        else:
            runs.append((n, n, best))
    return runs


def table(s: Supports, points: Sequence[Point]) -> str:
    headers = ["ranks", "union rows", *(f"{a} MB" for a in ALGORITHMS), "fewest"]
    rows = []
    for n in sorted({p.ranks for p in points}):
        mine = {p.algorithm: p.bytes_per_rank for p in points if p.ranks == n}
        rows.append([str(n), f"{s.union[n]:.0f}", *(report.number(mine[a] / 1e6, 4) for a in ALGORITHMS),
                     min(mine, key=mine.get)])
    return report.markdown(headers, rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", action="append", help="a workload's training YAML, repeatable "
                        "(default: configs/lstm.yaml and configs/fasttext.yaml)")
    parser.add_argument("--batches", type=int, default=1024, help="real batches to measure (the largest N)")
    parser.add_argument("--groups", type=int, default=16, help="disjoint groups averaged per N")
    parser.add_argument("--sketch-error", type=float, default=0.5, help="relative L2 error the sketch is sized for")
    parser.add_argument("--sketch-rows", type=int, default=1)
    parser.add_argument("--sketch-wire", choices=sorted(WIRE_BYTES), default="float32")
    parser.add_argument("--json", help="write supports and bytes here")
    parser.add_argument("--markdown", help="write the tables here")
    parser.add_argument("--plot", help="write a log-log PNG of bytes per rank against N here")


def run(args: argparse.Namespace) -> int:
    if args.batches < 2 or args.groups < 1 or args.sketch_error <= 0 or args.sketch_rows < 1:
        raise SystemExit("hvdsketch bench scaling: needs --batches >= 2, --groups >= 1, --sketch-error > 0, "
                         "--sketch-rows >= 1")
    configs = args.config or ["configs/lstm.yaml", "configs/fasttext.yaml"]
    ranks = [2 ** i for i in range(1, int(math.log2(args.batches)) + 1)]
    measured: list[Supports] = []
    for config in configs:
        measured += measure(config, args.batches, ranks, args.groups)
        print(f"measured {config}: " + ", ".join(f"{s.tensor} {s.rows}x{s.width}, {np.mean(s.per_batch):.0f} rows "
                                                 f"per batch" for s in measured if s.workload in config), flush=True)
    wire = WIRE_BYTES[args.sketch_wire]
    sections, panels, everything = [], {}, []
    for s in measured:
        points = model(s, args.sketch_error, args.sketch_rows, wire)
        everything += points
        ranges = "; ".join(f"{a} for N = {lo}..{hi}" if lo != hi else f"{a} at N = {lo}"
                           for lo, hi, a in winners(points))
        sections.append(f"### {s.workload} `{s.tensor}` ({s.rows} x {s.width}, batch {s.batch_size}, "
                        f"{np.mean(s.per_batch):.0f} rows per rank)\n\n{table(s, points)}\n\nFewest bytes: {ranges}.")
        panels[f"{s.workload} {s.tensor}"] = {a: [(p.ranks, p.bytes_per_rank / 1e6) for p in points if p.algorithm == a]
                                             for a in ALGORITHMS}
    text = (f"Sketch sized at {args.sketch_error:g} relative L2 error, {args.sketch_rows} row(s), "
            f"{args.sketch_wire} cells; bytes are the mean per rank.\n\n" + "\n\n".join(sections) + "\n")
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"options": {k: v for k, v in vars(args).items() if k != "run"},
                                               "supports": [asdict(s) for s in measured],
                                               "points": [asdict(p) for p in everything]}, indent=1))
    if args.plot:
        report.line_plot(panels, args.plot, "Bytes each rank sends per step, measured supports",
                         "ranks N", "MB per rank", log="xy")
    return 0
