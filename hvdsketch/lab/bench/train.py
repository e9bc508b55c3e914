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
validation quality compares directly. Every entry runs ``--repeats`` times
(``repeats:`` of the config, 3 unless set), in rounds (A B C A B C ...), each
repeat in its own folder; a workload with ``seeds: S`` trains its repeats with
S seeds. A run that fails, times out (``--timeout`` per run) or whose runner
is missing is a row saying so, never dropped.

Written to ``--out``: ``bench.json`` (every run's record, the machine, the
load, the command), ``bench.md`` (per workload: step time, its multiple of the
limit, where it goes, bytes per step, speed-up and quality against the
baseline; the probed tensor's exchange; the targets of
:mod:`hvdsketch.lab.bench.targets`, met, missed or undecided), and per workload PNGs of
quality against training time, of bytes per step, of step time and of where it
goes (stacked by part). Every
figure is the median over the repeats with its range (min..max), quality the
mean over them (seeds), a speed-up the ratio of medians spread from the
ratios of the two entries' runs round by round where they share 5 rounds or more
(:mod:`hvdsketch.lab.bench.spread`; else the extreme ratios); the plots draw the ranges
as error bars. Each repeat's step time is listed too, marked ``!`` where it is
more than 10% from its entry's median (the machine in another mode), and each
result keeps what the machine looked like during the run
(:mod:`hvdsketch.lab.bench.watch`). ``bench.json`` is rewritten after every
run; ``--resume`` keeps the runs that succeeded there.

Times are those of the record: ``step`` is the median wall time of a training
step (forward, backward, exchange, update; without validation; the mean where
a record lists no steps); ``x alone`` that step over the step of the cell's
entry that exchanges nothing (``path: local``, each rank alone on its batches:
the limit, left out of the targets); ``compute``, ``codec``, ``wait`` and
``update`` the mean step by part (:mod:`hvdsketch.lab.breakdown`; ``-`` where a
record cannot tell them apart: TensorFlow's ``tf.function``, DDP's own hooks);
``load`` the 1-minute load average when the run ended. Horovod's own optimizer
(``path: horovod``) starts its allreduces during the backward pass, so its wait
shows only what the backward pass did not hide; compare step times across paths.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hvdsketch.lab import breakdown
from hvdsketch.lab.bench import report
from hvdsketch.lab.bench.matrix import PROBE, UNSHAPED, Job, Matrix
from hvdsketch.lab.bench.quality import metric, step_seconds, times_to_target, wall_time_curves
from hvdsketch.lab.bench.spread import PAIRED, Spread
from hvdsketch.lab.bench.targets import Outcome, Verdict, evaluate
from hvdsketch.lab.bench.watch import Watch
from hvdsketch.policy.cost import parse_bandwidth

#: The emulated cluster, from the project's checkout (the benchmark runs from its root).
CLUSTER = os.environ.get("HVDSKETCH_CLUSTER", "launch/cluster.sh")
#: A repeat whose step time is further than this from its entry's median is flagged (another mode).
OUTLIER = 0.10
#: Seconds between two samples of the machine while a run runs.
SAMPLE_S = 1.0


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
    parser.add_argument("--repeats", type=int, help="runs of every entry, interleaved (default: the config's, 3)")
    parser.add_argument("--out", default="runs/bench-train", help="output folder (default runs/bench-train)")
    parser.add_argument("--resume", action="store_true", help="keep the successful runs of an earlier bench.json")
    parser.add_argument("--redo", action="store_true",
                        help="with --resume: run the selected jobs again, successful or not; none of the selected "
                             "entries' earlier runs stays (the rest is kept)")
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
    repeat: int = 1
    machine_state: dict[str, Any] = field(default_factory=dict)  # watch.Watch's summary of the run
    session: int | None = 0  # the bench command that ran it: 0 the first, k its k-th resume; None unknown

    @property
    def round(self) -> tuple[int, int] | None:
        """The round it ran in: its repeat within its command (a resume runs its rounds anew)."""
        return None if self.session is None else (self.session, self.repeat)

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
            "memory_gib": round(mem_kb / 2**20, 1), "kernel": os.uname().release, "allocator": report.allocator()}


