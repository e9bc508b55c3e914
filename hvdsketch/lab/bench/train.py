"""Training side by side on the emulated cluster: every entry x workload x link rate x rank count.

::

    hvdsketch bench train                      # the matrix of configs/bench.yaml
    hvdsketch bench train --quick              # its quick: section (one workload, a few entries, few steps)
    hvdsketch bench train --workloads lstm --rates 1gbit --ranks 2,4 --out results/bench

Each run is ``launch/cluster.sh --rate RATE -np N -- hvdsketch train ...`` (or
another runner writing the same JSON record, such as a DDP baseline), in a
fresh network namespace, one after the other, so that every entry of a cell
meets the same machine within minutes of the others. Every entry of a
workload trains the same epochs and steps from the same seed, so their
validation quality compares directly. A run that fails, times out (``--timeout``
per run) or whose runner is missing is a row saying so, never dropped.

Written to ``--out``: ``bench.json`` (every run's record, the machine, the
load, the command), ``bench.md`` (per workload: step time, gradient-exchange
time, compress + decompress time, bytes per step, speed-up and quality against
the baseline; the probed tensor's exchange; the targets of
:mod:`hvdsketch.lab.bench.targets`, met or missed), and per workload PNGs of quality
against training time, of bytes per step and of step time. ``bench.json`` is
rewritten after every run; ``--resume`` keeps the runs that succeeded there.

Times are those of the record: ``step`` is the median wall time of a training
step (forward, backward, exchange, update; without validation; the mean where
a record lists no steps), ``exchange`` the mean time spent waiting in the
optimizer's ``synchronize()``, ``codec`` the mean compress + decompress time,
``load`` the 1-minute load average when the run ended. Horovod's
own optimizer (``path: horovod``) starts its allreduces during the backward
pass, so its exchange column shows only what the backward pass did not hide;
compare step times across paths.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hvdsketch.lab.bench import report
from hvdsketch.lab.bench.matrix import TRAIN, UNSHAPED, Job, Matrix
from hvdsketch.lab.bench.quality import metric, step_seconds, times_to_target, wall_time_curves
from hvdsketch.lab.bench.targets import Outcome, Verdict, evaluate
from hvdsketch.policy.cost import parse_bandwidth

#: The emulated cluster, from the project's checkout (the benchmark runs from its root).
CLUSTER = os.environ.get("HVDSKETCH_CLUSTER", "launch/cluster.sh")


def _list(kind: type):
    def parse(text: str) -> list:
        values = [kind(v.strip()) for v in text.split(",") if v.strip()]
        if not values:
            raise argparse.ArgumentTypeError("needs at least one value")
        return values
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="configs/bench.yaml", help="the matrix (YAML)")
    parser.add_argument("--quick", action="store_true", help="the config's quick: section (< 10 min on 2 cores)")
    parser.add_argument("--workloads", type=_list(str), help="only these workloads (comma-separated)")
    parser.add_argument("--entries", type=_list(str), help="only these entries (labels, comma-separated)")
    parser.add_argument("--rates", type=_list(str), help="link rates, e.g. 1gbit,10gbit (none: unshaped)")
    parser.add_argument("--ranks", type=_list(int), help="rank counts, e.g. 2,4")
    parser.add_argument("--epochs", type=int, help="epochs of every workload")
    parser.add_argument("--steps-per-epoch", type=int, help="steps per epoch of every workload")
    parser.add_argument("--probe-steps", type=int, help="timed steps of each exchange probe")
    parser.add_argument("--timeout", type=float, help="seconds per run before it is killed")
    parser.add_argument("--out", default="runs/bench-train", help="output folder (default runs/bench-train)")
    parser.add_argument("--resume", action="store_true", help="keep the successful runs of an earlier bench.json")
    parser.add_argument("--redo", action="store_true",
                        help="with --resume: run the selected jobs again, successful or not (the rest is kept)")
    parser.add_argument("--dry-run", action="store_true", help="print the runs and exit")
    parser.add_argument("--report-only", action="store_true", help="rebuild bench.md and plots from bench.json")


@dataclass
class Result:
    key: str
    workload: str
    rate: str
    ranks: int
    label: str
    runner: str
    status: str  # ok | failed | timeout | unavailable
    seconds: float = 0.0
    load: list[float] = field(default_factory=list)  # 1-minute load average before and after
    message: str = ""
    record: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def machine() -> dict[str, Any]:
    """Where the benchmark ran."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown")
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal"))
    return {"host": os.uname().nodename, "nproc": os.cpu_count(), "cpu": cpu,
            "memory_gib": round(mem_kb / 2**20, 1), "kernel": os.uname().release}


