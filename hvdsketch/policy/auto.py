"""``auto``: pick each tensor's compressor from a cost model (:mod:`hvdsketch.policy.cost`), measured on the run.

1. Probe the link's latency and bandwidth (:mod:`hvdsketch.policy.probe`), unless ``bandwidth=`` and ``latency=``
   are given.
2. For ``warmup`` dense steps record each gradient's element and unit densities
   (:func:`~hvdsketch.policy.cost.densities`); the ranks agree on them in one allgather.
3. Measure the candidates (:meth:`AutoPolicy.candidates`) on the deciding step's tensors, the slowest rank's
   cost priced with the link.
4. Rank 0 picks the cheapest that beats dense by ``margin``, shares collectives where that makes the step
   cheaper (:meth:`AutoPolicy.share`), broadcasts and prints the table; ``replan=K`` decides again every
   ``K`` steps.

Statistics and decisions travel on a side channel (not counted as gradient bytes); the decision is part of
:meth:`AutoPolicy.state_dict`. Tensors are made on the gradients' device; host syncs happen in observed steps only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar, Sequence

from hvdsketch import spec as _spec
from hvdsketch.collectives import Communicator, reduce, side_channel
from hvdsketch.compress import Compressor, Message, RowSparse, TensorContext, create
from hvdsketch.compress.balanced import Balanced
from hvdsketch.compress.support import Layout, is_passthrough
from hvdsketch.compress.union import Union
from hvdsketch.ops import backend
from hvdsketch.policy.base import Policy, announce
from hvdsketch.policy.cost import (BLOCK, Link, Measurement, balanced_bytes, densities, measure, parse_bandwidth,
                                   parse_latency, shares, step_seconds, union_bytes, values_of)
from hvdsketch.policy.probe import probe
from hvdsketch.policy.table import Assignment

@dataclass(frozen=True)
class AutoOptions:
    """Options of the ``auto`` flag (``auto:bandwidth=1gbit,warmup=5``).

      bandwidth      link bandwidth per rank (``1gbit``, ``100mbit``); default: probed
      latency        seconds one collective costs (``50us``, ``1ms``); default: probed
      warmup         dense steps observed before deciding (default 3)
      replan         decide again every this many steps, from the steps just before (default 0: never)
      powersgd_rank  rank of the PowerSGD candidate (default 4)
      error          relative L2 error target of the sketch candidate (default 0.5)
      headroom       factor on measured densities when sizing top-k and the sketch (default 1.25)
      margin         a compressor must be this fraction faster than dense to be chosen (default 0.1)
    """

    name: ClassVar[str] = "auto"

    bandwidth: str | None = None
    latency: str | None = None
    warmup: int = 3
    replan: int = 0
    powersgd_rank: int = 4
    error: float = 0.5
    headroom: float = 1.25
    margin: float = 0.1

    def __post_init__(self) -> None:
        if self.bandwidth is not None:
            parse_bandwidth(self.bandwidth)
        if self.latency is not None:
            parse_latency(self.latency)
        if self.warmup < 1:
            raise ValueError(f"warmup must be >= 1, got {self.warmup}")
        if self.replan < 0 or 0 < self.replan <= self.warmup:
            raise ValueError(f"replan must be 0 (never) or more than warmup ({self.warmup}), got {self.replan}")
        if self.powersgd_rank < 1:
            raise ValueError(f"powersgd_rank must be >= 1, got {self.powersgd_rank}")
        if not self.error > 0:
            raise ValueError(f"error must be > 0, got {self.error}")
        if self.headroom < 1:
            raise ValueError(f"headroom must be >= 1, got {self.headroom}")
        if not 0 <= self.margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {self.margin}")

    def __str__(self) -> str:
        return _spec.render(self)


def parse(text: "str | _spec.Spec") -> AutoOptions:
    """The options of an ``auto[:key=value,...]`` flag; raises :class:`hvdsketch.spec.SpecError`."""
    return _spec.build(text, {AutoOptions.name: AutoOptions}, kind="policy")


class AutoPolicy(Policy):
    """The ``auto`` policy (see the module's docstring)."""

    #: Makes a compressor of a flag: the candidates', and a checkpoint's decisions.
    create: ClassVar[Callable[[str], Compressor]] = staticmethod(create)
    #: The flag of a row-sparse gradient's exchange until the decision (exact, without densifying it).
    rows_flag: ClassVar[str] = "allgather"

    def __init__(self, options: "AutoOptions | str" = AutoOptions()) -> None:
        self.options = parse(options) if isinstance(options, str) else options
        self._calls = 0
        self._plan_at: int | None = self.options.warmup  # the first step the next decision applies to
        self._link: Link | None = None
        self._side: Communicator | None = None
        self._window: dict[str, tuple[float, float]] = {}  # name -> max (element, unit) density
        self._decision: dict[str, Compressor] = {}
        self._table: list[Assignment] | None = None
        self._none = self.create("none")
        self._rows = self.create(self.rows_flag)

    def __str__(self) -> str:
        return str(self.options)

    @property
    def pending(self) -> bool:
        return self._table is None

    @property
    def assignment(self) -> list[Assignment] | None:
        return self._table

    @property
    def link(self) -> Link | None:
        """The link the cost model prices with (probed or given), once known."""
        return self._link

    def compressor(self, ctx: TensorContext) -> Compressor:
        return self._decision.get(ctx.name) or (self._rows if ctx.row_sparse else self._none)

    @property
    def wants_inputs(self) -> bool:
        """The ``warmup`` steps observed before a decision (the last of them decides)."""
        return self._plan_at is not None and self._calls >= self._plan_at - self.options.warmup

    def end_step(self, inputs: Sequence[tuple[Any, TensorContext]], communicator: Communicator,
                 traced: bool = False) -> None:
        index, self._calls = self._calls, self._calls + 1
        live = [(t, ctx) for t, ctx in inputs if not is_passthrough(t)]
        if not live:
            return
        tensors, contexts = [t for t, _ in live], [ctx for _, ctx in live]
        if self._side is None:
            self._side = side_channel(communicator)
        if self._link is None:
            self._link = self._given_or_probed(values_of(tensors[0]))
        due = self._plan_at is not None and index >= self._plan_at - self.options.warmup
        if due or (traced and self.pending):
            self._observe(tensors, contexts)
        if index == (self._plan_at or 0) - 1 or (traced and self.pending):
            self._decide(tensors, contexts, traced)
            self._plan_at = index + 1 + self.options.replan if self.options.replan else None

    # -- steps of the decision --------------------------------------------------------------------

    def _given_or_probed(self, like: Any) -> Link:
        given = self.options
        if given.bandwidth is not None and given.latency is not None:
            return Link(parse_latency(given.latency), parse_bandwidth(given.bandwidth))
        probed = probe(self._side, like)
        return Link(parse_latency(given.latency) if given.latency else probed.latency,
                    parse_bandwidth(given.bandwidth) if given.bandwidth else probed.bandwidth)

    def _observe(self, tensors: Sequence[Any], contexts: Sequence[TensorContext]) -> None:
        for tensor, ctx in zip(tensors, contexts):
            element, unit = densities(tensor, ctx.shape, BLOCK)
            seen = self._window.get(ctx.name, (0.0, 0.0))
            self._window[ctx.name] = (max(seen[0], element), max(seen[1], unit))

    def candidates(self, shape: Sequence[int], dtype: str, element: float, union: float,
                   traced: bool = False, row_sparse: bool = False) -> list[Compressor]:
        """The compressors worth measuring for a tensor of ``shape`` whose ranks keep at most an ``element``
        fraction non-zero and whose non-zero units add up to at most a ``union`` fraction; ``traced``: only
        those that work inside ``tf.function``; ``row_sparse``: the gradient comes as rows."""
        numel = math.prod(shape)
        found = [self._none]
        if dtype in ("float32", "float64"):
            found.append(create("fp16"))
        if not traced:  # on a dense tensor only sharing the step's collectives can make it pay (share)
            found += [create("allgather")] + ([create("union"), create("balanced")] if union < 1 else [])
        ratio = _round_up(max(element * self.options.headroom, 1 / numel))
        if ratio < 1 and not (row_sparse and not traced):
            found.append(create(f"topk:ratio={ratio}"))
        units = math.ceil(numel / BLOCK) if len(shape) < 2 else shape[0]
        density = _round_up(min(1.0, max(union * self.options.headroom, 1 / units)))
        sketch = create(f"sketch:density={density},error={self.options.error}")
        if sketch.plan(shape) is not None:
            found.append(sketch)
        powersgd = create(f"powersgd:rank={self.options.powersgd_rank}")
        if (powersgd.traceable() or not traced) and powersgd.matrix(shape) is not None:
            found.append(powersgd)
        return found

    def _decide(self, tensors: Sequence[Any], contexts: Sequence[TensorContext], traced: bool) -> None:
        side, link = self._side, self._link
        ops = backend(values_of(tensors[0]))
        stats = [x for ctx in contexts for x in self._window.get(ctx.name, (1.0, 1.0))]
        like = values_of(tensors[0])
        (gathered,) = reduce(side, [Message(ops.constant(stats, "float64", like), "allgather")], "hvdsketch.auto.stats")
        # every rank reduces the same gathered numbers in the same order: the same candidates everywhere
        per_rank = ops.to_numpy(gathered).reshape(side.size, len(contexts), 2)
        element, union, touched = per_rank[..., 0].max(axis=0), per_rank[..., 1].sum(axis=0), per_rank[..., 1].mean(axis=0)
        options = [self.candidates(ctx.shape, ops.dtype_name(values_of(t)), float(e), float(u), traced,
                                   isinstance(t, RowSparse)) for t, ctx, e, u in zip(tensors, contexts, element, union)]
        ring_bor = getattr(side, "ring_bor", False)
        seen = union if traced else measured_union(side, tensors, contexts, union)
        local = [[self._measure(c, t, ctx, float(u), float(z), ring_bor=ring_bor) for c in cands]
                 for t, ctx, cands, u, z in zip(tensors, contexts, options, seen, touched)]
        flat = [link.latency, 1 / link.bandwidth] + [x for ms in local for m in ms for x in (m.compute, m.wire)]
        (worst,) = reduce(side, [Message(ops.constant(flat, "float64", like), "max")], "hvdsketch.auto.costs")
        worst = [float(x) for x in ops.to_numpy(worst)]
        self._link = link = Link(worst[0], 1 / worst[1] if worst[1] else math.inf)
        pairs = iter(zip(worst[2::2], worst[3::2]))
        measured = [[replace(m, compute=c, wire=int(w)) for m, (c, w) in zip(ms, pairs)] for ms in local]
        choice = self.share(measured, [self.choose(ms, link) for ms in measured], link)
        (gathered,) = reduce(side, [Message(ops.constant(choice, "int64", like), "allgather")], "hvdsketch.auto.choice")
        choice = [int(x) for x in ops.to_numpy(gathered)[:len(choice)]]  # rank 0's
        self._window = {}
        self._decision = {ctx.name: cands[k] for ctx, cands, k in zip(contexts, options, choice)}
        seconds = shares([ms[k] for ms, k in zip(measured, choice)], link)  # the step's, tensor by tensor
        dense_seconds = shares([ms[0] for ms in measured], link)
        self._table = [Assignment(ctx.name, tuple(ctx.shape), float(e), str(cands[k]), ms[k].wire, ms[0].wire, t, d)
                       for ctx, e, cands, ms, k, t, d in zip(contexts, element, options, measured, choice, seconds,
                                                              dense_seconds)]
        announce(self._table, f"hvdsketch auto: {side.size} ranks, link {link.bandwidth * 8 / 1e9:.3g} Gbit/s, "
                              f"latency {link.latency * 1e3:.3g} ms (decided after step {self._calls - 1})", side)

    @staticmethod
    def _measure(compressor: Compressor, tensor: Any, ctx: TensorContext, union: float, touched: float | None = None,
                 ring_bor: bool = False) -> Measurement:
        """The candidate measured on this rank; ``union``'s and ``balanced``'s bytes from the ranks' ``union``
        (a fraction of units) and mean unit density ``touched`` (default: ``union``'s share of a rank)."""
        measured = measure(compressor, tensor, ctx, ring_bor=ring_bor)
        if not isinstance(compressor, (Union, Balanced)):
            return measured
        values = values_of(tensor)
        itemsize = backend(values).nbytes(values) // max(1, math.prod(backend(values).shape(values)))
        all_units = ctx.shape[0] if len(ctx.shape) > 1 else math.ceil(math.prod(ctx.shape) / BLOCK)
        units = min(1.0, union) * all_units
        wire = (union_bytes(ctx.shape, itemsize, units, ctx.world_size, compressor.block, ring_bor)
                if isinstance(compressor, Union) else
                int(balanced_bytes(all_units, itemsize * math.prod(ctx.shape) // all_units,
                                   (union / ctx.world_size if touched is None else touched) * all_units, units,
                                   ctx.world_size)))
        return replace(measured, wire=wire)

    def choose(self, measured: Sequence[Measurement], link: Link) -> int:
        """The cheapest candidate (index into ``measured``; 0 is ``none``), if it beats dense by the margin."""
        costs = [m.seconds(link) for m in measured]
        best = min(range(len(costs)), key=costs.__getitem__)
        return best if costs[best] < (1 - self.options.margin) * costs[0] else 0

    def share(self, measured: Sequence[Sequence[Measurement]], choice: Sequence[int], link: Link) -> list[int]:
        """``choice`` (an index into each tensor's ``measured``) with collectives shared where that makes the
        step cheaper (:func:`~hvdsketch.policy.cost.step_seconds`): every tensor in one collective moves to its
        cheapest candidate outside it (:meth:`_without`), kept if the step's seconds fall by more than
        ``margin`` of the moved tensors' dense seconds; again until no collective can go."""
        choice = list(choice)
        while True:
            chosen = [ms[k] for ms, k in zip(measured, choice)]
            trials = (self._without(key, measured, choice, link)
                      for key in sorted(frozenset().union(*(m.collectives for m in chosen))))
            better = next((trial for trial, moved in filter(None, trials)
                           if step_seconds(chosen, link) - step_seconds([ms[k] for ms, k in zip(measured, trial)], link)
                           > self.options.margin * sum(measured[i][0].seconds(link) for i in moved)), None)
            if better is None:
                return choice
            choice = better

    @staticmethod
    def _without(key: tuple[int, str, str], measured: Sequence[Sequence[Measurement]], choice: Sequence[int],
                 link: Link) -> tuple[list[int], list[int]] | None:
        """``choice`` with every tensor in the collective ``key`` moved to its cheapest candidate outside it, and
        the moved tensors; ``None`` where one of them has no candidate outside it."""
        chosen = [ms[k] for ms, k in zip(measured, choice)]
        moved = [i for i, m in enumerate(chosen) if key in m.collectives]
        free = frozenset().union(*(m.collectives for i, m in enumerate(chosen) if i not in moved))
        trial = list(choice)
        for i in moved:
            outside = [k for k, m in enumerate(measured[i]) if key not in m.collectives]
            if not outside:
                return None
            trial[i] = min(outside, key=lambda k, ms=measured[i]: step_seconds([ms[k]], link)
                           - len(ms[k].collectives & free) * link.latency)
        return trial, moved

    # -- checkpoints ------------------------------------------------------------------------------

    def compressors(self) -> dict[str, Compressor]:
        return {str(c): c for c in [self._none, self._rows, *self._decision.values()]}

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self._calls, "plan_at": self._plan_at,
                "link": None if self._link is None else [self._link.latency, self._link.bandwidth],
                "window": {k: list(v) for k, v in self._window.items()},
                "decision": {name: str(c) for name, c in self._decision.items()},
                "table": None if self._table is None else [row.to_dict() for row in self._table]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._calls, self._plan_at = state["calls"], state["plan_at"]
        self._link = None if state["link"] is None else Link(*state["link"])
        self._window = {k: tuple(v) for k, v in state["window"].items()}
        self._decision = {name: self.create(text) for name, text in state["decision"].items()}
        self._table = (None if state["table"] is None else
                       [Assignment(**{**row, "shape": tuple(row["shape"])}) for row in state["table"]])


def measured_union(side: Communicator, tensors: Sequence[Any], contexts: Sequence[TensorContext],
                   bound: Sequence[float]) -> list[float]:
    """Each tensor's union of the ranks' non-zero units (a fraction of its units): the ranks' bitmaps OR-ed over
    ``side`` in one collective where ``bound`` (the sum of their unit densities) is under 1, else ``bound``.
    Collective: every rank passes the same ``bound``."""
    sparse = [i for i, u in enumerate(bound) if u < 1]
    out = [float(u) for u in bound]
    if not sparse:
        return out
    probe = Union(block=BLOCK)
    reduced = reduce(side, [probe.compress(tensors[i], contexts[i])[0][0] for i in sparse], "hvdsketch.auto.union")
    for i, bits in zip(sparse, reduced):
        units = backend(bits).shape(probe.decompress([bits], None, contexts[i]))[0]
        out[i] = units / Layout.of(contexts[i].shape, BLOCK).units
    return out


def _round_up(x: float, grid: float = 1e-4) -> float:
    """``x`` rounded up to ``grid`` (a short flag that never undersizes), at most 1."""
    return min(1.0, round(math.ceil(x / grid - 1e-9) * grid, 10))