def run_job(job: Job, out: Path, timeout: float, matrix: Matrix, session: int) -> Result:
    """Run one job under ``launch/cluster.sh``; its log and record stay in ``out/runs/KEY``."""
    entry = job.entry
    result = Result(job.key, job.workload.name, job.rate, job.ranks, job.label,
                    entry.runner if entry else PROBE, "ok", load=[os.getloadavg()[0]], repeat=job.repeat,
                    session=session)
    if entry is not None and not entry.available:
        result.status, result.message = "unavailable", f"runner {entry.runner} is not in this checkout"
        return result
    if entry is None and (problem := probe_problem(matrix, job.workload.name)):
        result.status, result.message = "unavailable", problem
        return result
    run_dir = out / "runs" / job.key
    for old in run_dir.glob("*.json"):
        old.unlink()
    command = [CLUSTER, "--rate", job.rate, "-np", str(job.ranks), "--",
               *job.command(run_dir, matrix.probe_entries(job.workload.name), matrix.baseline)]
    start, watch = time.time(), Watch(run_dir)
    with open(run_dir / "log.txt", "w") as log:
        log.write(shlex.join(command) + "\n")
        log.flush()
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        code = _wait(proc, start + timeout, watch)
    result.seconds, result.load = time.time() - start, result.load + [os.getloadavg()[0]]
    result.machine_state = watch.summary()
    records = sorted(run_dir.glob("*.json"))
    if code is None:
        result.status, result.message = "timeout", f"killed after {timeout:.0f} s"
    elif code != 0 or not records:
        result.status, result.message = "failed", f"exit {code}: {_why((run_dir / 'log.txt').read_text())}"
    else:
        result.record = json.loads(records[-1].read_text())
    return result


def _wait(proc: subprocess.Popen, deadline: float, watch: Watch) -> int | None:
    """The run's exit code, sampling the machine meanwhile; ``None`` if it was killed at ``deadline``."""
    while True:
        try:
            return proc.wait(timeout=max(min(SAMPLE_S, deadline - time.time()), 0.01))
        except subprocess.TimeoutExpired:
            if time.time() >= deadline:
                _stop(proc)
                return None
            watch.sample()


def probe_problem(matrix: Matrix, workload: str) -> str | None:
    """Why workload ``workload``'s probe cannot run (it times every entry against the baseline)."""
    if matrix.baseline not in [e.label for e in matrix.probe_entries(workload)]:
        return (f"the exchange probe needs its baseline, an hvdsketch train entry labelled {matrix.baseline!r} "
                f"for {workload}; the bench config has none")
    return None


def _why(log: str) -> str:
    """The first Python exception a log reports (every rank prints the same one), else the first
    message a command of this project exited with (``hvdsketch ...: why``; mpirun's ``Exit code: 1``
    says nothing), else its last lines."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    raised = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception|Exit)\b.*:", line)
              and not line.startswith("Exit code")]
    said = [line for line in lines if re.match(r"^hvdsketch [a-z ]+: ", line)]
    return (raised[0] if raised else said[0] if said else " / ".join(lines[-3:]))[:300]


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
    return [(r.workload, r.rate, r.ranks, r.label, r.record) for r in results if r.ok and r.runner != PROBE]


Group = tuple[str, str, int, str]  # workload, rate, ranks, label


def groups(results: list[Result]) -> dict[Group, list[Result]]:
    """The training results by cell and entry, each entry's repeats in their order."""
    out: dict[Group, list[Result]] = {}
    for r in sorted((r for r in results if r.runner != PROBE), key=lambda r: r.repeat):
        out.setdefault((r.workload, r.rate, r.ranks, r.label), []).append(r)
    return out


def _records(repeats: list[Result]) -> list[dict[str, Any]]:
    return [r.record for r in repeats if r.ok]


def _final(records: list[dict[str, Any]]) -> tuple[Spread | None, bool]:
    """The mean final quality over the repeats (seeds), and whether higher is better."""
    found = [q for rec in records if (q := quality(rec))]
    return Spread.mean(q[1] for q in found), found[0][2] if found else True


def _median(records: list[dict[str, Any]], value) -> Spread | None:
    """The median of ``value(record)`` over the repeats (``None`` values left out)."""
    return Spread.median(value(rec) for rec in records)