def run_job(job: Job, out: Path, timeout: float, matrix: Matrix) -> Result:
    """Run one job under ``launch/cluster.sh``; its log and record stay in ``out/runs/KEY``."""
    entry = job.entry
    result = Result(job.key, job.workload.name, job.rate, job.ranks, job.label,
                    entry.runner if entry else "exchange-probe", "ok", load=[os.getloadavg()[0]])
    if entry is not None and not entry.available:
        result.status, result.message = "unavailable", f"runner {entry.runner} is not in this checkout"
        return result
    run_dir = out / "runs" / job.key
    for old in run_dir.glob("*.json"):
        old.unlink()
    probe_entries = [e for e in matrix.for_workload(job.workload.name) if e.runner == TRAIN]
    command = [CLUSTER, "--rate", job.rate, "-np", str(job.ranks), "--", *job.command(run_dir, probe_entries)]
    start = time.time()
    with open(run_dir / "log.txt", "w") as log:
        log.write(shlex.join(command) + "\n")
        log.flush()
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(proc)
            code = None
    result.seconds, result.load = time.time() - start, result.load + [os.getloadavg()[0]]
    records = sorted(run_dir.glob("*.json"))
    if code is None:
        result.status, result.message = "timeout", f"killed after {timeout:.0f} s"
    elif code != 0 or not records:
        result.status, result.message = "failed", f"exit {code}: {_why((run_dir / 'log.txt').read_text())}"
    else:
        result.record = json.loads(records[-1].read_text())
    return result


def _why(log: str) -> str:
    """The first Python exception a log reports (every rank prints the same one), else its last lines."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    raised = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception|Exit)\b.*:", line)]
    return (raised[0] if raised else " / ".join(lines[-3:]))[:300]


def _stop(proc: subprocess.Popen) -> None:
    """TERM the run's process group (cluster.sh then removes its namespace), KILL it if it lingers."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# --- summaries ----------------------------------------------------------------------------------


def quality(record: dict[str, Any]) -> tuple[str, float, bool] | None:
    """The record's headline validation metric after the last epoch: (name, value, higher is better)."""
    found = metric(record)
    return None if found is None else (found[0], float(record["validation"][-1][found[0]]), found[1])


def _runs(results: list[Result]) -> list[tuple[str, str, int, str, dict[str, Any]]]:
    return [(r.workload, r.rate, r.ranks, r.label, r.record) for r in results
            if r.ok and r.runner != "exchange-probe"]


def outcomes(results: list[Result], baseline: str) -> dict[tuple[str, str, int], dict[str, Outcome]]:
    """Per cell and entry label: step time, quality, probed exchange time, codec time, bytes and the
    time to the baseline's final quality, for the targets. Quality is the final one of the long
    unshaped run of the same workload, rank count and entry where the baseline has one too (a shaped
    cell trains briefly, to time steps), else the cell's own."""
    cells: dict[tuple[str, str, int], dict[str, Outcome]] = {}
    long_runs = {(r.workload, r.ranks, r.label): quality(r.record) for r in results
                 if r.ok and r.rate == UNSHAPED and r.runner != "exchange-probe"}
    probes = {(r.workload, r.rate, r.ranks): {row["label"]: row["exchange_s"] for row in r.record["rows"]}
              for r in results if r.ok and r.runner == "exchange-probe"}
    reach = {(t.workload, t.rate, t.ranks, t.label): t for t in times_to_target(_runs(results), baseline)}
    for r in results:
        if r.runner == "exchange-probe":
            continue
        cell = (r.workload, r.rate, r.ranks)
        q = quality(r.record) if r.ok else None
        if r.ok and (r.workload, r.ranks, baseline) in long_runs:
            q = long_runs.get((r.workload, r.ranks, r.label))
        t = reach.get((*cell, r.label))
        cells.setdefault(cell, {})[r.label] = Outcome(
            step_seconds(r.record) if r.ok else None, q[1] if q else None, q[2] if q else True,
            probes.get(cell, {}).get(r.label), (r.record.get("phases_s") or {}).get("codec") if r.ok else None,
            r.record["bytes_sent_per_step"] if r.ok else None, t.seconds if t else None,
            t is not None and t.steps is not None, r.runner)
    return cells


