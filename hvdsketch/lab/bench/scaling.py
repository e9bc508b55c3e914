"""Bytes and time each rank spends averaging a row-sparse gradient over N = 2 .. 1024 ranks, from real supports.

**Measured** (one process): for each workload config, ``--batches`` distinct
real training batches go through the model's forward and backward pass; for
each gradient that comes back sparse (an embedding's), the rows it touches
are recorded. N ranks of one step hold N distinct batches, so the union
support at N ranks is measured as the union of N consecutive batches (the
mean over up to ``--groups`` disjoint groups); it grows more slowly than N
times one batch, because batches share their frequent words. ``--supports``
reuses the supports a previous run wrote to its JSON instead.

**Modelled** (exact for hvdsketch's MPI collectives, whose counters give the
same numbers, ``tests/unit/test_bench_train.py``; each formula is the mean
over ranks of the bytes sent). A tensor of ``R`` rows of ``w`` float32 values;
``k`` rows per rank (mean), ``U`` rows in the union, ``U(n)`` that of ``n``
ranks; ``s`` the bytes of a sketch cell; ``r(x) = 2 (N-1)/N x`` a ring
allreduce of ``x`` bytes::

    dense           ring allreduce                                      r(R w 4)
    horovod-sparse  Horovod's allgather of an embedding gradient: int64 index and row per
                    distinct row (a lower bound: Horovod does not coalesce repeated rows)
                                                                        (N-1) k (8 + 4 w)
    allgather       hvdsketch's allgather: coalesced rows, int32 indices, two allgathervs
                    with 16-byte headers                                (N-1) (32 + k (4 + 4 w))
    allgather-fp16  the same, values as float16                         (N-1) (32 + k (4 + 2 w))
    union           OR of the packed row bitmap (a ring), then the union's rows (OmniReduce)
                                                                        r(ceil(R/8)) + r(U w 4)
    balanced        every rank's rows coded (bitmap or deltas, c bytes) allgathered, then each row
                    summed by one of the ranks that touched it (alltoall), the sums allgathered;
                    80 bytes of headers per peer (policy/cost.py's balanced_bytes)
                                                                        (N-1) (80 + c) + (k + (N-2) U / N) w 4
    bound           what any exact method sends at least: values (k + (N-2) U / N) w 4, plus the
                    union's index, min(R, U log2(R / U)) / 8 (policy/cost.py's lower_bound)
    sparcml         SparCML's recursive doubling (collectives/sparse.py) of (int64 index, value)
                    pairs, one per element, with a 24-byte header; round j's partial sums cover
                    U(2^j) rows (dense once that is no smaller)
                                                                        sum_j 24 + min(U(2^j) w 12, R w 4)
    sketch          one round: bitmap and cells together, cols = B w / error^2 for the plan's
                    bound B (the union seen last, U, times headroom on the grid of sizes)
                                                                        r(ceil(R/8)) + r(rows cols s)
    sketch-ef       the same at error 1 with float16 cells (error feedback returns what it misses)
    union-sketch    the bitmap round, then a sketch of the union at error 2, float16 cells

with the dense tensor in place of cells not smaller than it, as the compressors
do. **Time** per step is ``steps x latency + bytes / bandwidth + codec``:
``steps`` the sequential message steps of the collectives (a ring allreduce
``2 (N-1)``, a ring allgatherv ``2 (N-1)`` with its header ring, as Horovod's
allgather first gathers every rank's size, recursive
doubling ``2 log2 N``, an alltoall ``N - 1``, a method's dependent rounds added;
the bound's time is its bytes over the bandwidth alone), latency and
bandwidth from ``--latency`` and ``--bandwidth``, ``codec`` the compressor's
compress and decompress measured on this machine on a row-sparse gradient of
the tensor's shape holding the union's rows (the allgather: every rank's rows,
coalesced; Horovod's sparse path alike, for PyTorch's optimizer coalesces the
gathered rows when it applies them; SparCML's merges are priced as the union
method's). Allgather's
bytes grow with N (every rank receives every other rank's rows) while the
union-sized methods' stay bounded, so allgather wins at few ranks and the
union-sized methods at many; the tables and plot say where.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from hvdsketch.compress import sizing
from hvdsketch.lab.bench import report
from hvdsketch.policy import cost

ALGORITHMS = ("dense", "horovod-sparse", "allgather", "allgather-fp16", "union", "balanced", "sparcml", "sketch",
              "sketch-ef", "union-sketch")
#: The algorithms whose average is exact (the others err, by design, and lean on error feedback).
EXACT = ("dense", "horovod-sparse", "allgather", "union", "balanced", "sparcml")
#: Columns of the tables: every algorithm, then the lower bound of the exact ones.
COLUMNS = (*ALGORITHMS, "bound")
#: The compressor flag whose codec each algorithm's time includes (``None``: none).
FLAGS = {"dense": None, "horovod-sparse": "allgather", "allgather": "allgather", "allgather-fp16": "allgather:wire=float16",
         "union": "union", "balanced": "balanced", "sparcml": "union", "sketch": "sketch", "sketch-ef": "sketch:error=1,wire=float16",
         "union-sketch": "union:error=2,wire=float16"}
HEADER_BYTES = 16  # allgatherv's per-rank header: row count and a digest
SPARCML_HEADER = 24  # recursive doubling's header: count, size, dtype digest
WIRE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
HEADROOM, GROW = 1.1, 1.25  # the sketch's defaults


def ring(n: int, nbytes: float) -> float:
    return 2 * (n - 1) / n * nbytes


def dense_bytes(n: int, rows: int, width: int, itemsize: int = 4) -> float:
    return ring(n, rows * width * itemsize)


def horovod_sparse_bytes(n: int, nnz_rows: float, width: int, itemsize: int = 4) -> float:
    return (n - 1) * nnz_rows * (8 + width * itemsize)


def allgather_bytes(n: int, nnz_rows: float, width: int, itemsize: int = 4) -> float:
    return (n - 1) * (2 * HEADER_BYTES + nnz_rows * (4 + width * itemsize))


def bitmap_bytes(n: int, rows: int) -> float:
    return ring(n, math.ceil(rows / 8))


def union_bytes(n: int, rows: int, union_rows: float, width: int, itemsize: int = 4) -> float:
    return bitmap_bytes(n, rows) + ring(n, union_rows * width * itemsize)


def balanced_bytes(n: int, rows: int, nnz_rows: float, union_rows: float, width: int, itemsize: int = 4,
                   code: float | None = None) -> float:
    """The balanced method over the MPI layer (its allgathervs' and alltoallv's headers counted)."""
    return cost.balanced_bytes(rows, width * itemsize, nnz_rows, union_rows, n, code, header=5 * HEADER_BYTES)


def bound_bytes(n: int, rows: int, nnz_rows: float, union_rows: float, width: int, itemsize: int = 4) -> float:
    """The lower bound of any exact exchange: its values and the union's index."""
    return sum(cost.lower_bound(rows, width * itemsize, nnz_rows, union_rows, n))