def _steps(repeats: list[Result]) -> Spread | None:
    """The median step over the repeats, each kept with its round where all know theirs: a speed-up
    pairs the runs of a round."""
    ok = [r for r in repeats if r.ok]
    if any(r.round is None for r in ok):
        return Spread.median(step_seconds(r.record) for r in ok)
    return Spread.by_round({r.round: step_seconds(r.record) for r in ok})


def earlier_results(earlier: dict[str, Any]) -> list[Result]:
    """The results of an earlier ``bench.json``. Those written before results kept their command
    (no ``session``) are its one command's where it resumed none, else of a command unknown."""
    session = None if earlier.get("resumed") else 0
    return [Result(**{"session": session, **r}) for r in earlier.get("results", [])]


def _alone(by_entry: dict[tuple[str, str, int, str], list[Result]], cell: tuple[str, str, int]) -> list[Result]:
    """The repeats of the cell's entry that exchanges nothing (``path: local``, each rank alone): the
    limit of a step's time, which every entry's step is a multiple of."""
    for (w, rate, n, _), repeats in by_entry.items():
        records = _records(repeats)
        if (w, rate, n) == cell and records and records[0].get("path") == "local":
            return repeats
    return []


def _part(name: str) -> Any:
    """``record -> seconds`` of one part of its mean step (:mod:`hvdsketch.lab.breakdown`), or ``None``."""
    return lambda rec: (breakdown.of(rec) or {}).get(name)


def _codec(rec: dict[str, Any]) -> float | None:
    return (rec.get("phases_s") or {}).get("codec")


def _probe_times(results: list[Result]) -> dict[tuple[str, str, int], dict[str, Spread]]:
    """Per cell: each label's probed exchange time over the probe's repeats."""
    times: dict[tuple[str, str, int], dict[str, list[float]]] = {}
    for r in results:
        if r.ok and r.runner == PROBE:
            for row in r.record["rows"]:
                times.setdefault((r.workload, r.rate, r.ranks), {}).setdefault(row["label"], []).append(
                    row["exchange_s"])
    return {cell: {label: Spread.median(v) for label, v in by.items()} for cell, by in times.items()}


def outcomes(results: list[Result], baseline: str) -> dict[tuple[str, str, int], dict[str, Outcome]]:
    """Per cell and entry label, over its repeats: step time, quality, probed exchange time, codec
    time, bytes and the time to the baseline's final quality, for the targets. Quality is the mean
    final one of the long unshaped runs of the same workload, rank count and entry where the baseline
    has them too (a shaped cell trains briefly, to time steps), else the cell's own."""
    by_entry = groups(results)
    long_runs = {(w, n, label): _final(_records(rs)) for (w, rate, n, label), rs in by_entry.items()
                 if rate == UNSHAPED and _records(rs)}
    probes = _probe_times(results)
    reach = {(t.workload, t.rate, t.ranks, t.label): t for t in times_to_target(_runs(results), baseline)}
    cells: dict[tuple[str, str, int], dict[str, Outcome]] = {}
    for (w, rate, n, label), repeats in by_entry.items():
        records = _records(repeats)
        if records and records[0].get("path") == "local":  # the limit, not a way to train replicas alike
            continue
        q, up = _final(records)
        if records and (w, n, baseline) in long_runs:
            q, up = long_runs.get((w, n, label), (None, up))
        t = reach.get((w, rate, n, label))
        cells.setdefault((w, rate, n), {})[label] = Outcome(
            _steps(repeats), q, up, probes.get((w, rate, n), {}).get(label),
            _median(records, _codec), _median(records, lambda rec: rec["bytes_sent_per_step"]),
            t.seconds if t else None, repeats[0].runner)
    return cells


def _ms(spread: Spread | None) -> str:
    return "-" if spread is None else spread.text(4, scale=1e3)


def _status(repeats: list[Result]) -> str:
    """``3 ok``, or which repeats did not run and why."""
    bad = [r for r in repeats if not r.ok]
    text = f"{len(repeats) - len(bad)}/{len(repeats)} ok" if bad else f"{len(repeats)} ok"
    return (text + "".join(f"; r{r.repeat} {r.status}: {r.message}" for r in bad))[:90]