def _ms(seconds: float | None) -> str:
    return report.number(None if seconds is None else 1e3 * seconds, 4)


def _training_rows(results: list[Result], baseline: str, verdicts: list[Verdict]) -> tuple[list[str], list[list[str]]]:
    metric = next((q[0] for r in results if r.ok and (q := quality(r.record))), "quality")
    headers = ["rate", "ranks", "entry", "status", "step ms", "speed-up", "exchange ms", "codec ms",
               "MB/step", "dense/sent", metric, "vs dense", "load", "target"]
    base = {(r.rate, r.ranks): r for r in results if r.label == baseline and r.ok}
    rows = []
    for r in results:
        cell = [r.rate, str(r.ranks), r.label]
        mine = [v for v in verdicts if (v.workload, v.rate, v.ranks) == (r.workload, r.rate, r.ranks)]
        target = ", ".join(f"{v.target}: {v.word}" for v in mine if v.subject == r.label)
        if not r.ok:
            rows.append(cell + [f"{r.status}: {r.message}"[:80]] + ["-"] * 8 + [_load(r), target])
            continue
        rec, b = r.record, base.get((r.rate, r.ranks))
        codec = (rec.get("phases_s") or {}).get("codec")
        q, bq = quality(rec), quality(b.record) if b else None
        delta = f"{100 * (q[1] / bq[1] - 1):+.2f}%" if q and bq else "-"
        sent, dense = rec["bytes_sent_per_step"], rec["bytes_dense_per_step"]
        rows.append(cell + ["ok", _ms(step_seconds(rec)),
                            report.number(step_seconds(b.record) / step_seconds(rec), 3, "x") if b else "-",
                            _ms(rec.get("exchange_s")), _ms(codec), report.number(sent / 1e6, 4),
                            report.number(dense / sent if sent else None, 3, "x"),
                            report.number(q[1] if q else None, 4), delta, _load(r), target])
    return headers, rows


def _load(r: Result) -> str:
    return report.number(r.load[-1] if r.load else None, 2)


def _probe_rows(results: list[Result]) -> tuple[list[str], list[list[str]]]:
    headers = ["rate", "ranks", "entry", "exchange ms", "vs dense", "MB/step"]
    rows = []
    for r in results:
        if r.runner != "exchange-probe":
            continue
        if not r.ok:
            rows.append([r.rate, str(r.ranks), f"probe {r.status}: {r.message}"[:80], "-", "-", "-"])
            continue
        for row in r.record["rows"]:
            rows.append([r.rate, str(r.ranks), row["label"], _ms(row["exchange_s"]),
                         report.number(row["vs_baseline"], 3, "x"), report.number(row["bytes_sent_per_step"] / 1e6, 4)])
    return headers, rows


def _reach_rows(results: list[Result], baseline: str) -> tuple[list[str], list[list[str]]]:
    found = times_to_target(_runs(results), baseline)
    base = {(t.rate, t.ranks): t for t in found if t.label == baseline}
    headers = ["rate", "ranks", "entry", "target", "final (unshaped)", "steps to target", "step ms", "time to target",
               "vs " + baseline]
    rows = [[t.rate, str(t.ranks), t.label, report.number(t.target, 4), report.number(t.final, 4),
             str(t.steps) if t.steps is not None else "not reached", _ms(t.step_s),
             report.number(t.seconds, 4, " s"), report.number(t.speedup(base.get((t.rate, t.ranks))), 3, "x")]
            for t in found]
    return headers, rows