def sparcml_bytes(n: int, rows: int, width: int, union_of: Callable[[int], float], itemsize: int = 4) -> float:
    """Recursive doubling over a power-of-two N: in round j every rank sends its partial sum over
    2^j ranks as (index, value) pairs, sparse while smaller than dense."""
    rounds = int(math.log2(n))
    return sum(SPARCML_HEADER + min(union_of(2 ** j) * width * (8 + itemsize), rows * width * itemsize)
               for j in range(rounds))


def planned_bound(union_rows: float, rows: int) -> int:
    """The rows the one-round sketch plans for when the union seen last had ``union_rows``."""
    return sizing.bound_of(sizing.level_of(union_rows, HEADROOM, GROW), GROW, rows)


def sketch_cells(bound_rows: float, width: int, error: float, sketch_rows: int = 1) -> int:
    """Cells of a count sketch sized for ``bound_rows`` rows of ``width`` at relative L2 ``error``."""
    return sketch_rows * math.ceil(max(bound_rows, 1) * width / error ** 2)


def sketch_bytes(n: int, rows: int, bound_rows: float, width: int, error: float, sketch_rows: int = 1,
                 wire: int = 4, itemsize: int = 4) -> float:
    """The bitmap and the cells in one round, or the dense tensor when they would not be smaller."""
    cells = sketch_cells(bound_rows, width, error, sketch_rows)
    if math.ceil(rows / 8) + cells * wire >= rows * width * itemsize:
        return dense_bytes(n, rows, width, itemsize)
    return bitmap_bytes(n, rows) + ring(n, cells * wire)


