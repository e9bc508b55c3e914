"""The targets of the benchmark (issues 12, 14 and 15), checked against one run's measurements.

Per cell (workload, link rate, ranks) a target compares its *subject* entry
with a *baseline* entry of the same cell (dense Horovod unless it names another):

==========================  ========  =====  ===================================================================
target                      workload  rate   requirement
==========================  ========  =====  ===================================================================
time to target              lstm,     1gbit  the fastest of hvdsketch's own entries (OURS) reaches dense's final
                            fasttext         quality at least 1.8x sooner than dense and sooner than every other
exact reaches dense         lstm,     none   the exact sparse methods reach dense's final quality
                            fasttext
embedding exchange          lstm      1gbit  the sketch's exchange of the probed embedding at most 0.19x dense's
auto vs sparse allgather    fasttext  1gbit  ``auto`` no slower per step than Horovod's sparse allgather
auto quality                fasttext  1gbit  ``auto``'s accuracy within 1% of dense
sketch EF codec             fasttext  1gbit  ``sketch-ef``'s codec time per step at most 2x ``sketch``'s
auto vs DDP+PowerSGD        lstm      1gbit  ``auto`` faster per step than ``ddp-powersgd``
hvdsketch none              fashion   1gbit  hvdsketch's optimizer with ``none`` at most 3% slower than Horovod's
hvdsketch fp16              fashion   1gbit  hvdsketch's optimizer with fp16 at most 3% slower than Horovod's
drop-in sketch              fashion   1gbit  Horovod's optimizer with ``Compression.sketch()`` at most 3% slower
                                             than with ``none``, accuracy within 1%
drop-in sketch              lstm,     1gbit  Horovod's optimizer (tape) with ``Compression.sketch()`` faster than
                            lstm_tf          dense, perplexity within 2%
==========================  ========  =====  ===================================================================

A target whose runs failed, or whose cell was not run, is ``not measured``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

RATE = "1gbit"


#: hvdsketch's own methods: the entries the time-to-target target picks its best from.
OURS = ("sketch", "sketch-ef", "union", "allgather", "auto")
#: The exact sparse methods.
EXACT = ("union", "allgather", "hvd-allgather")


@dataclass(frozen=True)
class Outcome:
    """What one entry measured in one cell (``None``: failed or not run)."""

    step_s: float | None
    quality: float | None
    higher_is_better: bool
    probe_s: float | None = None
    codec_s: float | None = None           # compress + decompress per step
    bytes_per_step: float | None = None
    time_to_target_s: float | None = None  # to the baseline's final quality (steps unshaped x step time here)
    reached: bool = False                  # its unshaped curve reached the baseline's final quality
    runner: str = "train"


#: (workload, rate, ranks) -> label -> outcome
Cells = Mapping[tuple[str, str, int], Mapping[str, Outcome]]


@dataclass(frozen=True)
class Verdict:
    target: str
    subject: str
    workload: str
    rate: str
    ranks: int
    measured: str
    required: str
    met: bool | None  # None: not measured

    @property
    def word(self) -> str:
        return {True: "met", False: "MISSED", None: "not measured"}[self.met]


@dataclass(frozen=True)
class Target:
    name: str
    workload: str
    required: str
    applies: Callable[[str, int], bool]  # (rate, ranks) -> does this cell count
    check: Callable[[Mapping[str, Outcome], str, str], tuple[str, bool] | None]  # (cell, subject, baseline)
    subject: str | None = None   # None: the matrix's subject
    baseline: str | None = None  # None: the matrix's baseline


def _pair(cell: Mapping[str, Outcome], subject: str, baseline: str, field: str) -> tuple[float, float] | None:
    s, b = cell.get(subject), cell.get(baseline)
    values = (getattr(s, field, None), getattr(b, field, None))
    return None if None in values else values  # type: ignore[return-value]


def _seconds_at_most(limit: float, field: str, than: str | None = None, digits: int = 0):
    """The subject's ``field`` (seconds) over ``than``'s (the baseline's when None) at most ``limit``."""
    def check(cell, subject, baseline):
        pair = _pair(cell, subject, than or baseline, field)
        if pair is None:
            return None
        ratio = pair[0] / pair[1]
        return f"{ratio:.2f}x ({1e3 * pair[0]:.{digits}f} vs {1e3 * pair[1]:.{digits}f} ms)", ratio <= limit
    return check


def exchange_at_most(fraction: float):
    """The probed tensor's exchange at most ``fraction`` of the baseline's."""
    return _seconds_at_most(fraction, "probe_s")


def faster_by(at_least: float):
    """Baseline's step time over the subject's at least ``at_least`` (1.0: no slower)."""
    def check(cell, subject, baseline):
        pair = _pair(cell, subject, baseline, "step_s")
        if pair is None:
            return None
        ratio = pair[1] / pair[0]
        return f"{ratio:.2f}x ({1e3 * pair[0]:.1f} vs {1e3 * pair[1]:.1f} ms)", ratio >= at_least
    return check


def slower_by_at_most(fraction: float):
    def check(cell, subject, baseline):
        pair = _pair(cell, subject, baseline, "step_s")
        if pair is None:
            return None
        extra = pair[0] / pair[1] - 1
        return f"{extra:+.1%} ({1e3 * pair[0]:.1f} vs {1e3 * pair[1]:.1f} ms)", extra <= fraction
    return check


def quality_within(fraction: float):
    def check(cell, subject, baseline):
        pair = _pair(cell, subject, baseline, "quality")
        if pair is None:
            return None
        worse = (pair[1] - pair[0]) / pair[1] if cell[subject].higher_is_better else (pair[0] - pair[1]) / pair[1]
        return f"{pair[0]:.4g} vs {pair[1]:.4g} ({max(worse, 0):.1%} worse)", worse <= fraction
    return check


def both(*checks):
    """Every check met (``None`` if any is not measured)."""
    def check(cell, subject, baseline):
        results = [c(cell, subject, baseline) for c in checks]
        if any(r is None for r in results):
            return None
        return "; ".join(r[0] for r in results), all(r[1] for r in results)
    return check


def codec_at_most(times: float, than: str):
    """Codec time at most ``times`` that of entry ``than``."""
    return _seconds_at_most(times, "codec_s", than, digits=1)


def soonest_to_target(at_least: float):
    """The fastest of :data:`OURS` to the baseline's final quality: ``at_least`` times sooner than the
    baseline and sooner than every other entry that ran."""
    def check(cell, subject, baseline):
        timed = {label: o.time_to_target_s for label, o in cell.items() if o.time_to_target_s is not None}
        base = cell.get(baseline)
        if base is None or base.time_to_target_s is None or not any(label in timed for label in OURS):
            return None
        best = min((label for label in OURS if label in timed), key=timed.get)
        others = {label: t for label, t in timed.items() if label not in OURS}
        rival = min(others, key=others.get) if others else None
        ratio = base.time_to_target_s / timed[best]
        ahead = rival is None or timed[best] < others[rival]
        text = f"{best} {timed[best]:.0f} s, {ratio:.2f}x {baseline}" + (
            f"; best other {rival} {others[rival]:.0f} s" if rival else "")
        return text, ratio >= at_least and ahead
    return check


def reaches_target(cell, subject, baseline):
    ran = {label: o for label, o in cell.items() if label in EXACT and o.quality is not None}
    if not ran:
        return None
    missed = [label for label, o in ran.items() if not o.reached]
    return (", ".join(f"{label} {'reached' if o.reached else f'{o.quality:.4g}'}" for label, o in ran.items()),
            not missed)


def at(rate: str, ranks: Sequence[int] = (2, 4)) -> Callable[[str, int], bool]:
    return lambda r, n: r == rate and n in ranks


TARGETS = (
    Target("time to target", "lstm", ">= 1.8x dense, sooner than every other entry", at(RATE), soonest_to_target(1.8)),
    Target("time to target", "fasttext", ">= 1.8x dense, sooner than every other entry", at(RATE),
           soonest_to_target(1.8)),
    Target("exact reaches dense", "lstm", "dense's final perplexity", at("1gbit"), reaches_target),
    Target("exact reaches dense", "fasttext", "dense's final accuracy", at("1gbit"), reaches_target),
    Target("embedding exchange", "lstm", "<= 0.19x dense (81% less)", at(RATE), exchange_at_most(0.19)),
    Target("auto vs sparse allgather", "fasttext", "no slower than hvd-allgather", at(RATE), faster_by(1.0),
           subject="auto", baseline="hvd-allgather"),
    Target("auto quality", "fasttext", "accuracy within 1% of dense", at(RATE), quality_within(0.01), subject="auto"),
    Target("sketch EF codec", "fasttext", "<= 2x sketch's codec time", at(RATE), codec_at_most(2.0, "sketch"),
           subject="sketch-ef"),
    Target("auto vs DDP+PowerSGD", "lstm", "faster than ddp-powersgd", at(RATE), faster_by(1.0),
           subject="auto", baseline="ddp-powersgd"),
    Target("hvdsketch none", "fashion", "<= 3% slower than Horovod's", at(RATE), slower_by_at_most(0.03),
           subject="none"),
    Target("hvdsketch fp16", "fashion", "<= 3% slower than Horovod's fp16", at(RATE), slower_by_at_most(0.03),
           subject="fp16-hvdsketch", baseline="fp16"),
    Target("drop-in sketch", "fashion", "<= 3% slower than none, accuracy within 1%", at(RATE),
           both(slower_by_at_most(0.03), quality_within(0.01)), subject="dropin-sketch"),
    Target("drop-in sketch", "lstm", "faster than dense, perplexity within 2%", at(RATE),
           both(faster_by(1.0), quality_within(0.02)), subject="dropin-sketch"),
    Target("drop-in sketch", "lstm_tf", "faster than dense, perplexity within 2%", at(RATE),
           both(faster_by(1.0), quality_within(0.02)), subject="dropin-sketch"),
    Target("tape sketch", "lstm_tf", "faster than dense, perplexity within 2%", at(RATE),
           both(faster_by(1.0), quality_within(0.02)), subject="sketch"),
)


def evaluate(cells: Cells, subject: str, baseline: str, measured_cells: Iterable[tuple[str, str, int]],
             targets: Sequence[Target] = TARGETS) -> list[Verdict]:
    """A verdict per target and per cell it applies to, among the cells the matrix ran
    (``measured_cells``, failed runs included, so a failure reads ``not measured``); ``subject`` and
    ``baseline`` are the matrix's, for the targets that name none of their own."""
    out = []
    for target in targets:
        mine, theirs = target.subject or subject, target.baseline or baseline
        for workload, rate, ranks in measured_cells:
            if workload != target.workload or not target.applies(rate, ranks):
                continue
            result = target.check(cells.get((workload, rate, ranks), {}), mine, theirs)
            measured, met = result if result is not None else ("-", None)
            out.append(Verdict(target.name, mine, workload, rate, ranks, measured, target.required, met))
    return out
