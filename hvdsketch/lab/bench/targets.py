"""The targets of the benchmark (issues 12, 14, 15, 21 and 25), decided on the spreads of the repeats of one run.

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
auto vs Horovod's fp16      lstm_tf   1gbit  hvdsketch's tape with ``auto`` faster per step than Horovod's tape
                                             with fp16
hook vs DDP+PowerSGD        lstm      1gbit  hvdsketch's DDP hook with ``auto`` (:data:`HOOKS`) faster per step
                                             than ``ddp-powersgd``
hook vs sparse allgather    fasttext  1gbit  hvdsketch's DDP hook with ``auto`` no slower per step than Horovod's
                                             sparse allgather
hvdsketch none              fashion   1gbit  hvdsketch's optimizer with ``none`` at most 3% slower than Horovod's
hvdsketch fp16              fashion   1gbit  hvdsketch's optimizer with fp16 at most 3% slower than Horovod's
drop-in sketch              fashion   1gbit  Horovod's optimizer with ``Compression.sketch()`` at most 3% slower
                                             than with ``none``, accuracy within 1%
drop-in sketch              lstm,     1gbit  Horovod's optimizer (tape) with ``Compression.sketch()`` faster than
                            lstm_tf          dense, perplexity within 2%
FSDP2 reduce-scatter        trans-    1gbit  the fastest of hvdsketch's FSDP entries (:data:`FSDP_OURS`) at least
                            former           1.3x faster per step than FSDP2 with a bfloat16 ``reduce_dtype``, its
                                             perplexity within the seeds' spread of that baseline's
==========================  ========  =====  ===================================================================

Every figure is a :class:`~hvdsketch.lab.bench.spread.Spread` over the repeats
of its entry, and a requirement is decided by one rule, :func:`judge`, on the
whole spread of the figure it bounds (a ratio of step times from 5 rounds or
more spreads between the ratios of the two entries' runs in one round, others
between the extreme ratios): **met** if even the least favourable repeats meet
it (for "A at least 5% faster than B": A against B in the round least favourable
to A; without such rounds, A's slowest repeat against B's fastest),
**MISSED** if even the most favourable ones miss it, **undecided** when the
spread straddles the margin. A target of several requirements is met if all
are, missed if any is, else undecided. A target whose runs failed, or whose
cell was not run, is ``not measured``.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from typing import Callable, Iterable, Mapping, Sequence

from hvdsketch.lab.bench.spread import Spread

RATE = "1gbit"


#: hvdsketch's own methods: the entries the time-to-target target picks its best from.
OURS = ("sketch", "sketch-ef", "union", "allgather", "auto")
#: The exact sparse methods.
EXACT = ("union", "allgather", "hvd-allgather")
#: hvdsketch's FSDP2 front end (:mod:`hvdsketch.lab.bench.fsdp`), by method: the entries the FSDP2 target picks from.
FSDP_OURS = ("fsdp-hvdsketch-fp16", "fsdp-hvdsketch-quantize", "fsdp-hvdsketch-quantize4", "fsdp-hvdsketch-rows",
             "fsdp-hvdsketch-auto")
#: hvdsketch's DDP hook with ``auto``: its messages over torch.distributed, and over hvdsketch's MPI layer.
HOOKS = ("ddp-hook-auto", "ddp-hook-auto-mpi")

MET, MISSED, UNDECIDED, UNMEASURED = "met", "MISSED", "undecided", "not measured"


def judge(figure: Spread, limit: float, at_most: bool) -> str:
    """The verdict rule, for every target: ``figure <= limit`` (``at_most``) or ``figure >= limit``
    holds at both ends of the figure's spread (met), at neither (MISSED), or at one (undecided)."""
    holds = [(v <= limit) if at_most else (v >= limit) for v in (figure.low, figure.high)]
    return MET if all(holds) else MISSED if not any(holds) else UNDECIDED


def combine(words: Iterable[str]) -> str:
    """Several requirements together: MISSED if any is, met if all are, else undecided."""
    words = list(words)
    return MISSED if MISSED in words else MET if all(w == MET for w in words) else UNDECIDED


