"""Time to a quality: the unshaped runs' quality curves joined with the shaped runs' step times.

Quality per step does not depend on the link, so every entry trains long on
unshaped links (:data:`~hvdsketch.lab.bench.matrix.UNSHAPED`, validating after
every epoch: its *curve*, quality against steps), and briefly on each shaped
link to time its steps. For each workload and rank count the target is the
baseline's (dense Horovod's) final quality from the same seed: the entries of
one round train from one seed, and where quality is noisier than the methods'
differences (the LSTM) a seed's trajectory sets how far every entry gets, so a
run is held to dense's end on its own seed, and dense reaches its own target
in every seed. ``auto``'s decisions follow the link, so its unshaped runs decide
for a shaped rate (:func:`~hvdsketch.lab.bench.matrix.declared`) and join only
that rate's step times. An entry's time to it is::

    time to target = (steps until its curve first reaches its seed's target) x (its median step time at that rate)

each a :class:`~hvdsketch.lab.bench.spread.Spread`: the steps over the entry's
unshaped repeats (one per seed; a seed whose curve never reaches its target
counts as ``inf``, never), the step time over its shaped repeats, the time
spread from their extreme products. The same curves, averaged over the seeds
(error bars: the seeds' range) and with steps scaled by each rate's step time,
are the plots of quality against wall time per link rate; and each entry's
bytes per step against its final quality is the Pareto front of the sparse
methods.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, NamedTuple, Sequence

from hvdsketch.lab.bench.matrix import UNSHAPED, declared_link
from hvdsketch.lab.bench.spread import Spread
from hvdsketch.spec import Spec

#: The headline metric of a record and whether higher is better.
QUALITY = (("perplexity", False), ("accuracy", True))


def metric(record: dict[str, Any]) -> tuple[str, bool] | None:
    """The record's headline validation metric and its direction."""
    last = (record.get("validation") or [{}])[-1]
    return next(((k, up) for k, up in QUALITY if k in last), None)


def curve(record: dict[str, Any]) -> list[tuple[int, float]]:
    """``(steps trained, quality)`` after every epoch of a run."""
    found = metric(record)
    if found is None:
        return []
    per_epoch = record["steps"] / max(record["epochs"], 1)
    return [(round(per_epoch * (i + 1)), float(v[found[0]])) for i, v in enumerate(record["validation"])]


def seed_of(record: dict[str, Any]) -> str:
    """The seed a run trained from: its workload flag's ``seed`` (``""``, the workload's default,
    where the flag names none)."""
    flag = (record.get("config") or {}).get("workload")
    return Spec.parse(flag).options.get("seed", "") if isinstance(flag, str) else ""


def steps_to(points: Sequence[tuple[int, float]], target: float, higher_is_better: bool) -> int | None:
    """The first step count whose quality is at least as good as ``target`` (``None``: never)."""
    for steps, value in points:
        if (value >= target) if higher_is_better else (value <= target):
            return steps
    return None


def step_seconds(record: dict[str, Any]) -> float:
    """A run's typical step: the median of its steps where the record lists them (robust to the
    spikes of a shared machine and to the first step's one-off costs), else the mean."""
    steps = record.get("steps_s")
    return statistics.median(steps) if steps else record["step_s"]


@dataclass(frozen=True)
class TimeToTarget:
    """One entry's way to the baseline's final quality in one (workload, rate, ranks) cell."""

    workload: str
    rate: str
    ranks: int
    label: str
    target: float     # the baseline's final quality, the mean over the seeds of its per-seed targets
    final: Spread     # this entry's final quality over its seeds
    steps: Spread     # to the target, from the unshaped curves (inf: a seed never reached it)
    step_s: Spread    # median step time at ``rate``, over the shaped repeats
    seconds: Spread   # steps x step_s

    @property
    def reached(self) -> bool:
        """Whether every seed's curve reached the target."""
        return math.isfinite(self.steps.high)

    def speedup(self, baseline: "TimeToTarget | None") -> Spread | None:
        return None if baseline is None else baseline.seconds.over(self.seconds)


