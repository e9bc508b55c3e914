"""The memory planner: a residual store per tensor that loses the least within a memory budget.

After Zhao et al. (IEEE Access 9, 2021) and ConEF (Li et al., 2023): given warm-up statistics
(:mod:`hvdsketch.memory.warmup`) of each candidate store's bytes ``b_is``, accumulated lost energy
``L_is = ||sum_t (e_t - Q(e_t))||^2 / T`` and time per step ``t_is``, choose a store ``s_i`` per tensor::

    minimise    sum_i L_{i,s_i} / E  +  w * sum_i t_{i,s_i}      (E: what no error feedback loses)
    subject to  sum_i b_{i,s_i} <= B                              (ties: less time)

a multiple-choice knapsack. Tensors of one shape form one class whose options are ``shared`` plus the
Pareto frontier of their independent choices. It is solved exactly by a dynamic programme over the
budget cut into ``R`` units (an option of ``b`` bytes costs ``ceil(b R / B)`` units, so fitting units
means fitting bytes), then a greedy pass spends the spare bytes on the upgrades of best value per byte,
never passing ``B``. A budget of the full fp32 bytes gives full fp32 error feedback.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from hvdsketch.memory.registry import create_store
from hvdsketch.memory.stores import Fp32, Shared, Store, numel
from hvdsketch.memory.warmup import TensorStats, Warmup

#: Stores the planner chooses from unless told otherwise; ``sketch`` (slow to warm up, and under-rated by
#: one round trip) is measured only when added.
DEFAULT_CANDIDATES = ("none", "fp32", "fp16", "bf16", "topk:ratio=0.01", "topk:ratio=0.03", "topk:ratio=0.1",
                      "shared", "offload")
#: Objective values this close are equal (then the faster option wins).
TOLERANCE = 1e-12


@dataclass(frozen=True)
class Entry:
    """One tensor's store in a plan, with its warm-up statistics per step."""

    name: str
    shape: tuple[int, ...]
    store: str
    energy: float   # what no error feedback loses: ||sum_t e_t||^2 / T
    lost: float     # what this store loses: ||sum_t (e_t - Q(e_t))||^2 / T
    seconds: float  # estimated store time per step


