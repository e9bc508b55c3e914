"""Sparse collectives against dense allreduce: time and measured bytes per density.

Every rank holds a ``--size``-element gradient whose support (a ``density``
fraction, drawn independently per rank in runs of ``--granularity``
elements) is random; each algorithm leaves the summed gradient on every rank:

  dense.mpi    MPI_Allreduce, Open MPI's own algorithm (bytes: ring model)
  dense.ring   hvdsketch's ring allreduce
  allgather    sparse allgatherv of (index, value), summed locally
  sparcml      SparCML recursive doubling, dense once sparse is no smaller
  omnireduce   OR of a bitmap of non-zero blocks, allreduce of the union blocks
  sketch       OR of the support bitmap + sum of count-sketch cells sized for
               the union at --sketch-error (collectives only; hashing and
               recovery are measured by ``bench compressors``)
  horovod.torch, horovod.tensorflow
               Horovod's allreduce (bytes: ring model); only when named in
               --algorithms, best in a run of its own next to dense.mpi

Times are the median over --repeats of the slowest rank's time; bytes are
per call from the communicators' counters (the max over ranks, and the sum
over ranks, which is what a shared link carries). Run it under
``launch/cluster.sh`` for a slow network; rank 0 prints the table and writes
``--json`` and ``--plot``.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

EXACT = ("dense.ring", "allgather", "sparcml", "omnireduce")
ALGORITHMS = ("dense.mpi", *EXACT, "sketch", "horovod.torch", "horovod.tensorflow")
DEFAULT = ("dense.mpi", *EXACT, "sketch")
MODELLED = ("dense.mpi", "horovod.torch", "horovod.tensorflow")  # bytes from the ring model
DENSE = ("dense.", "horovod.")  # baselines: sent whole whatever the density
DENSITIES = "0.001,0.002,0.005,0.01,0.02,0.05,0.1,0.2,0.5"


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALGORITHMS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown algorithm(s) {unknown}; valid: {', '.join(ALGORITHMS)}")
    return names


def _densities(text: str) -> list[float]:
    values = sorted(float(v) for v in text.split(","))
    if not values or not all(0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"densities must be in (0, 1], got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", type=int, default=1 << 20, help="gradient elements per rank (default 2^20)")
    parser.add_argument("--densities", type=_densities, default=_densities(DENSITIES),
                        help=f"comma-separated non-zero fractions (default {DENSITIES})")
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    parser.add_argument("--algorithms", type=_names, default=None,
                        help=f"comma-separated, from {', '.join(ALGORITHMS)} (default: {', '.join(DEFAULT)}; "
                             "without dense.mpi for float16, which MPI cannot sum)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per point; the median is reported")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls first")
    parser.add_argument("--granularity", type=int, default=1,
                        help="support drawn in runs of this many elements (rows of an embedding: its width)")
    parser.add_argument("--block", type=int, default=256, help="OmniReduce block (elements)")
    parser.add_argument("--dense-at", type=float, default=1.0,
                        help="SparCML goes dense when sparse bytes >= this x dense bytes")
    parser.add_argument("--sketch-error", type=float, default=0.5,
                        help="sketch cells = union non-zeros / error^2 (one row)")
    parser.add_argument("--sketch-wire", choices=("float32", "float16", "bfloat16"), default="float16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results here (rank 0)")
    parser.add_argument("--plot", help="write a PNG of time against density here (rank 0)")


@dataclass(frozen=True)
class Workload:
    """One rank's inputs at one density."""

    dense: np.ndarray
    sparse: Any  # SparseVector
    units: np.ndarray  # support bitmap, one flag per run of --granularity elements
    cells: np.ndarray  # count-sketch cells


@dataclass(frozen=True)
class Row:
    density: float
    algorithm: str
    time_ms: float
    speedup: float  # baseline time / this time
    sent_bytes: int  # per call, max over ranks
    received_bytes: int
    total_sent_bytes: int  # per call, sum over ranks
    exact_bytes: bool  # counted message by message, not modelled


def _workload(args: argparse.Namespace, density: float, rank: int, size: int) -> Workload:
    from hvdsketch.collectives.sparse import SparseVector

    rng = np.random.default_rng([args.seed, rank, int(density * 1e9)])
    units = math.ceil(args.size / args.granularity)
    chosen = np.sort(rng.choice(units, max(1, round(density * units)), replace=False))
    coords = (chosen[:, None] * args.granularity + np.arange(args.granularity)).reshape(-1)
    coords = coords[coords < args.size]
    dense = np.zeros(args.size, args.dtype)
    dense[coords] = rng.standard_normal(len(coords))
    bitmap = np.zeros(units, bool)
    bitmap[chosen] = True
    union = min(args.size, size * len(chosen) * args.granularity)  # alike on every rank
    cells = rng.standard_normal(math.ceil(union / args.sketch_error ** 2)).astype(np.float32)
    return Workload(dense, SparseVector.from_dense(dense), bitmap, cells)