def by_repeat(repeats: list[Result]) -> str:
    """Each repeat's median step (ms) in run order, ``!`` where it is more than :data:`OUTLIER` from
    the entry's median, ``-`` where the repeat failed."""
    median = _steps(repeats)
    cells = []
    for r in repeats:
        if not r.ok:
            cells.append("-")
            continue
        step = step_seconds(r.record)
        cells.append(f"{1e3 * step:.4g}" + ("!" if abs(step / median.center - 1) > OUTLIER else ""))
    return " ".join(cells)


def outliers(results: list[Result]) -> list[Result]:
    """The repeats whose step time is more than :data:`OUTLIER` from their entry's median."""
    out = []
    for repeats in groups(results).values():
        median = _steps(repeats)
        out += [r for r in repeats if r.ok and abs(step_seconds(r.record) / median.center - 1) > OUTLIER]
    return out


SPREADS = ("Each figure: the median over the repeats (min..max); quality the mean over them (min..max); "
           f"speed-up and vs columns: the ratio of medians (from the smallest to the largest ratio of two runs "
           f"of one round, where both ran in the same {PAIRED} rounds or more; else the extreme ratios). "
           "`by repeat`: each repeat's "
           f"median step in run order, `!` more than {OUTLIER:.0%} from the entry's median.")


def _training_rows(results: list[Result], baseline: str, verdicts: list[Verdict]) -> tuple[list[str], list[list[str]]]:
    metric = next((q[0] for r in results if r.ok and (q := quality(r.record))), "quality")
    headers = ["rate", "ranks", "entry", "runs", "step ms", "speed-up", "x alone",
               *(f"{part} ms" for part in breakdown.PARTS),
               "MB/step", "dense/sent", metric, "vs dense", "load", "step ms by repeat", "target"]
    by_entry = groups(results)
    rows = []
    for (w, rate, n, label), repeats in by_entry.items():
        cell = [rate, str(n), label, _status(repeats)]
        mine = [v for v in verdicts if (v.workload, v.rate, v.ranks) == (w, rate, n)]
        target = ", ".join(f"{v.target}: {v.word}" for v in mine if v.subject == label)
        load = report.number(max((r.load[-1] for r in repeats if r.load), default=None), 2)
        records = _records(repeats)
        if not records:
            rows.append(cell + ["-"] * 11 + [load, "-", target])
            continue
        base = by_entry.get((w, rate, n, baseline), [])
        step, base_step = _steps(repeats), _steps(base)
        alone = _steps(_alone(by_entry, (w, rate, n)))
        q, bq = _final(records)[0], _final(_records(base))[0]
        sent = _median(records, lambda rec: rec["bytes_sent_per_step"])
        saving = _median(records, lambda rec: rec["bytes_dense_per_step"] / rec["bytes_sent_per_step"]
                         if rec["bytes_sent_per_step"] else None)
        rows.append(cell + [_ms(step), base_step.over(step).text(3, "x") if base_step else "-",
                            step.over(alone).text(3, "x") if alone else "-",
                            *(_ms(_median(records, _part(part))) for part in breakdown.PARTS),
                            sent.scaled(1e-6).text(4), saving.text(3, "x") if saving else "-",
                            q.text(4) if q else "-", q.over(bq).percent() if q and bq else "-",
                            load, by_repeat(repeats), target])
    return headers, rows


def _probe_rows(results: list[Result], baseline: str) -> tuple[list[str], list[list[str]]]:
    headers = ["rate", "ranks", "entry", "probes", "exchange ms", f"vs {baseline}", "MB/step"]
    probes = [r for r in results if r.runner == PROBE]
    rows = [[r.rate, str(r.ranks), f"probe r{r.repeat} {r.status}: {r.message}"[:80], "-", "-", "-", "-"]
            for r in probes if not r.ok]
    found: dict[tuple[str, int], dict[str, list[dict[str, Any]]]] = {}
    for r in probes:
        if r.ok:
            for row in r.record["rows"]:
                found.setdefault((r.rate, r.ranks), {}).setdefault(row["label"], []).append(row)
    for (rate, n), labels in found.items():
        base = Spread.median(row["exchange_s"] for row in labels.get(baseline, []))
        for label, mine in labels.items():
            seconds = Spread.median(row["exchange_s"] for row in mine)
            rows.append([rate, str(n), label, str(len(mine)), _ms(seconds),
                         seconds.over(base).text(3, "x") if base else "-",
                         Spread.median(row["bytes_sent_per_step"] / 1e6 for row in mine).text(4)])
    return headers, rows


