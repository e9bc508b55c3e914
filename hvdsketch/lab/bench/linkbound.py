"""``hvdsketch bench exchange`` made link-bound on a machine with few cores, the rate chosen from a measurement.

    hvdsketch bench linkbound -np 8 --config configs/lstm.yaml --tensor embedding.weight \\
        --entries results/scaling/entries.yaml --json results/scaling/lstm-np8.json

On a cluster a rank's link is slow against its compute; on this machine 8 or 16 ranks share 2 cores,
and over 1 Gbit/s links every method's exchange is CPU time. The same ratio returns when each
emulated host's link is slowed until its bytes set the time. So this runs the exchange twice on
``launch/cluster.sh``:

1. unshaped (``--rate none``): every entry's time is its CPU time on this machine;
2. at the rate where dense's exchange takes ``--factor`` (5) times its unshaped time over the link
   alone: its busiest rank's bytes over ``factor x`` its unshaped time (TCP's share of a tbf link,
   :data:`~hvdsketch.lab.bench.exchange.TCP_SHARE`), in whole Mbit/s.

Both runs reduce with Open MPI's ring allreduce (:data:`RING`), as Horovod reduces dense tensors
on a cluster's GPUs (NCCL's ring) and as every floor and model here prices an allreduce: Open MPI's
default algorithm took 1.75-2.08x the ring's floor for dense at 8 and 16 ranks.

Entries whose compression holds ``${rate}`` (``auto:bandwidth=${rate}``) are given the chosen rate
and run in the shaped run only. The JSON holds both runs, the rate, and per entry of the shaped run
its time against its floor (the busiest rank's bytes over its link, sent or received, plus its
collectives times the link's latency) and against the model (:func:`model_seconds`), with the
model's error. Dense's shaped time against ``factor`` times its unshaped one is printed: where it
falls short, the run is not link-bound and says so.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import string
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from hvdsketch.lab.bench.exchange import TCP_SHARE

ROOT = Path(__file__).resolve().parents[3]
#: Open MPI's MCA settings for a ring allreduce, which its ranks take from mpirun's environment.
RING = {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1", "OMPI_MCA_coll_tuned_allreduce_algorithm": "4"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-np", "--np", type=int, required=True, help="ranks (emulated hosts)")
    parser.add_argument("--config", required=True, help="the workload's training YAML")
    parser.add_argument("--tensor", required=True, help="parameter name, e.g. embedding.weight, or all (every gradient)")
    parser.add_argument("--entries", required=True, help="YAML list of entries; one labelled --dense")
    parser.add_argument("--dense", default="dense", help="label of the dense entry that sets the rate")
    parser.add_argument("--factor", type=float, default=5.0,
                        help="dense's exchange over the link takes this many times its unshaped time")
    parser.add_argument("--steps", type=int, default=6, help="timed steps of each run")
    parser.add_argument("--batches", type=int, default=3, help="the timed steps in this many batches (the spreads)")
    parser.add_argument("--json", required=True, help="write both runs and the checks here")


def exchange(rate: str, np_: int, args: argparse.Namespace, entries: list[dict[str, Any]], out: Path) -> dict:
    """One ``hvdsketch bench exchange`` run on the emulated cluster at ``rate``; its JSON."""
    listed = out.with_suffix(".entries.yaml")
    listed.write_text(yaml.safe_dump(entries, sort_keys=False))
    cmd = [str(ROOT / "launch" / "cluster.sh"), "--rate", rate, "-np", str(np_), "--", sys.executable, "-m",
           "hvdsketch.lab.cli", "bench", "exchange", "--config", args.config, "--tensor", args.tensor,
           "--entries", str(listed), "--baseline", args.dense, "--steps", str(args.steps),
           "--batches", str(args.batches), "--json", str(out)]
    env = {**os.environ, **RING, "MALLOC_MMAP_THRESHOLD_": "1000000000", "MALLOC_TRIM_THRESHOLD_": "2000000000"}
    print(f"hvdsketch bench linkbound: {' '.join(cmd[1:5])}", flush=True)
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    return json.loads(out.read_text())


def chosen_rate(dense: dict[str, Any], factor: float) -> int:
    """Whole Mbit/s at which the dense entry's busiest rank's bytes take ``factor`` times its unshaped time."""
    seconds = factor * dense["exchange_s"]
    return max(1, math.floor(dense["max_bytes_sent_per_step"] * 8 / (seconds * TCP_SHARE) / 1e6))


def model_seconds(floor: float, codec: float, collective_cpu: float) -> float:
    """An exchange's time on a link-bound link: its codec (compressors and memory, on the rank's CPU
    before and after its collectives) plus the longer of its floor and its collectives' own CPU time
    (copies and reductions, which overlap the bytes on the link)."""
    return codec + max(floor, collective_cpu)


def checked(shaped: dict[str, Any], unshaped: dict[str, Any]) -> list[dict[str, Any]]:
    """Per shaped entry: its floor and :func:`model_seconds` against its measured time, the
    collectives' CPU time being the unshaped run's time less its codec."""
    alone = {row["label"]: row for row in unshaped["rows"]}
    out = []
    for row in shaped["rows"]:
        codec, before = row.get("codec_s", 0.0), alone.get(row["label"])
        cpu = None if before is None else max(before["exchange_s"] - before.get("codec_s", 0.0), 0.0)
        model = None if cpu is None else model_seconds(row["floor_s"], codec, cpu)
        out.append({"label": row["label"], "measured_s": row["exchange_s"], "range_s": row["exchange_range_s"],
                    "floor_s": row["floor_s"], "vs_floor": row["vs_floor"], "codec_s": codec,
                    "unshaped_s": None if before is None else before["exchange_s"],
                    "model_s": model, "model_error": model / row["exchange_s"] - 1 if model else None,
                    "mean_bytes": row["mean_bytes_sent_per_step"], "max_bytes": row["max_bytes_sent_per_step"],
                    "link_bytes": row["link_bytes_per_step"],
                    "collectives_per_step": row["collectives_per_step"]})
    return out


def run(args: argparse.Namespace) -> int:
    entries = yaml.safe_load(open(args.entries)) or []
    if args.dense not in [e.get("label") for e in entries]:
        raise SystemExit(f"hvdsketch bench linkbound: no entry labelled {args.dense!r} (--dense)")
    templated = [e for e in entries if "${rate}" in str(e.get("compression", ""))]
    with tempfile.TemporaryDirectory(prefix="hvdsketch-linkbound-") as tmp:
        unshaped = exchange("none", args.np, args, [e for e in entries if e not in templated], Path(tmp) / "none.json")
        dense = next(row for row in unshaped["rows"] if row["label"] == args.dense)
        rate = f"{chosen_rate(dense, args.factor)}mbit"
        given = [{**e, "compression": string.Template(e["compression"]).substitute(rate=rate)} if e in templated
                 else e for e in entries]
        shaped = exchange(rate, args.np, args, given, Path(tmp) / "shaped.json")
    rows = checked(shaped, unshaped)
    slowed = next(r for r in rows if r["label"] == args.dense)["measured_s"] / dense["exchange_s"]
    result = {"ranks": args.np, "tensor": args.tensor, "config": args.config, "rate": rate, "factor": args.factor,
              "dense_slowed": slowed, "link_bound": slowed >= args.factor, "rows": rows,
              "unshaped": unshaped, "shaped": shaped}
    Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"hvdsketch bench linkbound: {args.np} ranks at {rate}: dense {slowed:.1f}x its unshaped time "
          f"({'link-bound' if slowed >= args.factor else f'NOT link-bound: under {args.factor:g}x'}); "
          f"latency {shaped['link']['latency_s'] * 1e3:.2f} ms")
    print(f"  {'entry':<16} {'measured ms':>24} {'floor ms':>9} {'x floor':>8} {'codec ms':>9} {'unshaped ms':>12} "
          f"{'model ms':>9} {'error':>7} {'MB link':>8}")
    for r in rows:
        lo, hi = r["range_s"]
        measured = f"{r['measured_s'] * 1e3:.1f} ({lo * 1e3:.1f}..{hi * 1e3:.1f})"
        model = f"{r['model_s'] * 1e3:9.1f} {r['model_error']:+7.1%}" if r["model_s"] else f"{'':9} {'':7}"
        unshaped_ms = f"{r['unshaped_s'] * 1e3:12.1f}" if r["unshaped_s"] else f"{'':12}"
        print(f"  {r['label']:<16} {measured:>24} {r['floor_s'] * 1e3:9.1f} {r['vs_floor']:8.2f} "
              f"{r['codec_s'] * 1e3:9.1f} {unshaped_ms} "
              f"{model} {r['link_bytes'] / 1e6:8.3f}", flush=True)
    return 0