def steps_of(algorithm: str, n: int) -> int:
    """Sequential message steps of an algorithm's collectives at N ranks (dependent rounds added)."""
    ring_steps = 2 * (n - 1)
    return {"dense": ring_steps, "horovod-sparse": ring_steps, "allgather": ring_steps, "allgather-fp16": ring_steps,
            "union": 2 * ring_steps, "balanced": 2 * ring_steps + n - 1, "sparcml": 2 * int(math.log2(n)),
            "sketch": ring_steps,
            "sketch-ef": ring_steps, "union-sketch": 2 * ring_steps}[algorithm]


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

    @classmethod
    def from_dict(cls, d: dict) -> "Supports":
        return cls(**{**d, "union": {int(k): v for k, v in d["union"].items()},
                      "groups": {int(k): v for k, v in d["groups"].items()}})


@dataclass(frozen=True)
class Point:
    workload: str
    tensor: str
    ranks: int
    algorithm: str
    bytes_per_rank: float
    seconds: float = 0.0  # per step: latency steps, bytes over bandwidth, codec
    codec_seconds: float = 0.0


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


#: Rows a codec is timed on at most; more are priced in proportion.
CODEC_ROWS = 1 << 16


@functools.lru_cache(maxsize=None)
def codec_seconds(flag: str, rows: int, width: int, held: int, gathered: int, seed: int = 0) -> float:
    """Compress and decompress seconds of ``flag`` on one rank whose row-sparse gradient holds
    ``gathered`` rows (coalescing to ``held`` distinct ones), as :mod:`hvdsketch.policy.cost` measures;
    timed on at most :data:`CODEC_ROWS` rows and scaled up in proportion."""
    import torch

    from hvdsketch.compress import RowSparse, TensorContext, create
    from hvdsketch.policy.cost import measure as measure_codec

    scale = max(1.0, gathered / CODEC_ROWS)
    held, gathered = max(1, round(min(held, gathered / scale))), max(1, round(gathered / scale))
    rng = np.random.default_rng(seed)
    distinct = np.sort(rng.choice(rows, held, replace=False))
    indices = torch.from_numpy(np.resize(distinct, gathered))
    values = torch.from_numpy(rng.standard_normal((gathered, width)).astype(np.float32))
    if flag.startswith("sketch"):  # sized, as after a first exchange, for this union
        flag += f"{',' if ':' in flag else ':'}density={held / rows:.6g}"
    return scale * measure_codec(create(flag), RowSparse(indices, values, (rows, width)),
                                 TensorContext("scaling", (rows, width), 1, 1), repeats=3).compute