def _reach_rows(results: list[Result], baseline: str) -> tuple[list[str], list[list[str]]]:
    found = times_to_target(_runs(results), baseline)
    base = {(t.rate, t.ranks): t for t in found if t.label == baseline}
    headers = ["rate", "ranks", "entry", "target", "final (unshaped)", "steps to target", "step ms", "time to target",
               "vs " + baseline]
    rows = []
    for t in found:
        speedup = t.speedup(base.get((t.rate, t.ranks)))
        versus = "never" if math.isinf(t.seconds.center) else speedup.text(3, "x") if speedup else "-"
        rows.append([t.rate, str(t.ranks), t.label, report.number(t.target, 4), t.final.text(4), t.steps.text(4),
                     _ms(t.step_s), t.seconds.text(4, " s"), versus])
    return headers, rows


def _modes(results: list[Result]) -> str:
    """One line per outlying repeat: its step time, the entry's median, and the machine meanwhile."""
    lines = []
    for r in outliers(results):
        state = r.machine_state or {}
        ranks = "; ".join(f"cpus {','.join(map(str, k['cpus']))} of {','.join(map(str, k['affinity']))}, "
                          f"{k['threads']} threads, {k['nonvoluntary_switches']} preemptions"
                          for k in state.get("ranks", []))
        lines.append(f"- `{r.key}`: {1e3 * step_seconds(r.record):.3g} ms a step; load {_load(r)}, runnable "
                     f"threads {state.get('runnable') or '-'} (min, median, max)" + (f"; ranks: {ranks}" if ranks else ""))
    return "\n".join(lines)


def _load(r: Result) -> str:
    return report.number(r.load[-1] if r.load else None, 2)


def markdown(results: list[Result], verdicts: list[Verdict], matrix: Matrix, meta: dict[str, Any]) -> str:
    """The whole report: per workload the training table and the probe table, then the targets."""
    m = meta["machine"]
    commands = meta.get("resumed", []) + [meta["command"]]
    parts = ["".join(f"Command: `{c}`  \n" for c in commands) +
             f"Machine: {m['cpu']}, {m['nproc']} CPUs, {m['memory_gib']} GiB, {m['host']}; "
             f"1-minute load {meta['load'][0]:.1f} at start, {meta['load'][-1]:.1f} at end; {meta['started']}; "
             f"allocator: {m.get('allocator', '-')}.  \n"
             + SPREADS]
    for w in matrix.workloads:
        mine = [r for r in results if r.workload == w.name]
        training = [r for r in mine if r.runner != PROBE]
        if not training:
            continue
        seeds = min(w.seeds, matrix.repeats)
        seeds = f", repeats from {seeds} seeds" if seeds > 1 else ""
        parts.append(f"### {w.name}: {w.epochs} epoch(s) x {w.steps_per_epoch} steps per run{seeds} "
                     f"(`{w.config}`)\n\n" + report.markdown(*_training_rows(training, matrix.baseline, verdicts)))
        modes = _modes(training)
        if modes:
            parts.append(f"Repeats more than {OUTLIER:.0%} from their entry's median step:\n\n" + modes)
        if any(r.runner == PROBE for r in mine):
            parts.append(f"Exchange of `{w.probe}` alone, median of {w.probe_steps} real gradients, slowest rank; "
                         f"median over the probes (min..max):\n\n" + report.markdown(*_probe_rows(mine, matrix.baseline)))
        reach = _reach_rows(mine, matrix.baseline)
        if reach[1]:
            parts.append(f"Time to {matrix.baseline}'s final quality (each unshaped repeat held to "
                         f"{matrix.baseline}'s end from the same seed, `target` their mean; steps from each "
                         f"unshaped repeat, `never` where one did not reach it, x median step time of the shaped "
                         f"repeats):\n\n" + report.markdown(*reach))
    if verdicts:
        parts.append(f"### Targets (against {matrix.baseline} unless they say otherwise; decided on the spreads: "
                     f"undecided where the spread straddles the margin)\n\n" + report.markdown(
                         ["workload", "rate", "ranks", "entry", "target", "required", "measured", "verdict"],
                         [[v.workload, v.rate, str(v.ranks), v.subject, v.target, v.required, v.measured, v.word]
                          for v in verdicts]))
    return "\n\n".join(parts) + "\n"


