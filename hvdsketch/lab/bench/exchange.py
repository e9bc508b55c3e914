"""One tensor's gradient exchange under every entry, on real gradients, side by side.

Run under ``launch/cluster.sh`` (``hvdsketch bench train`` runs it once per
cell of workloads that name a ``probe`` tensor). Every rank builds the
workload's model (PyTorch) and, for each of ``--steps`` real batches of its
shard, computes the gradient; then, for every entry in turn (the order
rotates each step, so no entry always goes first), all ranks meet at a
barrier and exchange that one tensor (``--tensor all``: every gradient of the
model, as one step; the bound is then left out):

- a compression setting (a flag or a rules mapping) gets the compressor its
  policy picks for the tensor, and :class:`hvdsketch.exchange.Exchanger`
  averages it over Horovod as ``hvdsketch``'s optimizer would; for ``none``
  that is Horovod's dense allreduce of the densified gradient, what
  ``--path horovod`` does with ``sparse_as_dense``;
- ``path: horovod`` with ``sparse_as_dense: false`` is Horovod's own sparse
  allreduce, an allgather of the gradient's indices and values (dense
  gradients: Horovod's allreduce).

A step's time is the slowest rank's. The first ``--warmup`` steps are not
timed nor counted: one warms every entry up, and ``auto`` decides after its
first two (dense, its probe), so its figures are those of the compressor it
chose. The timed steps are cut into ``--batches`` runs of consecutive steps
(batch means: steps in a row share the machine's mood, batches less so); an
entry's time is the median of its batches' medians with their range
(:class:`~hvdsketch.lab.bench.spread.Spread`), and its time against
``--baseline`` the same over the step-by-step ratios (each step's gradient
exchanged by both). ``--subject`` names an entry to hold against the fastest
of the others the same way, judged by the benchmark's rule
(:func:`~hvdsketch.lab.bench.targets.judge`): at most ``--margin`` slower on
the whole spread is met, on none of it MISSED, else undecided. The JSON
keeps every step's time, bytes per step (this rank's counters, Horovod's ring
model; their mean and maximum over the ranks). Beside them, the
lower bound of any exact exchange of the step's gradient
(:func:`hvdsketch.policy.cost.lower_bound`), from its real ``z`` (rows a rank
touched, the mean over ranks) and ``u`` (their union), and each entry's bytes
over it. Training is not
part of it: the weights stay at their initial values, and only the
gradient's values and support matter here.

Under shaped links (``launch/cluster.sh --rate``, which exports
``HVDSKETCH_CLUSTER_RATE``) each entry also gets its floor: the busiest rank's
bytes over its link, sent or received, whichever is more (each direction
carries :data:`TCP_SHARE` of the rate), plus its collectives a step
times the link's latency, a small allreduce's round trip timed after the
entries (the slowest rank's, the median of :data:`LATENCY_PROBES`). Every entry
records its codec seconds a step (compressors and memory, the busiest rank's).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any, Callable

import numpy as np
import yaml

from hvdsketch.lab.bench.spread import Spread
from hvdsketch.lab.bench.targets import judge

#: What TCP moves of a tbf-shaped link's rate at MTU 1500: tbf counts whole frames (1448 / 1514).
TCP_SHARE = 1448 / 1514
#: Small allreduces timed for the link's latency.
LATENCY_PROBES = 21


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="the workload's training YAML")
    parser.add_argument("--tensor", required=True,
                        help="parameter name, e.g. embedding.weight, or 'all': every gradient of the model, one step")
    parser.add_argument("--entries", required=True,
                        help="YAML list of entries (label, compression, path, sparse_as_dense), as in bench configs")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="steps first, neither timed nor counted (3: auto decides after its first two)")
    parser.add_argument("--batches", type=int, default=5,
                        help="the timed steps in this many batches of consecutive steps, for the spreads")
    parser.add_argument("--baseline", default="dense", help="label of the entry others are compared with")
    parser.add_argument("--subject", help="label of an entry held against the fastest other one")
    parser.add_argument("--margin", type=float, default=0.05,
                        help="how much slower than the fastest other entry --subject may be (0.05: 5%%)")
    parser.add_argument("--json", help="write the results here (rank 0)")


def _exchangers(entries: list[Any], params: dict[str, Any], hvd: Any) -> dict[str, tuple[Callable[[int], Any], Any]]:
    """Per entry label: ``step -> None`` exchanging the gradients of ``params`` (name to parameter) as one
    step, and its byte counters."""
    from hvdsketch.collectives.horovod import HorovodCommunicator
    from hvdsketch.collectives.stats import CommStats, ring_allreduce_bytes
    from hvdsketch.exchange import Exchanger
    from hvdsketch.policy import create as create_policy
    from hvdsketch.torch.convert import as_hvdsketch

    out = {}
    for entry in entries:
        if entry.path == "horovod" and entry.sparse_as_dense is False:
            stats = CommStats()

            def gather(step: int, stats: CommStats = stats) -> None:  # as Horovod's optimizer: sparse allgathered
                if not any(p.grad.is_sparse for p in params.values()):
                    raise ValueError(f"hvdsketch bench exchange: {', '.join(params)}: no sparse gradient to allgather")
                waits = []
                for name, p in params.items():
                    grad = p.grad
                    if grad.is_sparse:
                        waits.append(hvd.sparse_allreduce_async(grad, name=f"probe.{name}", op=hvd.Average))
                        local = grad._indices().nbytes + grad._values().nbytes
                        stats.record("allgather", (hvd.size() - 1) * local, (hvd.size() - 1) * local)
                    else:
                        handle = hvd.allreduce_async(grad, name=f"probe.{name}", op=hvd.Average)
                        waits.append(lambda handle=handle: hvd.synchronize(handle))
                        ring = ring_allreduce_bytes(grad.numel() * grad.element_size(), hvd.size())
                        stats.record("allreduce", ring, ring)
                for wait in waits:
                    wait()  # a callable handle

            out[entry.label] = (gather, stats)
            continue
        exchanger = Exchanger(create_policy(entry.compression), HorovodCommunicator(hvd),
                              prefix=f"hvdsketch.{entry.label}")

        def exchange(step: int, exchanger: Exchanger = exchanger) -> None:
            exchanger.exchange({name: as_hvdsketch(p.grad) for name, p in params.items()})

        out[entry.label] = (exchange, exchanger.communicator.stats)
    return out


def support(grad: Any, hvd: Any) -> tuple[float, int]:
    """``(z, u)`` of a gradient: rows this rank touched, averaged over the ranks, and the union's
    rows (an allgather of each rank's rows, outside every entry's counters)."""
    import torch

    rows = (grad.coalesce()._indices()[0] if grad.is_sparse else
            torch.nonzero(grad.reshape(grad.shape[0], -1).abs().sum(dim=1)).reshape(-1))
    touched = hvd.allreduce(torch.tensor([float(rows.numel())], device=grad.device), op=hvd.Average,
                            name="probe.z").item()
    union = torch.unique(hvd.allgather(rows.to(torch.int64), name="probe.u")).numel()
    return touched, union


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run the probe on this rank; every rank returns the same table."""
    import horovod.torch as hvd
    import torch

    from hvdsketch.lab.bench.matrix import Entry
    from hvdsketch.lab.config import TrainConfig
    from hvdsketch.lab.workloads import get
    from hvdsketch.policy.cost import lower_bound

    hvd.init()
    torch.set_num_threads(max(1, torch.get_num_threads() // hvd.local_size()))
    config = TrainConfig.load(args.config)
    workload = get(config.workload)
    if getattr(workload, "framework", "torch") != "torch":
        raise SystemExit(f"hvdsketch bench exchange: {workload.name} is not a PyTorch workload")
    entries = [Entry.from_mapping(e) for e in yaml.safe_load(open(args.entries)) or []]
    if args.baseline not in [e.label for e in entries]:
        raise SystemExit(f"hvdsketch bench exchange: no entry labelled {args.baseline!r} (the baseline)")
    model = workload.build_model()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    params = dict(model.named_parameters())
    if args.tensor != "all" and args.tensor not in params:
        raise SystemExit(f"hvdsketch bench exchange: no parameter {args.tensor!r}; valid: all, {', '.join(params)}")
    exchanged = {n: p for n, p in params.items() if p.requires_grad} if args.tensor == "all" else {
        args.tensor: params[args.tensor]}
    param = params[args.tensor] if args.tensor != "all" else None  # the one tensor with a bound
    device = next(iter(exchanged.values())).device
    runs = _exchangers(entries, exchanged, hvd)
    times: dict[str, list[float]] = {label: [] for label in runs}
    batches = workload.train_batches(0, hvd.rank(), hvd.size())
    bounds: list[tuple[float, float, float, int]] = []  # (values, index, z, u) per timed step
    row_bytes = param[0].numel() * param.element_size() if param is not None else 0
    for step, batch in zip(range(args.warmup + args.steps), batches):
        model.zero_grad(set_to_none=True)
        workload.loss(model, batch).backward()
        if step == args.warmup:
            for _, stats in runs.values():
                stats.reset()
        if step >= args.warmup and param is not None:
            touched, union = support(param.grad, hvd)
            bounds.append((*lower_bound(param.shape[0], row_bytes, touched, union, hvd.size()), touched, union))
        labels = list(runs)
        for label in labels[step % len(labels):] + labels[:step % len(labels)]:
            hvd.barrier()
            start = time.perf_counter()
            runs[label][0](step)
            seconds = time.perf_counter() - start
            slowest = hvd.allreduce(torch.tensor([seconds], device=device), op=hvd.Max, name="probe.time").item()
            if step >= args.warmup:
                times[label].append(slowest)
    steps = max(len(next(iter(times.values()))), 1)
    latency = probe_latency(hvd, device)
    rate = link_rate()
    values, index, touched, union = (statistics.mean(column) for column in zip(*bounds)) if bounds else (0, 0, 0, 0)
    counted = [runs[e.label][1] for e in entries]
    # a step of each entry: bytes sent, bytes over the link (sent or received), codec seconds
    mine = torch.tensor([[c.bytes_sent / steps for c in counted],
                         [max(c.bytes_sent, c.bytes_received) / steps for c in counted],
                         [c.seconds["codec"] / steps for c in counted]], dtype=torch.float64, device=device)
    mean = hvd.allreduce(mine[0], op=hvd.Average, name="probe.bytes.mean").tolist()
    most, busiest, codec = hvd.allreduce(mine, op=hvd.Max, name="probe.most").tolist()
    rows = []
    for i, e in enumerate(entries):
        seconds = batched(times[e.label], args.batches)
        against = ratio(times[e.label], times[args.baseline], args.batches)
        collectives = sum(c["calls"] for c in runs[e.label][1].snapshot().values()) / steps
        floor = busiest[i] / (rate * TCP_SHARE) + collectives * latency if rate else None
        rows.append({"label": e.label, "exchange_s": seconds.center, "exchange_range_s": [seconds.low, seconds.high],
                     "vs_baseline": against.center, "vs_baseline_range": [against.low, against.high],
                     "bytes_sent_per_step": runs[e.label][1].bytes_sent / steps,
                     "mean_bytes_sent_per_step": mean[i], "max_bytes_sent_per_step": most[i],
                     "vs_bound": mean[i] / (values + index) if values + index else None, "times_s": times[e.label],
                     "collectives_per_step": collectives, "link_bytes_per_step": busiest[i], "codec_s": codec[i],
                     "floor_s": floor,
                     "vs_floor": seconds.center / floor if floor else None})
    shape = list(param.shape) if param is not None else [sum(p.numel() for p in exchanged.values())]
    result = {"workload": str(workload), "tensor": args.tensor, "shape": shape, "size": hvd.size(),
              "steps": steps, "warmup": args.warmup, "batches": args.batches, "baseline": args.baseline,
              "rows": rows, "bound": {"values_bytes": values, "index_bytes": index, "z": touched, "u": union},
              "link": {"rate": os.environ.get("HVDSKETCH_CLUSTER_RATE"), "bytes_per_s": rate, "latency_s": latency}}
    if args.subject:
        result["subject"] = against_fastest(times, args.subject, args.margin, args.batches)
    return result


def probe_latency(hvd: Any, device: Any) -> float:
    """A small allreduce's round trip, the slowest rank's, the median of :data:`LATENCY_PROBES`."""
    import torch

    times = []
    for _ in range(LATENCY_PROBES):
        hvd.barrier()
        start = time.perf_counter()
        hvd.allreduce(torch.zeros(2, device=device), name="probe.latency")
        times.append(hvd.allreduce(torch.tensor([time.perf_counter() - start], device=device), op=hvd.Max,
                                   name="probe.latency.time").item())
    return statistics.median(times)


def link_rate() -> float | None:
    """Bytes per second of the cluster's shaped links (``HVDSKETCH_CLUSTER_RATE``); ``None`` unshaped."""
    from hvdsketch.policy.cost import parse_bandwidth

    rate = os.environ.get("HVDSKETCH_CLUSTER_RATE", "none")
    return None if rate == "none" else parse_bandwidth(rate)


def batched(values: list[float], batches: int) -> Spread:
    """The median of ``values``' medians in ``batches`` runs of consecutive values, with their range."""
    return Spread.median(statistics.median(part) for part in np.array_split(np.asarray(values), batches)
                         if len(part))


def ratio(times: list[float], base: list[float], batches: int) -> Spread:
    """``times`` against ``base`` step by step, batched as :func:`batched` does."""
    return batched([t / b for t, b in zip(times, base)], batches)


def against_fastest(times: dict[str, list[float]], subject: str, margin: float, batches: int) -> dict[str, Any]:
    """``subject``'s time against the entry of the others with the least median time, step by step,
    and the verdict on ``at most 1 + margin`` times it."""
    if subject not in times or len(times) < 2:
        raise SystemExit(f"hvdsketch bench exchange: --subject {subject!r} needs that entry and another one")
    others = [label for label in times if label != subject]
    fastest = min(others, key=lambda label: batched(times[label], batches).center)
    spread = ratio(times[subject], times[fastest], batches)
    return {"label": subject, "fastest": fastest, "ratio": spread.center, "range": [spread.low, spread.high],
            "margin": margin, "verdict": judge(spread, 1 + margin, at_most=True)}


def run(args: argparse.Namespace) -> int:
    import horovod.torch as hvd

    result = measure(args)
    if hvd.rank() == 0:
        print(f"hvdsketch bench exchange: {result['tensor']} {tuple(result['shape'])}, {result['size']} ranks, "
              f"{result['steps']} steps after {result['warmup']} untimed, the median of {result['batches']} batches' "
              f"medians (their range)")
        bound = result["bound"]
        total = bound["values_bytes"] + bound["index_bytes"]
        for r in result["rows"]:
            ms = Spread(r["exchange_s"], *r["exchange_range_s"]).text(4, scale=1e3)
            vs = Spread(r["vs_baseline"], *r["vs_baseline_range"]).text(3)
            print(f"  {r['label']:<20} {ms:>22} ms  {vs:>20}x {args.baseline}  "
                  f"{r['mean_bytes_sent_per_step'] / 1e6:9.3f} MB/step (mean; max {r['max_bytes_sent_per_step'] / 1e6:.3f})"
                  + (f"  {r['vs_bound']:6.2f}x bound" if r["vs_bound"] else "")
                  + (f"  {r['vs_floor']:5.2f}x floor ({r['floor_s'] * 1e3:.1f} ms)" if r["floor_s"] else ""), flush=True)
        if total:
            print(f"  {'bound':<20} {'':>22}     {'':>20}  {'':>{len(args.baseline)}}  {total / 1e6:9.3f} MB/step  "
                  f"(values {bound['values_bytes'] / 1e6:.3f} + index {bound['index_bytes'] / 1e6:.4f}; "
                  f"z {bound['z']:.0f}, u {bound['u']:.0f} rows)", flush=True)
        link = result["link"]
        print(f"  link {link['rate'] or 'unshaped'}, latency {link['latency_s'] * 1e3:.2f} ms (a small allreduce)",
              flush=True)
        subject = result.get("subject")
        if subject:
            spread = Spread(subject["ratio"], *subject["range"]).text(3)
            print(f"  {subject['label']} against the fastest other entry ({subject['fastest']}): {spread}x; "
                  f"at most {1 + subject['margin']:.2f}x: {subject['verdict']}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    return 0