def model(s: Supports, error: float, sketch_rows: int, wire: int, latency: float = 0.0,
          bandwidth: float = math.inf, codec: Callable[[str, int, int], float] | None = None) -> list[Point]:
    """Bytes and seconds per rank of every algorithm at every N whose union was measured; ``codec(flag,
    held, gathered)`` gives a compressor's seconds (none: 0)."""
    k = float(np.mean(s.per_batch))
    points = []
    for n, union in sorted(s.union.items()):
        if n < 2:
            continue
        bound = planned_bound(union, s.rows)
        values = {"dense": dense_bytes(n, s.rows, s.width),
                  "horovod-sparse": horovod_sparse_bytes(n, k, s.width),
                  "allgather": allgather_bytes(n, k, s.width),
                  "allgather-fp16": allgather_bytes(n, k, s.width, 2),
                  "union": union_bytes(n, s.rows, union, s.width),
                  "balanced": balanced_bytes(n, s.rows, k, union, s.width),
                  "sparcml": sparcml_bytes(n, s.rows, s.width, lambda m: s.union.get(m, k) if m > 1 else k),
                  "sketch": sketch_bytes(n, s.rows, bound, s.width, error, sketch_rows, wire),
                  "sketch-ef": sketch_bytes(n, s.rows, bound, s.width, 1.0, 1, 2),
                  "union-sketch": bitmap_bytes(n, s.rows) + ring(n, sketch_cells(union, s.width, 2.0) * 2)}
        for a in ALGORITHMS:
            flag = FLAGS[a]
            gathered = round(n * k) if a in ("horovod-sparse", "allgather", "allgather-fp16") else round(union)
            compute = codec(flag, min(s.rows, round(union)), gathered) if codec and flag else 0.0
            seconds = steps_of(a, n) * latency + values[a] / bandwidth + compute
            points.append(Point(s.workload, s.tensor, n, a, values[a], seconds, compute))
        bound = bound_bytes(n, s.rows, k, union, s.width)
        points.append(Point(s.workload, s.tensor, n, "bound", bound, bound / bandwidth))
    return points


def winners(points: Sequence[Point], among: Sequence[str] = ALGORITHMS, key: str = "bytes_per_rank"
            ) -> list[tuple[int, int, str]]:
    """Runs of consecutive N with the same best algorithm by ``key``: (first N, last N, algorithm)."""
    by_n: dict[int, dict[str, float]] = {}
    for p in points:
        if p.algorithm in among:
            by_n.setdefault(p.ranks, {})[p.algorithm] = getattr(p, key)
    runs: list[tuple[int, int, str]] = []
    for n in sorted(by_n):
        best = min(by_n[n], key=by_n[n].get)
        if runs and runs[-1][2] == best:
            runs[-1] = (runs[-1][0], n, best)
        else:
            runs.append((n, n, best))
    return runs


def table(s: Supports, points: Sequence[Point], key: str, unit: str, scale: float) -> str:
    headers = ["ranks", "union rows", *(f"{a} {unit}" for a in COLUMNS), "best exact"]
    rows = []
    for n in sorted({p.ranks for p in points}):
        mine = {p.algorithm: getattr(p, key) for p in points if p.ranks == n}
        rows.append([str(n), f"{s.union[n]:.0f}", *(report.number(mine[a] * scale, 4) for a in COLUMNS),
                     min(EXACT, key=mine.get)])
    return report.markdown(headers, rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", action="append", help="a workload's training YAML, repeatable "
                        "(default: configs/lstm.yaml and configs/fasttext.yaml)")
    parser.add_argument("--supports", help="the JSON of an earlier run: model its supports instead of measuring")
    parser.add_argument("--batches", type=int, default=1024, help="real batches to measure (the largest N)")
    parser.add_argument("--groups", type=int, default=16, help="disjoint groups averaged per N")
    parser.add_argument("--sketch-error", type=float, default=0.5, help="relative L2 error the sketch is sized for")
    parser.add_argument("--sketch-rows", type=int, default=1)
    parser.add_argument("--sketch-wire", choices=sorted(WIRE_BYTES), default="float32")
    parser.add_argument("--bandwidth", default="1gbit", help="link bandwidth per rank for the time model")
    parser.add_argument("--latency", default="50us", help="seconds per sequential message step")
    parser.add_argument("--no-codec", action="store_true", help="leave the measured codec out of the times")
    parser.add_argument("--json", help="write supports, bytes and times here")
    parser.add_argument("--markdown", help="write the tables here")
    parser.add_argument("--plot", help="write log-log PNGs of bytes (this path) and time (-time) against N here")