@dataclass(frozen=True)
class Outcome:
    """What one entry measured in one cell over its repeats (``None``: failed or not run); a plain
    number is taken as one measurement."""

    step_s: Spread | None
    quality: Spread | None
    higher_is_better: bool
    probe_s: Spread | None = None
    codec_s: Spread | None = None           # compress + decompress per step
    bytes_per_step: Spread | None = None
    time_to_target_s: Spread | None = None  # to the baseline's final quality (inf: a seed never reached it)
    runner: str = "train"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                object.__setattr__(self, f.name, Spread.point(float(value)))

    @property
    def reached(self) -> bool | None:
        """Whether its unshaped runs reached the baseline's final quality: all seeds (True), none
        (False), some (None), by :func:`judge` on the time to it."""
        if self.time_to_target_s is None:
            return False
        return {MET: True, MISSED: False}.get(judge(self.time_to_target_s, sys.float_info.max, at_most=True))


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
    word: str  # met | MISSED | undecided | not measured

    @property
    def met(self) -> bool | None:
        """True met, False missed, None undecided or not measured."""
        return {MET: True, MISSED: False}.get(self.word)


Check = Callable[[Mapping[str, Outcome], str, str], "tuple[str, str] | None"]  # -> (measured, word)


@dataclass(frozen=True)
class Target:
    name: str
    workload: str
    required: str
    applies: Callable[[str, int], bool]  # (rate, ranks) -> does this cell count
    check: Check  # (cell, subject, baseline)
    subject: str | None = None   # None: the matrix's subject
    baseline: str | None = None  # None: the matrix's baseline


def _pair(cell: Mapping[str, Outcome], subject: str, baseline: str, field: str) -> tuple[Spread, Spread] | None:
    s, b = cell.get(subject), cell.get(baseline)
    values = (getattr(s, field, None), getattr(b, field, None))
    return None if None in values else values  # type: ignore[return-value]


def _ms(s: Spread, b: Spread, digits: int = 3) -> str:
    return f"{s.text(digits, scale=1e3)} vs {b.text(digits, scale=1e3)} ms"


def _seconds_at_most(limit: float, field: str, than: str | None = None) -> Check:
    """The subject's ``field`` (seconds) over ``than``'s (the baseline's when None) at most ``limit``."""
    def check(cell, subject, baseline):
        pair = _pair(cell, subject, than or baseline, field)
        if pair is None:
            return None
        ratio = pair[0].over(pair[1])
        return f"{ratio.text(3, 'x')} ({_ms(*pair)})", judge(ratio, limit, at_most=True)
    return check


def exchange_at_most(fraction: float) -> Check:
    """The probed tensor's exchange at most ``fraction`` of the baseline's."""
    return _seconds_at_most(fraction, "probe_s")


def faster_by(at_least: float) -> Check:
    """Baseline's step time over the subject's at least ``at_least`` (1.0: no slower)."""
    def check(cell, subject, baseline):
        pair = _pair(cell, subject, baseline, "step_s")
        if pair is None:
            return None
        ratio = pair[1].over(pair[0])
        return f"{ratio.text(3, 'x')} ({_ms(*pair)})", judge(ratio, at_least, at_most=False)
    return check


def slower_by_at_most(fraction: float) -> Check:
    def check(cell, subject, baseline):
        pair = _pair(cell, subject, baseline, "step_s")
        if pair is None:
            return None
        ratio = pair[0].over(pair[1])
        return f"{ratio.percent()} ({_ms(*pair)})", judge(ratio, 1 + fraction, at_most=True)
    return check


def quality_within(fraction: float) -> Check:
    """The subject's quality at most ``fraction`` worse than the baseline's (relative)."""
    def check(cell, subject, baseline):
        pair = _pair(cell, subject, baseline, "quality")
        if pair is None:
            return None
        ratio = pair[0].over(pair[1])
        up = cell[subject].higher_is_better
        word = judge(ratio, 1 - fraction, at_most=False) if up else judge(ratio, 1 + fraction, at_most=True)
        return f"{pair[0].text()} vs {pair[1].text()} ({ratio.percent()})", word
    return check