def markdown(results: list[Result], verdicts: list[Verdict], matrix: Matrix, meta: dict[str, Any]) -> str:
    """The whole report: per workload the training table and the probe table, then the targets."""
    m = meta["machine"]
    commands = meta.get("resumed", []) + [meta["command"]]
    parts = ["".join(f"Command: `{c}`  \n" for c in commands) +
             f"Machine: {m['cpu']}, {m['nproc']} CPUs, {m['memory_gib']} GiB, {m['host']}; "
             f"1-minute load {meta['load'][0]:.1f} at start, {meta['load'][-1]:.1f} at end; {meta['started']}."]
    for w in matrix.workloads:
        mine = [r for r in results if r.workload == w.name]
        training = [r for r in mine if r.runner != "exchange-probe"]
        if not training:
            continue
        parts.append(f"### {w.name}: {w.epochs} epoch(s) x {w.steps_per_epoch} steps per run "
                     f"(`{w.config}`)\n\n" + report.markdown(*_training_rows(training, matrix.baseline, verdicts)))
        if any(r.runner == "exchange-probe" for r in mine):
            parts.append(f"Exchange of `{w.probe}` alone, median of {w.probe_steps} real gradients, slowest rank:\n\n"
                         + report.markdown(*_probe_rows(mine)))
        reach = _reach_rows(mine, matrix.baseline)
        if reach[1]:
            parts.append(f"Time to {matrix.baseline}'s final quality (steps from the unshaped run x median step "
                         f"time of the shaped run):\n\n" + report.markdown(*reach))
    if verdicts:
        parts.append(f"### Targets (against {matrix.baseline} unless they say otherwise)\n\n" + report.markdown(
            ["workload", "rate", "ranks", "entry", "target", "required", "measured", "verdict"],
            [[v.workload, v.rate, str(v.ranks), v.subject, v.target, v.required, v.measured, v.word]
             for v in verdicts]))
    return "\n\n".join(parts) + "\n"


def plots(results: list[Result], matrix: Matrix, out: Path) -> list[Path]:
    """Per workload: quality against training time (steps x step time), bytes and step time per entry."""
    written = []
    for w in matrix.workloads:
        ran = [r for r in results if r.workload == w.name and r.ok and r.runner != "exchange-probe"]
        if not ran:
            continue
        name = next((q[0] for r in ran if (q := quality(r.record))), "quality")
        panels = wall_time_curves(_runs(ran), w.name)
        if panels:
            path = out / f"{w.name}-quality.png"
            report.line_plot(panels, str(path), f"{w.name}: validation {name} against wall time per link rate "
                             f"(unshaped curve x that link's step time)", "wall time (s)", name, log="x")
            written.append(path)
        front = {r.label: (r.record["bytes_sent_per_step"] / 1e6, q[1]) for r in ran
                 if r.rate == UNSHAPED and (q := quality(r.record))}
        if front:
            path = out / f"{w.name}-pareto.png"
            report.scatter_plot(front, str(path), f"{w.name}: bytes per step against final {name} (unshaped runs)",
                                "MB sent per step and rank", name, log="x")
            written.append(path)
        for name, value, unit, log in (("bytes", lambda rec: rec["bytes_sent_per_step"] / 1e6,
                                        "MB sent per step and rank", True),
                                       ("step", step_seconds, "median step time (s)", False)):
            groups: dict[str, dict[str, float]] = {}
            for r in ran:
                groups.setdefault(f"{r.rate}, {r.ranks} ranks", {})[r.label] = value(r.record)
            path = out / f"{w.name}-{name}.png"
            report.bar_plot(groups, str(path), f"{w.name}: {unit}", unit, log=log)
            written.append(path)
    return written


# --- the command --------------------------------------------------------------------------------


def ordered(results: list[Result], matrix: Matrix) -> list[Result]:
    """Results cell by cell (rates from slow to unshaped, then ranks), entries in the matrix's order
    and the probe last, however the resumed runs that made them were interleaved."""
    labels = [e.label for e in matrix.entries]

    def rate(text: str) -> float:
        return math.inf if text == "none" else parse_bandwidth(text)

    return sorted(results, key=lambda r: (rate(r.rate), r.ranks, r.runner == "exchange-probe",
                                          labels.index(r.label) if r.label in labels else len(labels)))