def plots(results: list[Result], matrix: Matrix, out: Path) -> list[Path]:
    """Per workload: quality against training time (steps x step time), bytes and step time per entry,
    each with the repeats' range as error bars."""
    written = []
    for w in matrix.workloads:
        ran = [r for r in results if r.workload == w.name and r.ok and r.runner != PROBE]
        if not ran:
            continue
        name = next((q[0] for r in ran if (q := quality(r.record))), "quality")
        panels = wall_time_curves(_runs(ran), w.name)
        if panels:
            path = out / f"{w.name}-quality.png"
            report.line_plot(panels, str(path), f"{w.name}: validation {name} against wall time per link rate "
                             f"(unshaped curve, mean of the repeats, x that link's step time)", "wall time (s)",
                             name, log="x")
            written.append(path)
        by_entry = {key: _records(rs) for key, rs in groups(ran).items()}
        front = {label: (_median(recs, lambda rec: rec["bytes_sent_per_step"] / 1e6).center, *q.bounds())
                 for (_, rate, _, label), recs in by_entry.items()
                 if rate == UNSHAPED and (q := _final(recs)[0]) is not None}
        if front:
            path = out / f"{w.name}-pareto.png"
            report.scatter_plot(front, str(path), f"{w.name}: bytes per step against final {name} (unshaped runs)",
                                "MB sent per step and rank", name, log="x")
            written.append(path)
        stacks: dict[str, dict[str, dict[str, float]]] = {}
        for (_, rate, n, label), recs in by_entry.items():
            parts = {part: spread.center for part in breakdown.PARTS
                     if (spread := _median(recs, _part(part))) is not None}
            if parts:
                stacks.setdefault(f"{rate}, {n} ranks", {})[label] = {part: 1e3 * t for part, t in parts.items()}
        if stacks:
            path = out / f"{w.name}-breakdown.png"
            report.stacked_bar_plot(stacks, breakdown.PARTS, str(path),
                                    f"{w.name}: where the median step's time goes\n(median of the repeats; "
                                    f"no bar: not timed apart)", "ms a step")
            written.append(path)
        for name, value, unit, log in (("bytes", lambda rec: rec["bytes_sent_per_step"] / 1e6,
                                        "MB sent per step and rank", True),
                                       ("step", step_seconds, "median step time (s)", False)):
            bars: dict[str, dict[str, tuple[float, float, float]]] = {}
            for (_, rate, n, label), recs in by_entry.items():
                bars.setdefault(f"{rate}, {n} ranks", {})[label] = _median(recs, value).bounds()
            path = out / f"{w.name}-{name}.png"
            report.bar_plot(bars, str(path), f"{w.name}: {unit}\nmedian of the repeats (error bars: their range)",
                            unit, log=log)
            written.append(path)
    return written


# --- the command --------------------------------------------------------------------------------