Runs = Iterable[tuple[str, str, int, str, dict[str, Any]]]  # (workload, rate, ranks, label, record)


class Curve(NamedTuple):
    """One unshaped repeat's quality after each epoch."""

    seed: str
    points: list[tuple[int, float]]  # (steps trained, quality)
    up: bool  # higher is better


def _curves(runs: Runs, rate: str) -> dict[tuple[str, int, str], list[Curve]]:
    """Per (workload, ranks, label): every unshaped repeat's curve that speaks for ``rate`` (a run
    whose ``auto`` decided for another link does not, :func:`~hvdsketch.lab.bench.matrix.declared_link`)."""
    out: dict[tuple[str, int, str], list[Curve]] = {}
    for w, at, n, label, rec in runs:
        found = metric(rec)
        link = declared_link((rec.get("config") or {}).get("compression"))
        if at == UNSHAPED and found is not None and curve(rec) and link in (None, rate):
            out.setdefault((w, n, label), []).append(Curve(seed_of(rec), curve(rec), found[1]))
    return out


def _step_times(runs: Runs) -> dict[tuple[str, str, int, str], Spread]:
    """Per shaped (workload, rate, ranks, label): the median step times of its repeats."""
    found: dict[tuple[str, str, int, str], list[float]] = {}
    for w, rate, n, label, rec in runs:
        if rate != UNSHAPED:
            found.setdefault((w, rate, n, label), []).append(step_seconds(rec))
    return {key: Spread.median(values) for key, values in found.items()}


def _joined(runs: Runs) -> Iterator[tuple[tuple[str, str, int, str], Spread, dict[tuple[str, int, str], list[Curve]]]]:
    """Each shaped (workload, rate, ranks, label) with its step times and the unshaped curves that
    speak for its rate (read once a rate)."""
    steps = _step_times(runs)
    by_rate = {rate: _curves(runs, rate) for _, rate, _, _ in steps}
    for key, step in steps.items():
        yield key, step, by_rate[key[1]]


def times_to_target(runs: Runs, baseline: str) -> list[TimeToTarget]:
    """From ``(workload, rate, ranks, label, record)`` of successful runs (several per entry: its
    repeats): for every shaped cell and every entry with unshaped curves of the same workload and
    ranks, its time to the baseline's final unshaped quality from the same seed."""
    runs, out = list(runs), []
    for (w, rate, n, label), step, curves in _joined(runs):
        base, mine = curves.get((w, n, baseline)), curves.get((w, n, label))
        if not base or not mine:
            continue
        ends: dict[str, list[float]] = {}
        for c in base:
            ends.setdefault(c.seed, []).append(c.points[-1][1])
        targets = {seed: statistics.fmean(values) for seed, values in ends.items()}
        reach = [steps_to(c.points, targets[c.seed], c.up) for c in mine if c.seed in targets]
        if not reach:  # no run of the baseline from this entry's seeds
            continue
        to = Spread.median(math.inf if s is None else s for s in reach)
        out.append(TimeToTarget(w, rate, n, label, statistics.fmean(targets.values()),
                                Spread.mean(c.points[-1][1] for c in mine), to, step, to.times(step)))
    return out


def wall_time_curves(runs: Runs, workload: str) -> dict[str, dict[str, list[tuple[float, ...]]]]:
    """Per shaped cell ``"RATE, N ranks"`` of ``workload``: each entry's unshaped quality curve, the
    mean over its seeds, with steps turned into seconds at that cell's median step time:
    ``(seconds, mean, lowest seed, highest seed)`` after each epoch."""
    runs = [r for r in runs if r[0] == workload]
    panels: dict[str, dict[str, list[tuple[float, ...]]]] = {}
    for (_, rate, n, label), step, curves in _joined(runs):
        if (workload, n, label) not in curves:
            continue
        seeds = [c.points for c in curves[(workload, n, label)]]
        epochs = zip(*seeds)  # the seeds' points after each epoch
        panels.setdefault(f"{rate}, {n} ranks", {})[label] = [
            (at[0][0] * step.center, *Spread.mean(q for _, q in at).bounds()) for at in epochs]
    return panels
