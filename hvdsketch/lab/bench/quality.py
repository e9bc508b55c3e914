"""Time to a quality: the unshaped runs' quality curves joined with the shaped runs' step times.

Quality per step does not depend on the link, so every entry trains long on
unshaped links (:data:`~hvdsketch.lab.bench.matrix.UNSHAPED`, validating after
every epoch: its *curve*, quality against steps), and briefly on each shaped
link to time its steps. For each workload and rank count the target is the
baseline's (dense Horovod's) final quality; an entry's time to it is::

    time to target = (steps until its curve first reaches the target) x (its median step time at that rate)

An entry whose curve never reaches the target within the run has none (it is
reported with its final quality). The same curves, with steps scaled by each
rate's step time, are the plots of quality against wall time per link rate;
and each entry's bytes per step against its final quality is the Pareto front
of the sparse methods.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from hvdsketch.lab.bench.matrix import UNSHAPED

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
    target: float
    final: float
    steps: int | None     # to the target, from the unshaped curve
    step_s: float | None  # median step time at ``rate``
    seconds: float | None  # steps x step_s

    def speedup(self, baseline: "TimeToTarget | None") -> float | None:
        if baseline is None or baseline.seconds is None or not self.seconds:
            return None
        return baseline.seconds / self.seconds


def times_to_target(runs: Iterable[tuple[str, str, int, str, dict[str, Any]]], baseline: str) -> list[TimeToTarget]:
    """From ``(workload, rate, ranks, label, record)`` of successful runs: for every shaped cell and
    every entry with an unshaped curve of the same workload and ranks, its time to the baseline's
    final unshaped quality."""
    runs = list(runs)
    curves = {(w, n, label): rec for w, rate, n, label, rec in runs if rate == UNSHAPED}
    out = []
    for w, rate, n, label, rec in runs:
        if rate == UNSHAPED or (w, n, label) not in curves:
            continue
        base, mine = curves.get((w, n, baseline)), curves[(w, n, label)]
        found = metric(mine)
        if base is None or found is None or not curve(base):
            continue
        target = curve(base)[-1][1]
        points = curve(mine)
        steps = steps_to(points, target, found[1])
        step = step_seconds(rec)
        out.append(TimeToTarget(w, rate, n, label, target, points[-1][1], steps, step,
                                None if steps is None else steps * step))
    return out


def wall_time_curves(runs: Iterable[tuple[str, str, int, str, dict[str, Any]]], workload: str
                     ) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Per shaped cell ``"RATE, N ranks"`` of ``workload``: each entry's unshaped quality curve with
    steps turned into seconds at that cell's step time."""
    runs = [r for r in runs if r[0] == workload]
    curves = {(n, label): curve(rec) for _, rate, n, label, rec in runs if rate == UNSHAPED}
    panels: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for _, rate, n, label, rec in runs:
        if rate != UNSHAPED and (n, label) in curves:
            step = step_seconds(rec)
            panels.setdefault(f"{rate}, {n} ranks", {})[label] = [(s * step, q) for s, q in curves[(n, label)]]
    return panels