def both(*checks: Check) -> Check:
    """Every check met (``None`` if any is not measured)."""
    def check(cell, subject, baseline):
        results = [c(cell, subject, baseline) for c in checks]
        if any(r is None for r in results):
            return None
        return "; ".join(r[0] for r in results), combine(r[1] for r in results)
    return check


def codec_at_most(times: float, than: str) -> Check:
    """Codec time at most ``times`` that of entry ``than``."""
    return _seconds_at_most(times, "codec_s", than)


def soonest_to_target(at_least: float) -> Check:
    """The fastest of :data:`OURS` to the baseline's final quality (by the median): ``at_least`` times
    sooner than the baseline and sooner than every other entry that ran."""
    def check(cell, subject, baseline):
        timed = {label: o.time_to_target_s for label, o in cell.items() if o.time_to_target_s is not None}
        base = timed.get(baseline)
        if base is None or not any(label in timed for label in OURS):
            return None
        best = min((label for label in OURS if label in timed), key=lambda label: timed[label].center)
        others = {label: t for label, t in timed.items() if label not in OURS}
        rival = min(others, key=lambda label: others[label].center) if others else None
        ratio = base.over(timed[best])
        words = [judge(ratio, at_least, at_most=False)]
        if rival:
            words.append(judge(others[rival].over(timed[best]), 1.0, at_most=False))
        text = f"{best} {timed[best].text(3, ' s')}, {ratio.text(3, 'x')} {baseline}" + (
            f"; best other {rival} {others[rival].text(3, ' s')}" if rival else "")
        return text, combine(words)
    return check


def fastest_within_spread(entries: Sequence[str], at_least: float) -> Check:
    """The fastest of ``entries`` (by the median step) at least ``at_least`` times faster per step than
    the baseline, with its quality inside the range of the baseline's repeats (seeds)."""
    def check(cell, subject, baseline):
        ran = [label for label in entries if getattr(cell.get(label), "step_s", None) is not None]
        base = cell.get(baseline)
        if not ran or base is None or base.step_s is None or base.quality is None:
            return None
        best = min(ran, key=lambda label: cell[label].step_s.center)
        ratio = base.step_s.over(cell[best].step_s)
        quality = cell[best].quality
        inside = MET if quality is not None and base.quality.low <= quality.center <= base.quality.high else MISSED
        return (f"{best} {ratio.text(3, 'x')} ({_ms(cell[best].step_s, base.step_s)}); quality "
                f"{quality.text() if quality else '-'} vs {base.quality.text()}",
                combine([judge(ratio, at_least, at_most=False), inside]))
    return check


def reaches_target(cell, subject, baseline):
    ran = {label: o for label, o in cell.items() if label in EXACT and o.quality is not None}
    if not ran or getattr(cell.get(baseline), "time_to_target_s", None) is None:
        return None  # nothing ran, or no final quality of the baseline to reach
    said = {True: "reached", False: "not reached", None: "some seeds reached"}
    return (", ".join(f"{label} {said[o.reached]}" + ("" if o.reached else f" ({o.quality.text()})")
                      for label, o in ran.items()),
            combine({True: MET, False: MISSED, None: UNDECIDED}[o.reached] for o in ran.values()))


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
    Target("auto vs Horovod's fp16", "lstm_tf", "faster than Horovod's tape with fp16", at(RATE), faster_by(1.0),
           subject="auto", baseline="fp16"),
    *(Target("hook vs DDP+PowerSGD", "lstm", "faster than ddp-powersgd", at(RATE), faster_by(1.0), subject=hook,
             baseline="ddp-powersgd") for hook in HOOKS),
    *(Target("hook vs sparse allgather", "fasttext", "no slower than hvd-allgather", at(RATE), faster_by(1.0),
             subject=hook, baseline="hvd-allgather") for hook in HOOKS),
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
    Target("FSDP2 reduce-scatter", "transformer", ">= 1.3x fsdp-bf16 per step, perplexity inside its seeds' spread",
           at(RATE), fastest_within_spread(FSDP_OURS, 1.3), subject="fsdp-hvdsketch-best", baseline="fsdp-bf16"),
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
            measured, word = result if result is not None else ("-", UNMEASURED)
            out.append(Verdict(target.name, mine, workload, rate, ranks, measured, target.required, word))
    return out