def run(args: argparse.Namespace) -> int:
    from hvdsketch.policy.cost import parse_bandwidth, parse_latency

    if args.batches < 2 or args.groups < 1 or args.sketch_error <= 0 or args.sketch_rows < 1:
        raise SystemExit("hvdsketch bench scaling: needs --batches >= 2, --groups >= 1, --sketch-error > 0, "
                         "--sketch-rows >= 1")
    bandwidth, latency = parse_bandwidth(args.bandwidth), parse_latency(args.latency)
    if not args.no_codec:
        import torch

        torch.set_num_threads(1)  # one core per rank, as in training
    measured: list[Supports] = []
    if args.supports:
        measured = [Supports.from_dict(d) for d in json.loads(Path(args.supports).read_text())["supports"]]
    else:
        ranks = [2 ** i for i in range(1, int(math.log2(args.batches)) + 1)]
        for config in args.config or ["configs/lstm.yaml", "configs/fasttext.yaml"]:
            measured += measure(config, args.batches, ranks, args.groups)
            print(f"measured {config}: " + ", ".join(f"{s.tensor} {s.rows}x{s.width}, {np.mean(s.per_batch):.0f} "
                                                     f"rows per batch" for s in measured if s.workload in config),
                  flush=True)
    wire = WIRE_BYTES[args.sketch_wire]
    sections, panels, times, everything = [], {}, {}, []
    for s in measured:
        codec = None if args.no_codec else (
            lambda flag, held, gathered, s=s: codec_seconds(flag, s.rows, s.width, held, gathered))
        points = model(s, args.sketch_error, args.sketch_rows, wire, latency, bandwidth, codec)
        everything += points

        def ranges(key: str) -> str:
            def runs(among: Sequence[str]) -> str:
                return "; ".join(f"{a} for N = {lo}..{hi}" if lo != hi else f"{a} at N = {lo}"
                                 for lo, hi, a in winners(points, among, key))
            return f"exact methods: {runs(EXACT)}; all (lossy ones with error feedback): {runs(ALGORITHMS)}"

        sections.append(f"### {s.workload} `{s.tensor}` ({s.rows} x {s.width}, batch {s.batch_size}, "
                        f"{np.mean(s.per_batch):.0f} rows per rank)\n\nBytes each rank sends per step:\n\n"
                        f"{table(s, points, 'bytes_per_rank', 'MB', 1e-6)}\n\nFewest bytes, {ranges('bytes_per_rank')}."
                        f"\n\nSeconds per step (latency steps + bytes / bandwidth + codec measured here):\n\n"
                        f"{table(s, points, 'seconds', 'ms', 1e3)}\n\nFastest, {ranges('seconds')}.")
        name = f"{s.workload} {s.tensor}"
        panels[name] = {a: [(p.ranks, p.bytes_per_rank / 1e6) for p in points if p.algorithm == a] for a in COLUMNS}
        times[name] = {a: [(p.ranks, p.seconds * 1e3) for p in points if p.algorithm == a] for a in COLUMNS}
    text = (f"Sketch sized at {args.sketch_error:g} relative L2 error, {args.sketch_rows} row(s), "
            f"{args.sketch_wire} cells (sketch-ef: error 1, float16 cells; union-sketch: error 2, float16 cells); "
            f"bytes are the mean per rank; times at {args.bandwidth} per rank and {args.latency} per message step"
            f"{'' if args.no_codec else ', codec measured on this machine (one core)'}. "
            f"`hvdsketch bench scaling` wrote this.\n\n" + "\n\n".join(sections) + "\n")
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        options = {k: v for k, v in vars(args).items() if k != "run"}
        Path(args.json).write_text(json.dumps({"options": options, "supports": [asdict(s) for s in measured],
                                               "points": [asdict(p) for p in everything]}, indent=1))
    if args.plot:
        report.line_plot(panels, args.plot, "Bytes each rank sends per step, measured supports",
                         "ranks N", "MB per rank", log="xy")
        stem = Path(args.plot)
        report.line_plot(times, str(stem.with_name(stem.stem + "-time" + stem.suffix)),
                         f"Seconds per step at {args.bandwidth}, {args.latency} per step", "ranks N",
                         "ms per step", log="xy")
    return 0
