"""What ``hvdsketch bench train`` runs: entries x workloads x link rates x rank counts, from a YAML file.

::

    rates: [1gbit, 10gbit]          # launch/cluster.sh --rate (``none``: unshaped loopback)
    ranks: [2, 4]
    timeout_s: 1200                 # per run; a run past it is killed and reported as timed out
    repeats: 3                      # every entry of a cell this many times, interleaved (A B C A B C ...)
    baseline: dense                 # the entry every speed-up and quality is measured against
    subject: sketch                 # the entry the targets are about
    workloads:
      lstm: {config: configs/lstm.yaml, epochs: 2, steps_per_epoch: 50, probe: embedding.weight, seeds: 3}
    entries:
      - {label: dense, compression: none, path: horovod}
      - {label: sketch, compression: {rules: [...], default: none}, workloads: [lstm]}
      - {label: ddp, runner: hvdsketch.lab.bench.ddp, args: [--hook, none]}
    quick: {workloads: [fasttext], entries: [dense, sketch], rates: [1gbit], ranks: [2], steps_per_epoch: 10}

An entry is one way to train: a compression setting (a flag, or a rules
mapping of :mod:`hvdsketch.policy`), whose optimizer (``path``), residual
memory, and the *runner*: ``train`` (``hvdsketch train``) or any module run as
``python -m MODULE --config C --out D ARGS...`` that writes the same JSON
record (the DDP baselines). Each run gets a config file of its own: the
workload's YAML with the entry's settings laid over it. A workload with a
``probe`` tensor also gets one ``hvdsketch bench exchange`` run per cell,
timing that tensor's exchange under every entry side by side, against the
baseline's (which the probe times even where ``--entries`` leaves it out of
training).

Every job runs ``repeats`` times, in rounds: each round runs every entry of
the cell once (then its probe) before the next round starts, so a slow spell
of the machine falls on all entries alike rather than on one. A repeat keeps
its own run folder (its key ends in ``-r1``, ``-r2``, ...). A workload with
``seeds: S`` trains repeat r with seed ``r mod S`` added to its workload's
own (noisy quality then comes from several seeds; the entries of one round
share a seed, so they still compare pairwise).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from hvdsketch.spec import Spec, SpecError, known_keys

TRAIN = "train"
#: The label and runner name of a cell's exchange probe.
PROBE = "exchange-probe"


def _fields(cls: type, raw: Any, where: str) -> dict[str, Any]:
    """``raw`` checked against the dataclass ``cls``: a mapping with known keys only."""
    return dict(known_keys(raw, [f.name for f in dataclasses.fields(cls)], where))


@dataclass(frozen=True)
class Entry:
    """One way to train (a row of the table).

    label            its name in tables, unique per workload
    compression      a compression flag or a rules mapping (hvdsketch train's ``compression:``)
    path             hvdsketch or horovod (whose DistributedOptimizer)
    memory           residual memory flag, or None
    sparse_as_dense  path horovod: False lets Horovod allgather sparse gradients
    momentum         the optimizer's momentum for this entry (DGC applies momentum itself)
    runner           ``train``, or a module run with ``--config C --out D`` plus ``args``
    args             extra command-line arguments for the runner
    workloads        only on these workloads (None: all)
    """

    label: str
    compression: Any = "none"
    path: str = "hvdsketch"
    memory: str | None = None
    sparse_as_dense: bool | None = None
    momentum: float | None = None
    runner: str = TRAIN
    args: tuple[str, ...] = ()
    workloads: tuple[str, ...] | None = None

    @classmethod
    def from_mapping(cls, raw: Any) -> "Entry":
        raw = _fields(cls, raw, "entry")
        if "label" not in raw:
            raise SpecError(f"entry {raw} needs a label")
        for key in ("args", "workloads"):
            if raw.get(key) is not None:
                raw[key] = tuple(str(v) for v in raw[key])
        return cls(**raw)

    def to_mapping(self) -> dict[str, Any]:
        """The inverse of :meth:`from_mapping` (plain lists, for YAML and JSON)."""
        out = dataclasses.asdict(self)
        return {**out, "args": list(self.args), "workloads": None if self.workloads is None else list(self.workloads)}

    @property
    def available(self) -> bool:
        """Whether its runner exists in this checkout (a missing one is reported, not dropped)."""
        return self.runner == TRAIN or importlib.util.find_spec(self.runner) is not None

    def overrides(self) -> dict[str, Any]:
        """The keys it lays over a workload's training config."""
        out = {"compression": self.compression, "path": self.path, "memory": self.memory,
               "sparse_as_dense": self.sparse_as_dense, "momentum": self.momentum}
        return {k: v for k, v in out.items() if v is not None}


#: The link rate of the quality runs: unshaped links, since quality per step does not depend on the link
#: (but for ``auto``'s decisions, which its quality runs take from the shaped link: :func:`declared`).
UNSHAPED = "none"


def declared(compression: Any, link: str) -> Any:
    """``compression`` deciding as on ``link``: ``auto`` that would probe the link (whose decisions,
    and so its quality, follow the link) with ``link`` declared as its bandwidth; else as it is."""
    if not isinstance(compression, str):
        return compression
    spec = Spec.parse(compression)
    if spec.name != "auto" or "bandwidth" in spec.options:
        return compression
    return str(Spec(spec.name, {**spec.options, "bandwidth": link}))


def declared_link(compression: Any) -> str | None:
    """The link ``compression`` decides for: ``auto``'s declared bandwidth, ``None`` for any other."""
    spec = Spec.parse(compression) if isinstance(compression, str) else None
    return spec.options.get("bandwidth") if spec is not None and spec.name == "auto" else None


@dataclass(frozen=True)
class WorkloadRuns:
    """How one workload is run: its training config, the same epochs and steps for every entry, and
    the tensor whose exchange ``hvdsketch bench exchange`` times (None: no probe).

    ``quality``: ``[epochs, steps_per_epoch]`` of the unshaped cells (rate ``none``), long enough for
    the methods' quality to separate; a validation after each epoch makes each run's quality curve.
    The shaped cells time steps with ``epochs`` x ``steps_per_epoch``; the report joins the two (time
    to a quality = steps to reach it, unshaped, x step time, shaped). ``workload`` replaces the
    config's workload flag (e.g. to validate on fewer examples); ``rates`` and ``ranks`` keep the
    workload to some of the matrix's cells; ``seeds``: how many seeds its repeats cycle through."""

    name: str
    config: str
    epochs: int = 1
    steps_per_epoch: int = 50
    probe: str | None = None
    probe_steps: int = 10
    quality: tuple[int, int] | None = None
    workload: str | None = None
    rates: tuple[str, ...] | None = None
    ranks: tuple[int, ...] | None = None
    seeds: int = 1

    def __post_init__(self) -> None:
        if min(self.epochs, self.steps_per_epoch, self.probe_steps, self.seeds) < 1:
            raise SpecError(f"workload {self.name}: epochs, steps_per_epoch, probe_steps and seeds must be >= 1")
        if self.quality is not None:
            if len(self.quality) != 2 or min(self.quality) < 1:
                raise SpecError(f"workload {self.name}: quality must be [epochs, steps_per_epoch], got {self.quality}")
            object.__setattr__(self, "quality", tuple(int(v) for v in self.quality))
        for key in ("rates", "ranks"):
            if getattr(self, key) is not None:
                object.__setattr__(self, key, tuple(getattr(self, key)))

    def runs_in(self, rate: str, ranks: int) -> bool:
        return (self.rates is None or rate in self.rates) and (self.ranks is None or ranks in self.ranks)

    def budget(self, rate: str) -> tuple[int, int]:
        """``(epochs, steps_per_epoch)`` of a run at ``rate``."""
        return self.quality if rate == UNSHAPED and self.quality else (self.epochs, self.steps_per_epoch)

    def training_config(self, entry: Entry, rate: str, repeat: int = 1, link: str | None = None) -> dict[str, Any]:
        """The workload's YAML with the entry's settings, the step budget at ``rate`` and (with
        ``seeds`` > 1) repeat ``repeat``'s seed laid over it; ``link``: the shaped rate an unshaped
        run's ``auto`` decides for (:func:`declared`)."""
        raw = yaml.safe_load(Path(self.config).read_text()) or {}
        overrides = entry.overrides()
        if rate == UNSHAPED and link and "compression" in overrides:
            overrides["compression"] = declared(overrides["compression"], link)
        epochs, steps = self.budget(rate)
        flag = self.workload or raw.get("workload")
        if self.seeds > 1 and flag:  # the seed is a workload option: lstm:...,seed=N
            spec = Spec.parse(flag)
            seed = int(spec.options.get("seed", 0)) + (repeat - 1) % self.seeds
            flag = str(Spec(spec.name, {**spec.options, "seed": str(seed)}))
        return {**raw, **({"workload": flag} if flag else {}), **overrides,
                "epochs": epochs, "steps_per_epoch": steps}


@dataclass(frozen=True)
class Job:
    """One run on the emulated cluster: an entry's training, or (``entry`` None) a cell's probe;
    ``repeat`` counts from 1; ``link``: for an unshaped run, the shaped rate its ``auto`` decides for."""

    workload: WorkloadRuns
    rate: str
    ranks: int
    entry: Entry | None
    repeat: int = 1
    link: str | None = None

    @property
    def label(self) -> str:
        return self.entry.label if self.entry else PROBE

    @property
    def key(self) -> str:
        return f"{self.workload.name}-{self.rate}-np{self.ranks}-{self.label}-r{self.repeat}"

    def command(self, run_dir: Path, probe_entries: list[Entry], baseline: str = "dense") -> list[str]:
        """The command ``launch/cluster.sh`` runs on every rank; writes its input files to ``run_dir``.
        A probe times ``probe_entries`` against the one labelled ``baseline``."""
        run_dir.mkdir(parents=True, exist_ok=True)
        if self.entry is None:
            entries = run_dir / "entries.yaml"
            entries.write_text(yaml.safe_dump([e.to_mapping() for e in probe_entries], sort_keys=False))
            return [sys.executable, "-m", "hvdsketch.lab.cli", "bench", "exchange", "--config", self.workload.config,
                    "--tensor", str(self.workload.probe), "--entries", str(entries),
                    "--steps", str(self.workload.probe_steps), "--baseline", baseline,
                    "--json", str(run_dir / "record.json")]
        config = run_dir / "config.yaml"
        config.write_text(yaml.safe_dump(self.workload.training_config(self.entry, self.rate, self.repeat, self.link),
                                         sort_keys=False))
        head = ([sys.executable, "-m", "hvdsketch.lab.cli", "train"] if self.entry.runner == TRAIN
                else [sys.executable, "-m", self.entry.runner])
        return head + ["--config", str(config), "--out", str(run_dir), *self.entry.args]


@dataclass(frozen=True)
class Matrix:
    workloads: tuple[WorkloadRuns, ...]
    entries: tuple[Entry, ...]
    rates: tuple[str, ...] = ("1gbit", "10gbit")
    ranks: tuple[int, ...] = (2, 4)
    timeout_s: float = 1200.0
    baseline: str = "dense"
    subject: str = "sketch"
    repeats: int = 3
    #: the baseline's entry where a selection left it out: the probes still time it (untrained)
    probe_baseline: Entry | None = None
    #: the rates of the config (``rates`` unless given), kept by a selection that runs fewer: an unshaped
    #: cell run alone (``--rates none``) still decides for the shaped rate whose step times the report joins
    configured_rates: tuple[str, ...] | None = None

    @classmethod
    def load(cls, path: str, quick: bool = False) -> "Matrix":
        """From the YAML file ``path``; ``quick`` applies its ``quick:`` section (names of the
        workloads and entries to keep, rates, ranks, and epochs/steps for every workload)."""
        raw = yaml.safe_load(Path(path).read_text())
        if not isinstance(raw, Mapping):
            raise SpecError(f"{path}: a bench config must be a mapping")
        quick_raw = raw.pop("quick", None) or {}
        raw = _fields(cls, raw, path)
        workloads = raw.get("workloads") or {}
        if not isinstance(workloads, Mapping) or not workloads:
            raise SpecError(f"{path}: workloads must map names to {{config: ..., epochs: ..., steps_per_epoch: ...}}")
        raw["workloads"] = tuple(WorkloadRuns(name=name, **_fields(WorkloadRuns, w, f"{path}: workload {name}"))
                                 for name, w in workloads.items())
        raw["entries"] = tuple(Entry.from_mapping(e) for e in raw.get("entries") or [])
        for key in ("rates", "ranks"):
            if key in raw:
                raw[key] = tuple(raw[key])
        matrix = cls(**raw)
        return matrix.select(**quick_raw) if quick else matrix

    def __post_init__(self) -> None:
        if self.configured_rates is None:
            object.__setattr__(self, "configured_rates", self.rates)
        if not self.entries:
            raise SpecError("a bench config needs entries")
        for w in self.workloads:
            labels = [e.label for e in self.for_workload(w.name)]
            if len(set(labels)) != len(labels):
                raise SpecError(f"workload {w.name}: entry labels must be unique, got {labels}")
        if not all(isinstance(n, int) and n >= 1 for n in self.ranks):
            raise SpecError(f"ranks must be positive integers, got {self.ranks}")
        if not (isinstance(self.repeats, int) and self.repeats >= 1):
            raise SpecError(f"repeats must be a positive integer, got {self.repeats!r}")

    def select(self, workloads: list[str] | None = None, entries: list[str] | None = None,
               rates: list[str] | None = None, ranks: list[int] | None = None,
               epochs: int | None = None, steps_per_epoch: int | None = None,
               probe_steps: int | None = None, timeout_s: float | None = None,
               repeats: int | None = None) -> "Matrix":
        """A smaller matrix: the named workloads and entries only, other rates and ranks, a step
        budget for every workload, another repeat count. Unknown names are an error naming the
        valid ones. Entries that leave out the baseline keep its entry for the probes."""
        for asked, valid, what in ((workloads, [w.name for w in self.workloads], "workload"),
                                   (entries, [e.label for e in self.entries], "entry")):
            unknown = sorted(set(asked or []) - set(valid))
            if unknown:
                raise SpecError(f"unknown {what}(s) {', '.join(unknown)}; valid: {', '.join(dict.fromkeys(valid))}")
        budget = {k: v for k, v in (("epochs", epochs), ("steps_per_epoch", steps_per_epoch),
                                    ("probe_steps", probe_steps)) if v is not None}
        if epochs is not None or steps_per_epoch is not None:
            budget["quality"] = None  # a budget given for every run holds for the quality runs too
        kept = tuple(e for e in self.entries if entries is None or e.label in entries)
        base = next((e for e in self.entries if e.label == self.baseline), None)
        return dataclasses.replace(
            self,
            workloads=tuple(dataclasses.replace(w, **budget) for w in self.workloads
                            if workloads is None or w.name in workloads),
            entries=kept, rates=tuple(rates) if rates else self.rates, ranks=tuple(ranks) if ranks else self.ranks,
            timeout_s=self.timeout_s if timeout_s is None else timeout_s,
            repeats=self.repeats if repeats is None else repeats,
            probe_baseline=self.probe_baseline if base is None or base in kept else base)

    def for_workload(self, name: str) -> list[Entry]:
        return [e for e in self.entries if e.workloads is None or name in e.workloads]

    def probe_entries(self, name: str) -> list[Entry]:
        """What workload ``name``'s probe times: its ``hvdsketch train`` entries, the baseline's
        among them (first, if the selection left it out; none if the config has no baseline)."""
        mine = [e for e in self.for_workload(name) if e.runner == TRAIN]
        base = self.probe_baseline
        return ([base] if base and base.runner == TRAIN and (base.workloads is None or name in base.workloads)
                else []) + mine

    def jobs(self) -> list[Job]:
        """Cell by cell (workload, rate, ranks), in ``repeats`` rounds: each round every entry of the
        cell once, then its probe (on shaped links), so repeats interleave (A B C A B C ...). An
        unshaped run's ``auto`` decides for the cell's first shaped rate (its step times'), a rate
        of the config's where the selection runs none."""
        out = []
        for w in self.workloads:
            for rate in self.rates:
                for n in self.ranks:
                    if not w.runs_in(rate, n):
                        continue
                    shaped = next((r for r in self.configured_rates if r != UNSHAPED and w.runs_in(r, n)), None)
                    link = shaped if rate == UNSHAPED else None
                    for repeat in range(1, self.repeats + 1):
                        out += [Job(w, rate, n, e, repeat, link) for e in self.for_workload(w.name)]
                        if w.probe and rate != UNSHAPED:  # the probe times the link
                            out.append(Job(w, rate, n, None, repeat))
        return out
