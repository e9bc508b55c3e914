"""Every compressor on one gradient: compression ratio, compress and decompress throughput, error.

The gradient has ``--numel`` float32 elements shaped ``(numel / width, width)``,
like an embedding layer's; a ``--density`` fraction of its rows is non-zero
(standard normal values, rows drawn at random); ``--sparse`` hands it over as
its rows (a :class:`~hvdsketch.compress.RowSparse`, as ``nn.Embedding(sparse=True)``
gives it) instead of dense. Each compressor (every registered one with its
defaults, or the ``--compressor`` flags given) runs step after step as a
single rank would, one state table for all steps (so the sketch is sized from the
step before, as in training; the warm-up steps include its dense first step),
every reduction the identity, in the chosen framework's back-end, with
``--memory`` error feedback if given:

  ratio        dense bytes / bytes the rank puts into its collectives, all rounds together
  compress     time until the first round's messages are ready, and dense GB/s through it
  decompress   time from the first reduction to the result (PowerSGD's second round included),
               a dense one written into the gradient's own memory, as PyTorch's optimizer averages
               ``.grad`` in place (each step's gradient copied there first, untimed; an exact method
               then writes only the union's units, the rest being 0 already; with the identity as
               reduction, ``none`` writes nothing); TensorFlow: a new tensor
  x copy       (compress + decompress) / the time of one copy of the dense gradient into an
               existing buffer on its device (median, and the range over the repeats)
  error        ||result - g|| / ||g||: what one rank's compression loses, before averaging

The copy (``out.copy_(g)``, ``np.copyto``, a ``tf.Variable``'s ``assign``: no new
memory) reads the gradient once and writes it once, at the memory bandwidth the
header prints; it is the least any codec pays that reads the gradient and writes a
result of its size, so ``x copy`` counts passes over the data, and a codec many
times slower spends its time elsewhere (allocating a fresh result costs more than
that copy: the header prints an allocating copy, ``clone``, beside it). Times are the
median of ``--repeats`` runs after ``--warmup`` runs, each waiting for the device
(``--device cuda`` runs PyTorch on the GPU), the copies timed in the same run as the
codecs. The table goes to stdout, the same rows as JSON to ``--json`` (``-`` for stdout).
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from hvdsketch.lab.bench.report import allocator
from hvdsketch.ops.contract import Ops

FRAMEWORKS = {"numpy": ("numpy", "asarray"), "torch": ("torch", "from_numpy"),
              "tensorflow": ("tensorflow", "convert_to_tensor")}  # module, numpy -> tensor


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"density must be in [0, 1], got {text}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--numel", type=_positive, default=10_000_000, help="gradient elements (default 10^7)")
    parser.add_argument("--width", type=_positive, default=250,
                        help="row length; numel must be a multiple of it (default 250)")
    parser.add_argument("--density", type=_fraction, default=0.01, help="fraction of non-zero rows (default 0.01)")
    parser.add_argument("--compressor", action="append", metavar="FLAG",
                        help="a compression flag, repeatable (default: every registered compressor)")
    parser.add_argument("--framework", choices=sorted(FRAMEWORKS), default="torch",
                        help="array back-end to run in (default torch)")
    parser.add_argument("--device", default="cpu",
                        help="PyTorch device to run on, e.g. cuda or cuda:1 (default cpu)")
    parser.add_argument("--sparse", action="store_true",
                        help="hand the gradient over as its non-zero rows (RowSparse), not dense")
    parser.add_argument("--memory", help="residual memory flag (error feedback), e.g. fp32 or sketch")
    parser.add_argument("--threads", type=_positive,
                        help="PyTorch intra-op threads (default: PyTorch's); 1 as in training with a rank per core")
    parser.add_argument("--repeats", type=_positive, default=3, help="timed runs per compressor (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the rows as JSON here ('-': stdout)")


@dataclass(frozen=True)
class Row:
    compressor: str
    ratio: float
    compress_ms: float
    compress_gbps: float
    decompress_ms: float
    decompress_gbps: float
    copy_ratio: float
    copy_ratio_range: tuple[float, float]  # the fastest and slowest repeat's total over the copy
    relative_error: float
    collectives: str  # per round, e.g. "allgather+allgather" or "average | average"


def gradient(numel: int, width: int, density: float, seed: int) -> np.ndarray:
    """A float32 ``(numel / width, width)`` matrix with a ``density`` fraction of random rows non-zero."""
    if numel % width:
        raise ValueError(f"--numel {numel} is not a multiple of --width {width}")
    rows = numel // width
    rng = np.random.default_rng(seed)
    g = np.zeros((rows, width), np.float32)
    chosen = rng.choice(rows, round(density * rows), replace=False)
    g[chosen] = rng.standard_normal((len(chosen), width), dtype=np.float32)
    return g


def measure(compressor: Any, tensor: Any, shape: tuple[int, ...], step: int, memory: Any, out: Any = None,
            states: Any = None) -> tuple[float, float, Any, list[list[Any]]]:
    """One step of ``compressor``: compress and decompress seconds (error feedback's compensation and
    residual included), result (in ``out`` when given: the gradient's own memory), messages per round;
    the tensor's state from ``states`` and back (a :class:`~hvdsketch.compress.state.StateTable`)."""
    from hvdsketch.compress import TensorContext
    from hvdsketch.compress.support import values_of
    from hvdsketch.exchange.flight import Flight

    ops = backend_of(tensor)
    ops.synchronize(values_of(tensor))
    start = time.perf_counter()
    flight = Flight(compressor, tensor, TensorContext("bench", shape, step, 1, out=out), memory, states)
    rounds = [flight.messages]
    flight.settle()
    for m in rounds[0]:
        ops.synchronize(values_of(m.tensor))
    middle = time.perf_counter()
    while not flight.advance([m.tensor for m in rounds[-1]]):
        rounds.append(flight.messages)
        flight.settle()
    ops.synchronize(values_of(flight.result))
    return middle - start, time.perf_counter() - middle, flight.result, rounds


def backend_of(tensor: Any) -> Any:
    """The ops back-end of a dense or row-sparse tensor."""
    from hvdsketch.compress.support import values_of
    from hvdsketch.ops import backend

    return backend(values_of(tensor))


def copier(ops: Ops, tensor: Any, into_existing: bool) -> Callable[[], Any]:
    """A copy of ``tensor`` on its device: into a buffer made once (``into_existing``), else into
    fresh memory (``clone``); what the call returns is the copy, to wait for."""
    if ops.name == "tensorflow":
        import tensorflow as tf

        if not into_existing:
            return lambda: tf.raw_ops.DeepCopy(x=tensor)
        buffer = tf.Variable(tf.zeros_like(tensor), trainable=False)
        return lambda: buffer.assign(tensor, read_value=True)
    if not into_existing:
        return tensor.copy if ops.name == "numpy" else tensor.clone
    buffer = ops.zeros(ops.shape(tensor), ops.dtype_name(tensor), tensor)
    if ops.name == "numpy":
        def copy() -> np.ndarray:
            np.copyto(buffer, tensor)
            return buffer
        return copy
    return lambda: buffer.copy_(tensor)


def copy_seconds(tensor: Any, ops: Ops, repeats: int, warmup: int, into_existing: bool = True) -> float:
    """Median seconds of one copy of the dense ``tensor`` on its device (:func:`copier`), timed as
    the codecs are."""
    copy = copier(ops, tensor, into_existing)
    times = []
    for _ in range(warmup + repeats):
        ops.synchronize(tensor)
        start = time.perf_counter()
        ops.synchronize(copy())
        times.append(time.perf_counter() - start)
    return statistics.median(times[warmup:])


def bench(flag: str, g: np.ndarray, tensor: Any, repeats: int, warmup: int, copy_s: float,
          memory: str | None = None) -> Row:
    from hvdsketch.compress import RowSparse, create
    from hvdsketch.compress.state import StateTable
    from hvdsketch.memory import create as create_memory

    compressor = create(flag)
    residuals = None if memory is None else create_memory(memory)
    if isinstance(tensor, RowSparse) and not compressor.row_sparse:
        tensor = tensor.to_dense()  # as the exchanger hands it over
    ops = backend_of(tensor)
    # a dense result goes into the gradient's own memory, as PyTorch's optimizer averages .grad in place:
    # each step's gradient is copied there first, outside the timing
    own = None if isinstance(tensor, RowSparse) or ops.name == "tensorflow" else ops.zeros(g.shape, "float32", tensor)
    states = StateTable()

    def step(number: int) -> tuple[float, float, Any, list[list[Any]]]:
        if own is None:
            return measure(compressor, tensor, g.shape, number, residuals, None, states)
        return measure(compressor, ops.into(own, tensor), g.shape, number, residuals, own, states)

    runs = [step(number) for number in range(warmup + repeats)][warmup:]
    compress_s = statistics.median(r[0] for r in runs)
    decompress_s = statistics.median(r[1] for r in runs)
    totals = [(r[0] + r[1]) / copy_s for r in runs]
    _, _, result, rounds = runs[-1]
    sent = sum(ops.nbytes(m.tensor) for messages in rounds for m in messages)
    truth = g.astype(np.float64)
    dense = result.to_dense() if isinstance(result, RowSparse) else result
    error = np.linalg.norm(ops.to_numpy(dense).astype(np.float64) - truth) / max(np.linalg.norm(truth), 1e-300)
    return Row(compressor=str(compressor) + (f" +{memory}" if memory else ""), ratio=g.nbytes / sent,
               compress_ms=1e3 * compress_s, compress_gbps=g.nbytes / compress_s / 1e9,
               decompress_ms=1e3 * decompress_s, decompress_gbps=g.nbytes / decompress_s / 1e9,
               copy_ratio=(compress_s + decompress_s) / copy_s, copy_ratio_range=(min(totals), max(totals)),
               relative_error=float(error),
               collectives=" | ".join("+".join(m.op for m in messages) for messages in rounds))


def table(rows: list[Row]) -> str:
    head = (f"{'compressor':<22} {'ratio':>8} {'compress ms':>12} {'GB/s':>7} {'decompress ms':>14} {'GB/s':>7} "
            f"{'x copy':>7} {'range':>11} {'rel. error':>10}  collectives")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.compressor:<22} {r.ratio:>8.1f} {r.compress_ms:>12.1f} {r.compress_gbps:>7.2f} "
                     f"{r.decompress_ms:>14.1f} {r.decompress_gbps:>7.2f} {r.copy_ratio:>7.1f} "
                     f"{r.copy_ratio_range[0]:>5.1f}..{r.copy_ratio_range[1]:<4.1f} "
                     f"{r.relative_error:>10.3g}  {r.collectives}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from hvdsketch.compress import REGISTRY, RowSparse, create
    from hvdsketch.ops import backend

    flags = args.compressor or list(REGISTRY)
    for flag in flags:
        create(flag)  # a bad flag fails before any timing
    if args.memory:
        from hvdsketch.memory import create as create_memory

        create_memory(args.memory)
    g = gradient(args.numel, args.width, args.density, args.seed)
    if args.device != "cpu" and args.framework != "torch":
        raise ValueError(f"--device {args.device} runs PyTorch; --framework {args.framework} runs on the host")
    module, convert = FRAMEWORKS[args.framework]
    framework = importlib.import_module(module)
    if args.threads and args.framework == "torch":
        framework.set_num_threads(args.threads)
    convert = getattr(framework, convert)

    def to_tensor(a: np.ndarray) -> Any:
        made = convert(a)
        return made if args.device == "cpu" else made.to(args.device)

    tensor = to_tensor(g)
    ops = backend(tensor)
    copy_s = copy_seconds(tensor, ops, args.repeats, args.warmup)
    clone_s = copy_seconds(tensor, ops, args.repeats, args.warmup, into_existing=False)
    if args.sparse:
        rows = np.flatnonzero(np.any(g != 0, axis=1))
        tensor = RowSparse(to_tensor(rows), to_tensor(g[rows]), g.shape)
    rows = []
    print(f"# {args.numel} float32 elements as {g.shape}, {args.density:g} of rows non-zero"
          f"{' given as rows' if args.sparse else ''}, {args.framework} back-end on {args.device}, "
          f"median of {args.repeats}; one copy of the gradient into an existing buffer {1e3 * copy_s:.2f} ms "
          f"({2 * g.nbytes / copy_s / 1e9:.1f} GB/s read + written), into new memory (clone) "
          f"{1e3 * clone_s:.2f} ms; allocator: {allocator()}", flush=True)
    for flag in flags:
        rows.append(bench(flag, g, tensor, args.repeats, args.warmup, copy_s, args.memory))
        print(f"#   {rows[-1].compressor} done", file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        report = {"numel": args.numel, "shape": list(g.shape), "density": args.density, "sparse": args.sparse,
                  "memory": args.memory, "framework": args.framework, "device": args.device,
                  "repeats": args.repeats, "copy_ms": 1e3 * copy_s, "copy_gbps": 2 * g.nbytes / copy_s / 1e9,
                  "clone_ms": 1e3 * clone_s, "allocator": allocator(), "rows": [asdict(r) for r in rows]}
        text = json.dumps(report, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as out:
                out.write(text + "\n")
    return 0