@dataclass(frozen=True)
class Plan:
    """A store for every tensor; the residual bytes it needs against the budget."""

    budget_bytes: int
    entries: tuple[Entry, ...]

    def stores(self) -> dict[str, Store]:
        return {e.name: create_store(e.store) for e in self.entries}

    def slots(self) -> dict[str, tuple[Store, tuple[int, ...], list[str]]]:
        """Each residual slot: its store, shape and the tensors kept in it (several when shared)."""
        slots: dict[str, tuple[Store, tuple[int, ...], list[str]]] = {}
        for name, store in self.stores().items():
            shape = self.entry(name).shape
            slots.setdefault(store.slot(name, shape), (store, shape, []))[2].append(name)
        return slots

    def entry(self, name: str) -> Entry:
        return next(e for e in self.entries if e.name == name)

    def _bytes(self, host: bool) -> int:
        return sum(store.nbytes(shape) for store, shape, _ in self.slots().values() if store.host == host)

    @property
    def planned_bytes(self) -> int:
        """Residual bytes on the tensors' device: what the budget bounds."""
        return self._bytes(host=False)

    @property
    def host_bytes(self) -> int:
        """Residual bytes offloaded to host memory."""
        return self._bytes(host=True)

    @property
    def full_bytes(self) -> int:
        """Bytes of full fp32 error feedback for the same tensors."""
        return sum(Fp32().nbytes(e.shape) for e in self.entries)

    @property
    def lost_fraction(self) -> float:
        """The plan's lost energy as a share of what no error feedback loses (0 = full fp32)."""
        energy = sum(e.energy for e in self.entries)
        return sum(e.lost for e in self.entries) / energy if energy > 0 else 0.0

    def table(self) -> str:
        """The plan as a text table with a summary against full fp32 error feedback."""
        share = {name: store.nbytes(shape) / len(names)
                 for store, shape, names in self.slots().values() for name in names}
        rows = [("tensor", "shape", "store", "bytes", "of fp32", "lost", "us/step")]
        for e in self.entries:
            rows.append((e.name, "x".join(map(str, e.shape)) or "scalar", e.store, _size(share[e.name]),
                         f"{share[e.name] / max(Fp32().nbytes(e.shape), 1):.1%}",
                         f"{e.lost / e.energy:.2%}" if e.energy > 0 else "-", f"{e.seconds * 1e6:.0f}"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                 for r in rows]
        full = self.full_bytes
        lines += ["", f"residual memory: {_size(self.planned_bytes)} on device"
                      f"{f' + {_size(self.host_bytes)} offloaded to host' if self.host_bytes else ''}"
                      f" vs {_size(full)} for full fp32 error feedback"
                      f" ({self.planned_bytes / max(full, 1):.1%}, saves {_size(full - self.planned_bytes)});"
                      f" budget {_size(self.budget_bytes)} ({self.budget_bytes / max(full, 1):.1%})",
                  f"lost residual energy: {self.lost_fraction:.2%} of what no error feedback loses "
                  f"(full fp32: 0%)"]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget_bytes, "planned_bytes": self.planned_bytes,
                "host_bytes": self.host_bytes, "full_fp32_bytes": self.full_bytes,
                "lost_fraction": self.lost_fraction, "tensors": [asdict(e) for e in self.entries]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Plan":
        return cls(int(data["budget_bytes"]),
                   tuple(Entry(**{**e, "shape": tuple(e["shape"])}) for e in data["tensors"]))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            f.write(self.to_json() + "\n")


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError


def budget_bytes_of(full_bytes: int, fraction: float | None, nbytes: int | None) -> int:
    """The budget in bytes from exactly one of a fraction of ``full_bytes`` or a byte count."""
    if (fraction is None) == (nbytes is None):
        raise ValueError("give the memory budget as exactly one of budget (a fraction of full fp32 "
                         "error feedback, e.g. 0.25) or budget_bytes")
    if fraction is not None:
        if not fraction >= 0:
            raise ValueError(f"budget must be a fraction >= 0, got {fraction}")
        return math.floor(fraction * full_bytes)
    if nbytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {nbytes}")
    return nbytes


# -- the knapsack -------------------------------------------------------------

@dataclass(frozen=True)
class _Option:
    """One way to keep a class's residuals: exact bytes, objective value, seconds, entries."""

    bytes: int
    value: float
    seconds: float
    entries: tuple[Entry, ...]


def _lex_less(a: _Option, b: _Option) -> bool:
    return a.value < b.value - TOLERANCE or (a.value <= b.value + TOLERANCE and a.seconds < b.seconds)


def _pareto(options: Iterable[_Option]) -> list[_Option]:
    """Drop every option that a no larger option matches or beats."""
    kept: list[_Option] = []
    for option in sorted(options, key=lambda o: (o.bytes, o.value, o.seconds)):
        if not kept or _lex_less(option, kept[-1]):
            kept.append(option)
    return kept


class _Table:
    """The DP ``F_c(r)`` over classes of options, for every budget ``r <= capacity`` units."""

    def __init__(self, classes: Sequence[Sequence[_Option]], capacity: int, units: Callable[[int], int]) -> None:
        value, seconds = np.zeros(capacity + 1), np.zeros(capacity + 1)
        self.steps: list[tuple[np.ndarray, list[int]]] = []
        for options in classes:
            costs = [units(o.bytes) for o in options]
            best_val, best_sec = np.full(capacity + 1, np.inf), np.full(capacity + 1, np.inf)
            pick = np.zeros(capacity + 1, dtype=np.int64)
            for j, (option, cost) in enumerate(zip(options, costs)):
                if cost > capacity:
                    continue
                val, sec = np.full(capacity + 1, np.inf), np.full(capacity + 1, np.inf)
                val[cost:] = value[:capacity + 1 - cost] + option.value
                sec[cost:] = seconds[:capacity + 1 - cost] + option.seconds
                better = (val < best_val - TOLERANCE) | ((val <= best_val + TOLERANCE) & (sec < best_sec))
                best_val, best_sec = np.where(better, val, best_val), np.where(better, sec, best_sec)
                pick[better] = j
            value, seconds = best_val, best_sec
            self.steps.append((pick, costs))
        self.value, self.seconds = value, seconds

    def choose(self, budget: int) -> list[int]:
        """The option index of each class in the optimum within ``budget`` units."""
        picks = []
        for pick, costs in reversed(self.steps):
            picks.append(int(pick[budget]))
            budget -= costs[picks[-1]]
        return picks[::-1]


def _combine(options: Sequence[_Option]) -> _Option:
    return _Option(sum(o.bytes for o in options), sum(o.value for o in options),
                   sum(o.seconds for o in options), tuple(e for o in options for e in o.entries))


def _frontier(members: Sequence[Sequence[_Option]], capacity: int, units: Callable[[int], int]) -> list[_Option]:
    """The Pareto frontier of the members' independent choices, one option per budget where it improves."""
    table = _Table(members, capacity, units)
    frontier = []
    for r in range(capacity + 1):
        if np.isfinite(table.value[r]) and (r == 0 or table.value[r] < table.value[r - 1] - TOLERANCE or (
                table.value[r] <= table.value[r - 1] + TOLERANCE and table.seconds[r] < table.seconds[r - 1])):
            frontier.append(_combine([options[j] for options, j in zip(members, table.choose(r))]))
    return frontier


def _spend(classes: Sequence[Sequence[_Option]], chosen: list[int], budget: int) -> list[int]:
    """Greedy pass on exact bytes: apply the fitting upgrade of best value per extra byte until none fits."""
    spare = budget - sum(options[j].bytes for options, j in zip(classes, chosen))
    while True:
        best: tuple[float, int, int, int] | None = None
        for c, options in enumerate(classes):
            current = options[chosen[c]]
            for j, option in enumerate(options):
                extra = option.bytes - current.bytes
                if extra > spare or not _lex_less(option, current):
                    continue
                gain = (current.value - option.value) / extra if extra > 0 else math.inf
                if best is None or gain > best[0]:
                    best = (gain, c, j, extra)
        if best is None:
            return chosen
        _, c, j, extra = best
        chosen[c], spare = j, spare - extra


# -- planning -----------------------------------------------------------------

def solve(stats: Mapping[str, TensorStats], budget: int, candidates: Sequence["Store | str"] = DEFAULT_CANDIDATES,
          time_weight: float = 0.0, resolution: int = 4096) -> Plan:
    """The plan of least lost residual energy within ``budget`` bytes (see the module docstring).

    Args:
        stats: warm-up statistics per tensor name, in model order.
        budget: bytes of residual state allowed on the tensors' device.
        candidates: the stores to choose from (flags or stores). ``offload`` is
            offered only for tensors on an accelerator: on the host it saves nothing.
        time_weight: objective weight of one second of store time per step, in units
            of what no error feedback loses (0: time only breaks ties).
        resolution: budget units of the dynamic programme.
    """
    stores = [create_store(c) if isinstance(c, str) else c for c in candidates]
    if not stores:
        raise ValueError("the planner needs at least one candidate store")
    if budget < 0 or resolution < 1 or time_weight < 0:
        raise ValueError("budget, time_weight must be >= 0 and resolution >= 1")
    shared = next((s for s in stores if isinstance(s, Shared)), None)
    elements = sum(numel(st.shape) * st.steps for st in stats.values())
    rate = {str(s): sum(st.seconds.get(str(s), 0.0) for st in stats.values()) / max(elements, 1) for s in stores}
    total = sum(st.energy() for st in stats.values()) or 1.0

    def option(entries: tuple[Entry, ...], nbytes: int) -> _Option:
        seconds = sum(e.seconds for e in entries)
        return _Option(nbytes, sum(e.lost for e in entries) / total + time_weight * seconds, seconds, entries)

    def singles(name: str, st: TensorStats) -> list[_Option]:
        return _pareto(option((Entry(name, st.shape, str(s), st.energy(), st.lost_energy(s),
                                     rate[str(s)] * numel(st.shape)),), 0 if s.host else s.nbytes(st.shape))
                       for s in stores if s is not shared and not (s.host and st.on_host))

    units = _units(budget, resolution)
    classes: list[list[_Option]] = []
    for shape, names in _groups(stats, by_shape=shared is not None):
        members = [singles(name, stats[name]) for name in names]
        if len(names) == 1:
            classes.append(members[0])
            continue
        entries = _shared_entries(shared, names, stats, rate[str(shared)])
        # up to R + k units: rounding adds < 1 unit per member, so the members' best choice is there
        frontier = _frontier(members, resolution + len(names), units)
        classes.append(_pareto(frontier + [option(entries, shared.nbytes(shape))]))
    if any(not options for options in classes):
        raise ValueError("no candidate store applies to some tensor (offload alone on a host-only model?)")
    table = _Table(classes, resolution, units)
    if np.isfinite(table.value[resolution]):
        chosen = table.choose(resolution)
    else:  # no choice fits in rounded units; start from the cheapest if it fits in bytes
        chosen = [min(range(len(options)), key=lambda j: (options[j].bytes, options[j].value)) for options in classes]
        cheapest = sum(options[j].bytes for options, j in zip(classes, chosen))
        if cheapest > budget:
            raise ValueError(f"a residual-memory budget of {budget} bytes is below the smallest plan the "
                             f"candidates allow ({cheapest} bytes); raise the budget or add 'none' to the candidates")
    chosen = _spend(classes, chosen, budget)
    picked = {e.name: e for options, j in zip(classes, chosen) for e in options[j].entries}
    return Plan(budget, tuple(picked[name] for name in stats))


def _units(budget: int, resolution: int) -> Callable[[int], int]:
    """Bytes to budget units, rounded up, so fitting units means fitting bytes."""
    def units(nbytes: int) -> int:
        if nbytes == 0:
            return 0
        return -(-nbytes * resolution // budget) if budget > 0 else resolution + 1
    return units


def _groups(stats: Mapping[str, TensorStats], by_shape: bool) -> list[tuple[tuple[int, ...], list[str]]]:
    """Tensors grouped by shape if ``by_shape``, else each alone, in model order."""
    groups: dict[Any, tuple[tuple[int, ...], list[str]]] = {}
    for name, st in stats.items():
        groups.setdefault(st.shape if by_shape else name, (st.shape, []))[1].append(name)
    return list(groups.values())


def _shared_entries(shared: Store, names: Sequence[str], stats: Mapping[str, TensorStats],
                    rate: float) -> tuple[Entry, ...]:
    """Entries of a group sharing one buffer: each step the largest residual keeps it, the others lose theirs."""
    steps = min(stats[n].steps for n in names)
    owner = np.array([stats[n].energies[:steps] for n in names]).reshape(len(names), steps).argmax(axis=0)
    return tuple(Entry(n, stats[n].shape, str(shared), stats[n].energy(), stats[n].lost_unless(owner == i),
                       rate * numel(stats[n].shape)) for i, n in enumerate(names))


def plan_for_model(named_shapes: Mapping[str, Sequence[int]], warmup_residuals: Mapping[str, Sequence[Any]],
                   budget: float | None = None, *, budget_bytes: int | None = None,
                   candidates: Sequence["Store | str"] = DEFAULT_CANDIDATES, time_weight: float = 0.0,
                   resolution: int = 4096) -> Plan:
    """Plan a model's residual memory from residuals observed during a warm-up.

    Args:
        named_shapes: every tensor's name and shape, in model order.
        warmup_residuals: for every tensor, its residuals ``e_t`` of a few warm-up
            steps with full error feedback (any back-end; kept where they are).
        budget: the budget as a fraction of full fp32 error feedback (``0.25``) ...
        budget_bytes: ... or in bytes (give exactly one).
        candidates, time_weight, resolution: see :func:`solve`.
    """
    shapes = {name: tuple(int(d) for d in shape) for name, shape in named_shapes.items()}
    missing = [name for name in shapes if not warmup_residuals.get(name)]
    unknown = [name for name in warmup_residuals if name not in shapes]
    if missing or unknown:
        raise ValueError(f"warm-up residuals must cover exactly the model's tensors; "
                         f"missing: {missing[:5]}, unknown: {unknown[:5]}")
    warmup = Warmup([create_store(c) if isinstance(c, str) else c for c in candidates])
    warmup.observe_all({name: warmup_residuals[name] for name in shapes})
    for name, st in warmup.stats.items():
        if st.shape != shapes[name]:
            raise ValueError(f"warm-up residual of {name!r} has shape {st.shape}, the model says {shapes[name]}")
    full = sum(Fp32().nbytes(shape) for shape in shapes.values())
    return solve(warmup.stats, budget_bytes_of(full, budget, budget_bytes), warmup.candidates,
                 time_weight, resolution)