def ordered(results: list[Result], matrix: Matrix) -> list[Result]:
    """Results cell by cell (rates from slow to unshaped, then ranks), entries in the matrix's order
    and the probe last, each entry's repeats in order, however the resumed runs that made them were
    interleaved."""
    labels = [e.label for e in matrix.entries]

    def rate(text: str) -> float:
        return math.inf if text == "none" else parse_bandwidth(text)

    return sorted(results, key=lambda r: (rate(r.rate), r.ranks, r.runner == PROBE,
                                          labels.index(r.label) if r.label in labels else len(labels), r.repeat))


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
    successful ones unless ``redo``; every one for ``--report-only``). With ``redo`` none of a
    selected entry's earlier runs stays, not even repeats the selection does not make (more
    repeats, or keys from before repeats)."""
    keys = {j.key for j in jobs}
    entries = {(j.workload.name, j.rate, j.ranks, j.label) for j in jobs} if redo else set()
    return ([r for r in before if r.key not in keys and (r.workload, r.rate, r.ranks, r.label) not in entries],
            {r.key: r for r in before if r.key in keys and (report_only or (r.ok and not redo))})


def run(args: argparse.Namespace) -> int:
    matrix = Matrix.load(args.config, quick=args.quick).select(
        workloads=args.workloads, entries=args.entries, rates=args.rates, ranks=args.ranks, epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch, probe_steps=args.probe_steps, timeout_s=args.timeout,
        repeats=args.repeats)
    out = Path(args.out)
    jobs = matrix.jobs()
    if args.dry_run:
        for i, job in enumerate(jobs, 1):
            print(f"[{i}/{len(jobs)}] {job.key}")
        print(estimate(jobs, out / "bench.json"))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    earlier = json.loads((out / "bench.json").read_text()) if (args.resume or args.report_only) else {}
    if args.redo and not args.resume:
        raise SystemExit("hvdsketch bench train: --redo reruns part of an earlier bench.json; give --resume too")
    others, kept = carried(earlier_results(earlier), jobs, args.report_only, args.redo)
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
                           "timeout_s": matrix.timeout_s, "repeats": matrix.repeats}}
        if args.resume and "command" in earlier:  # the runs kept were made by the earlier commands
            meta["resumed"] = earlier.get("resumed", []) + [earlier["command"]]
            meta["started"], meta["load"] = earlier["started"], earlier["load"][:1]
        began = time.time()
        print(f"hvdsketch bench train: {len(jobs)} runs ({matrix.repeats} repeats), timeout "
              f"{matrix.timeout_s:.0f} s each, load {os.getloadavg()[0]:.1f}, output {out}", flush=True)
        print(probe_notice(matrix, jobs), flush=True)
        for i, job in enumerate(jobs, 1):
            if job.key in kept:
                results.append(kept[job.key])
                print(f"[{i}/{len(jobs)}] {job.key}: kept from the earlier run", flush=True)
                continue
            print(f"[{i}/{len(jobs)} {_clock(time.time() - began)}] {job.key} ...", flush=True)
            results.append(run_job(job, out, matrix.timeout_s, matrix, len(meta.get("resumed", []))))
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


def probe_notice(matrix: Matrix, jobs: list[Job]) -> str:
    """One line on what the probes of ``jobs`` time against, said before anything runs."""
    probed = sorted({j.workload.name for j in jobs if j.entry is None})
    missing = [w for w in probed if probe_problem(matrix, w)]
    if missing:
        return (f"exchange probe: {', '.join(missing)}: no entry labelled {matrix.baseline!r} (its baseline) in the "
                f"bench config; those probes are reported unavailable")
    if probed and matrix.probe_baseline is not None:
        return (f"exchange probe: --entries leaves out {matrix.baseline}; each probe times {matrix.baseline} too "
                f"(its baseline; {matrix.baseline} is not trained)")
    return f"exchange probe: {', '.join(probed)} against {matrix.baseline}" if probed else "exchange probe: none"


def estimate(jobs: list[Job], earlier: Path) -> str:
    """How long ``jobs`` take by the run times of the same cells, entries and steps in ``earlier``; a
    job whose entry was not timed there at the median run of its cell (workload, rate, ranks, steps)."""
    if not earlier.exists():
        return f"{len(jobs)} runs; no {earlier} to estimate their time from"
    seconds: dict[tuple[str, str, int, int | None, str], list[float]] = {}
    for r in json.loads(earlier.read_text()).get("results", []):
        if r["status"] == "ok":
            key = (r["workload"], r["rate"], r["ranks"], r["record"].get("steps"), r["label"])
            seconds.setdefault(key, []).append(r["seconds"])
    cells: dict[tuple[str, str, int, int | None], list[float]] = {}
    for key, times in seconds.items():
        cells.setdefault(key[:4], []).extend(times)
    priced, by_cell, unknown = 0.0, 0, 0
    for j in jobs:
        cell = (j.workload.name, j.rate, j.ranks,
                j.workload.probe_steps if j.entry is None else math.prod(j.workload.budget(j.rate)))
        times = seconds.get((*cell, j.label)) or cells.get(cell)
        by_cell += (*cell, j.label) not in seconds and times is not None
        unknown += times is None
        priced += statistics.median(times) if times else 0.0
    return (f"{len(jobs)} runs; about {_clock(priced)} (h:m:s) by the run times in {earlier}"
            + (f", {by_cell} of them at their cell's median run" if by_cell else "")
            + (f", {unknown} of them in no cell timed there" if unknown else ""))


def _clock(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(seconds))