def _write(out: Path, meta: dict[str, Any], results: list[Result], matrix: Matrix) -> list[Verdict]:
    cells = [(w.name, rate, n) for w in matrix.workloads for rate in matrix.rates for n in matrix.ranks
             if w.runs_in(rate, n)]
    cells += sorted({(r.workload, r.rate, r.ranks) for r in results} - set(cells))  # carried by --resume
    verdicts = evaluate(outcomes(results, matrix.baseline), matrix.subject, matrix.baseline, cells)
    (out / "bench.json").write_text(json.dumps(
        {**meta, "results": [asdict(r) for r in results], "targets": [asdict(v) for v in verdicts]}, indent=1))
    return verdicts


def carried(before: list[Result], jobs: list[Job], report_only: bool = False,
            redo: bool = False) -> tuple[list[Result], dict[str, Result]]:
    """What a resumed run takes from the earlier ``bench.json``: its results outside this selection
    (another rate, say), kept as they are, and by key those inside it that need no new run (the
    successful ones unless ``redo``; every one for ``--report-only``)."""
    keys = {j.key for j in jobs}
    return ([r for r in before if r.key not in keys],
            {r.key: r for r in before if r.key in keys and (report_only or (r.ok and not redo))})


def run(args: argparse.Namespace) -> int:
    matrix = Matrix.load(args.config, quick=args.quick).select(
        workloads=args.workloads, entries=args.entries, rates=args.rates, ranks=args.ranks, epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch, probe_steps=args.probe_steps, timeout_s=args.timeout)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = matrix.jobs()
    if args.dry_run:
        for i, job in enumerate(jobs, 1):
            print(f"[{i}/{len(jobs)}] {job.key}")
        return 0
    earlier = json.loads((out / "bench.json").read_text()) if (args.resume or args.report_only) else {}
    if args.redo and not args.resume:
        raise SystemExit("hvdsketch bench train: --redo reruns part of an earlier bench.json; give --resume too")
    others, kept = carried([Result(**r) for r in earlier.get("results", [])], jobs, args.report_only, args.redo)
    if args.report_only:
        results = [kept[j.key] for j in jobs if j.key in kept] + others
        meta = {k: v for k, v in earlier.items() if k not in ("results", "targets")}
    else:
        results = others
        meta = {"command": shlex.join(["hvdsketch", "bench", "train", *sys.argv[sys.argv.index("train") + 1:]]
                                      if "train" in sys.argv else sys.argv),
                "machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "load": [os.getloadavg()[0]],
                "matrix": {"config": args.config, "quick": args.quick, "rates": list(matrix.rates),
                           "ranks": list(matrix.ranks), "baseline": matrix.baseline, "subject": matrix.subject,
                           "timeout_s": matrix.timeout_s}}
        if args.resume and "command" in earlier:  # the runs kept were made by the earlier commands
            meta["resumed"] = earlier.get("resumed", []) + [earlier["command"]]
            meta["started"], meta["load"] = earlier["started"], earlier["load"][:1]
        began = time.time()
        print(f"hvdsketch bench train: {len(jobs)} runs, timeout {matrix.timeout_s:.0f} s each, "
              f"load {os.getloadavg()[0]:.1f}, output {out}", flush=True)
        for i, job in enumerate(jobs, 1):
            if job.key in kept:
                results.append(kept[job.key])
                print(f"[{i}/{len(jobs)}] {job.key}: kept from the earlier run", flush=True)
                continue
            print(f"[{i}/{len(jobs)} {_clock(time.time() - began)}] {job.key} ...", flush=True)
            results.append(run_job(job, out, matrix.timeout_s, matrix))
            r = results[-1]
            detail = (f"step {1e3 * step_seconds(r.record):.0f} ms" if r.ok and "step_s" in r.record
                      else r.message[:160] if not r.ok else "")
            print(f"    {r.status} in {r.seconds:.0f} s, load {r.load[-1]:.1f}; {detail}", flush=True)
            meta["load"] = meta["load"][:1] + [os.getloadavg()[0]]
            _write(out, meta, results, matrix)
    results = ordered(results, matrix)
    verdicts = _write(out, meta, results, matrix)
    text = markdown(results, verdicts, matrix, meta)
    (out / "bench.md").write_text(text)
    written = plots(results, matrix, out)
    print(text)
    print(f"wrote {out / 'bench.json'}, {out / 'bench.md'}" + "".join(f", {p}" for p in written))
    return 0


def _clock(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(seconds))