def _runners(args: argparse.Namespace, comm: Any, names: list[str]) -> dict[str, Callable[[Workload], Any]]:
    """Each algorithm as ``workload -> summed dense gradient`` (``None`` for the sketch)."""
    from mpi4py import MPI

    from hvdsketch.collectives.sparse import densify, ibitmap_or, iblock_allreduce, isparcml_allreduce, \
        isparse_allgather
    from hvdsketch.collectives.stats import ring_allreduce_bytes

    def dense_mpi(w: Workload) -> np.ndarray:
        out = np.empty_like(w.dense)
        comm.comm.Allreduce(w.dense, out, op=MPI.SUM)
        wire = ring_allreduce_bytes(w.dense.nbytes, comm.size)
        comm.stats.record("dense.mpi", wire, wire)
        return out

    def allgather(w: Workload) -> np.ndarray:
        out = np.zeros_like(w.dense)
        for v in isparse_allgather(comm, w.sparse).wait():
            out[v.indices] += v.values
        return out

    def sketch(w: Workload) -> None:
        handles = [ibitmap_or(comm, w.units), comm.iallreduce(w.cells, wire=args.sketch_wire, label="sketch")]
        for h in handles:
            h.wait()

    runners: dict[str, Callable[[Workload], Any]] = {
        "dense.mpi": dense_mpi,
        "dense.ring": lambda w: comm.iallreduce(w.dense, label="dense.ring").wait(),
        "allgather": allgather,
        "sparcml": lambda w: densify(isparcml_allreduce(comm, w.sparse, args.dense_at).wait()),
        "omnireduce": lambda w: iblock_allreduce(comm, w.dense, args.block).wait(),
        "sketch": sketch,
    }
    for name in names:
        if name.startswith("horovod."):
            runners[name] = _horovod_runner(name, comm)
    return {name: runners[name] for name in names}


def _horovod_runner(name: str, comm: Any) -> Callable[[Workload], np.ndarray]:
    """Horovod's averaging allreduce of the dense gradient, times the world size (its bytes
    land in ``comm.stats``). Imports the framework here, and only here."""
    from hvdsketch.collectives.horovod import HorovodCommunicator
    from hvdsketch.compress.base import Message
    from hvdsketch.lab.bench.compressors import FRAMEWORKS

    hvd = importlib.import_module(name)
    hvd.init()
    framework = name.split(".")[1]
    ops = importlib.import_module(f"hvdsketch.ops.{framework}")
    module, convert = FRAMEWORKS[framework]
    to_tensor = getattr(importlib.import_module(module), convert)
    horovod = HorovodCommunicator(hvd)
    horovod.stats = comm.stats
    converted: dict[int, tuple[np.ndarray, Any]] = {}

    def run(w: Workload) -> np.ndarray:
        if id(w.dense) not in converted:
            converted.clear()
            converted[id(w.dense)] = (w.dense, to_tensor(w.dense))
        (out,) = horovod.reduce([Message(converted[id(w.dense)][1])])
        return ops.to_numpy(out) * comm.size

    return run


