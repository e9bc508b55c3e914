"""``--memory plan:budget=0.25``: warm up with full error feedback, then keep the planner's stores.

For the first ``warmup`` steps every residual is kept in fp32 and observed by
:class:`~hvdsketch.memory.warmup.Warmup`; then the planner picks a store per tensor within the budget and every
fp32 residual moves into its store, so nothing is lost at the switch. Tensors first seen after it get no error
feedback. The warm-up statistics, or the plan, are part of :meth:`PlannedMemory.state_dict`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

from hvdsketch.compress.support import RowSparse
from hvdsketch.memory.planner import DEFAULT_CANDIDATES, Plan, budget_bytes_of, solve
from hvdsketch.memory.registry import create_store
from hvdsketch.memory.residual import Memory
from hvdsketch.memory.stores import Fp32, Nothing, Store
from hvdsketch.spec import render
from hvdsketch.memory.warmup import Warmup
from hvdsketch.ops import backend


@dataclass(frozen=True)
class PlanSpec:
    """Options of the ``plan`` memory flag.

    Options (flag ``plan:key=value,...``, give exactly one budget):
      budget        residual memory as a fraction of full fp32 error feedback (4 bytes per element)
      budget_bytes  residual memory in bytes
      warmup        steps of full error feedback observed before planning (default 10)
      time_weight   objective weight of one second of store time per step, in units of the
                    total residual energy (default 0: time only breaks ties)
    """

    name: ClassVar[str] = "plan"

    budget: float | None = None
    budget_bytes: int | None = None
    warmup: int = 10
    time_weight: float = 0.0

    def __post_init__(self) -> None:
        budget_bytes_of(0, self.budget, self.budget_bytes)  # exactly one budget, not negative
        if self.warmup < 1:
            raise ValueError("warmup must be >= 1")
        if self.time_weight < 0:
            raise ValueError("time_weight must be >= 0")

    def __str__(self) -> str:
        return render(self)


class PlannedMemory(Memory):
    """Full error feedback during a warm-up, then the planner's store for every tensor."""

    def __init__(self, spec: PlanSpec, candidates: Sequence["Store | str"] = DEFAULT_CANDIDATES) -> None:
        super().__init__(default=Fp32(), spec=str(spec))
        self.options = spec
        self.warmup = Warmup([create_store(c) if isinstance(c, str) else c for c in candidates])
        self.plan: Plan | None = None

    def compensate(self, name: str, tensor: Any) -> Any:
        if self.plan is None and self._warm():
            self._switch(tensor)
        return super().compensate(name, tensor)

    def keeps(self, name: str) -> bool:
        return self.plan is None or super().keeps(name)

    def traceable(self) -> bool:
        """No: the warm-up observes residuals in Python, and the plan then changes their stores."""
        return False

    def takes_rows(self, name: str) -> bool:
        return self.plan is not None and super().takes_rows(name)

    def update(self, name: str, residual: Any) -> None:
        if self.plan is not None:
            return super().update(name, residual)
        if isinstance(residual, RowSparse):  # the warm-up observes dense residuals
            residual = residual.to_dense()
        self.warmup.observe(name, residual)
        self.put(backend(residual), name, self.default, residual)

    def _warm(self) -> bool:
        stats = self.warmup.stats.values()
        return bool(stats) and min(st.steps for st in stats) >= self.options.warmup

    def make_plan(self) -> Plan:
        """The plan for the tensors observed so far, within this memory's budget."""
        stats = self.warmup.stats
        full = sum(Fp32().nbytes(st.shape) for st in stats.values())
        return solve(stats, budget_bytes_of(full, self.options.budget, self.options.budget_bytes),
                     self.warmup.candidates, self.options.time_weight)

    def _switch(self, like: Any) -> None:
        """Plan, then move every fp32 residual into its planned store."""
        self.plan = self.make_plan()
        self.warmup.stats = {}  # the plan holds what is needed from here on
        ops = backend(like)
        residuals = {name: self._get(ops, name, name, Fp32(), like) for name in [*self._state, *self._loaded]}
        self._state.clear()
        self._slot_store.clear()
        self.stores, self.default = self.plan.stores(), Nothing()
        for name, state in residuals.items():
            if state is not None and self.store(name).keeps:
                self.put(backend(state["e"]), name, self.store(name), state["e"])

    def state_dict(self, residuals: bool = True) -> dict[str, Any]:
        state = super().state_dict(residuals)
        if self.plan is None:
            state["warmup"] = self.warmup.state_dict()
        else:
            state["plan"] = self.plan.to_json()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.warmup.load_state_dict(state.get("warmup", {}))
        self.plan = Plan.from_dict(json.loads(str(state["plan"]))) if "plan" in state else None