def _measure(comm: Any, run: Callable[[Workload], Any], w: Workload, repeats: int, warmup: int) -> tuple[float, Any]:
    """Median over ``repeats`` of the slowest rank's time, and the last result."""
    from mpi4py import MPI

    times, result = [], None
    for _ in range(warmup + repeats):
        comm.comm.Barrier()
        start = time.perf_counter()
        result = run(w)
        times.append(comm.comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return statistics.median(times[warmup:]), result


def _check(comm: Any, name: str, got: np.ndarray, want: np.ndarray) -> None:
    """Raise on every rank unless ``got`` is the sum on every rank."""
    from mpi4py import MPI

    tol = 1e-2 if got.dtype == np.float16 else 1e-4
    ok = bool(np.allclose(got.astype(np.float64), want, rtol=tol, atol=tol * float(np.abs(want).max(initial=1))))
    if not comm.comm.allreduce(ok, op=MPI.LAND):
        raise RuntimeError(f"hvdsketch bench: {name} returned a wrong sum on some rank")


def _point(args: argparse.Namespace, comm: Any, runners: dict[str, Callable[[Workload], Any]],
           w: Workload) -> dict[str, tuple[float, int, int, int]]:
    """Per algorithm: median seconds, and bytes per call: max sent, max received, total sent."""
    want = comm.iallreduce(w.dense.astype(np.float64), label="reference").wait()
    out = {}
    for name, runner in runners.items():
        comm.stats.reset()
        seconds, result = _measure(comm, runner, w, args.repeats, args.warmup)
        if result is not None:
            _check(comm, name, result, want)
        calls = args.repeats + args.warmup
        everyone = comm.comm.allgather((comm.stats.bytes_sent // calls, comm.stats.bytes_received // calls))
        out[name] = (seconds, max(s for s, _ in everyone), max(r for _, r in everyone), sum(s for s, _ in everyone))
    return out


def crossover(rows: list[Row], baseline: str) -> dict[str, dict[str, float | None]]:
    """Per sparse algorithm: the largest density up to which it beats ``baseline`` at every density
    measured, the first density where it does not, and the density where the two time curves
    cross (interpolated in log-log between those two points)."""
    out: dict[str, dict[str, float | None]] = {}
    for name in dict.fromkeys(r.algorithm for r in rows):
        if name.startswith(DENSE):
            continue
        points = sorted((r.density, r.speedup) for r in rows if r.algorithm == name)
        wins = 0
        while wins < len(points) and points[wins][1] > 1:
            wins += 1
        last_win = points[wins - 1] if wins else None
        first_loss = points[wins] if wins < len(points) else None
        at = None
        if last_win and first_loss:
            (d0, s0), (d1, s1) = last_win, first_loss
            at = math.exp(math.log(d0) + math.log(s0) / (math.log(s0) - math.log(s1)) * math.log(d1 / d0))
        out[name] = {"beats_up_to": last_win[0] if last_win else None,
                     "loses_from": first_loss[0] if first_loss else None, "crossover": at}
    return out


def _table(rows: list[Row], baseline: str) -> str:
    lines = [f"{'density':>8} {'algorithm':<19} {'time ms':>9} {'vs ' + baseline:>15} "
             f"{'sent MB/rank':>13} {'recv MB/rank':>13} {'all ranks MB':>13}"]
    for r in rows:
        mark = "" if r.exact_bytes else "~"
        mb = [f"{mark}{b / 1e6:.3f}" for b in (r.sent_bytes, r.received_bytes, r.total_sent_bytes)]
        lines.append(f"{r.density:>8.3%} {r.algorithm:<19} {r.time_ms:>9.2f} {r.speedup:>14.2f}x "
                     f"{mb[0]:>13} {mb[1]:>13} {mb[2]:>13}")
    return "\n".join(lines) + "\n(~: bytes of the ring model, not counted: the library's schedule is its own)"


def _crossover_table(cross: dict[str, dict[str, float | None]], baseline: str) -> str:
    def pct(v: float | None, never: str) -> str:
        return never if v is None else f"{v:.2%}"

    lines = [f"{'algorithm':<19} {'beats ' + baseline + ' up to':>24} {'loses from':>11} {'crossover':>10}"]
    for name, c in cross.items():
        lines.append(f"{name:<19} {pct(c['beats_up_to'], 'never'):>24} {pct(c['loses_from'], '-'):>11} "
                     f"{pct(c['crossover'], '-'):>10}")
    return "\n".join(lines)


def _plot(rows: list[Row], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r.algorithm for r in rows):
        mine = [r for r in rows if r.algorithm == name]
        style = "--" if name.startswith(("dense", "horovod")) else "-o"
        ax.plot([r.density for r in mine], [r.time_ms for r in mine], style, label=name, markersize=4)
    ax.set(xscale="log", yscale="log", xlabel="density (non-zero fraction per rank)", ylabel="time per call (ms)",
           title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run(args: argparse.Namespace) -> int:
    from hvdsketch.collectives.mpi import MPICommunicator

    names = args.algorithms or [n for n in DEFAULT if not (n == "dense.mpi" and args.dtype == "float16")]
    if args.dtype == "float16" and "dense.mpi" in names:
        raise SystemExit("hvdsketch bench: dense.mpi cannot sum float16 (MPI has no such type); use dense.ring")
    if min(args.size, args.repeats, args.granularity, args.block) < 1 or args.warmup < 0:
        raise SystemExit("hvdsketch bench: --size, --repeats, --granularity and --block must be >= 1")
    comm = MPICommunicator()
    runners = _runners(args, comm, names)
    baseline = next((n for n in names if n.startswith("dense.")), names[0])
    cluster = os.environ.get("HVDSKETCH_CLUSTER_RATE", "localhost (unshaped)")
    title = f"{comm.size} ranks, {args.size} x {args.dtype}, network {cluster}"
    if comm.rank == 0:
        print(f"hvdsketch bench collectives: {title}, granularity {args.granularity}, "
              f"median of {args.repeats}", flush=True)
    rows: list[Row] = []
    for density in args.densities:
        point = _point(args, comm, runners, _workload(args, density, comm.rank, comm.size))
        base = point[baseline][0]
        rows += [Row(density, name, t * 1e3, base / t, *counts, name not in MODELLED)
                 for name, (t, *counts) in point.items()]
        if comm.rank == 0:
            print(f"  density {density:.3%}: " + ", ".join(f"{n} {t * 1e3:.1f} ms" for n, (t, *_) in point.items()),
                  flush=True)
    cross = crossover(rows, baseline)
    if comm.rank == 0:
        print(_table(rows, baseline))
        if cross:
            print(_crossover_table(cross, baseline))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"config": {**{k: v for k, v in vars(args).items() if k != "run"},
                                      "algorithms": names, "ranks": comm.size, "network": cluster,
                                      "baseline": baseline},
                           "results": [asdict(r) for r in rows], "crossover": cross}, f, indent=1)
        if args.plot:
            _plot(rows, args.plot, title)
    comm.free()
    return 0
