"""Residual memory (error feedback) and the memory planner.

``--memory`` says how residuals are kept, as ``--compression`` says how gradients are sent: ``none``,
``fp32``, ``fp16``, ``bf16``, ``topk:ratio=0.1``, ``sketch:ratio=0.1,rows=3``, ``shared``, ``offload``, or
``plan:budget=0.25`` / ``plan:budget_bytes=...`` to let the planner choose a store per tensor within a
budget. Unknown names or options raise :class:`hvdsketch.spec.SpecError` listing the valid ones. Use::

    memory = hvdsketch.memory.create("plan:budget=0.25")
    DistributedOptimizer(..., memory=memory)                 # compensate / update per tensor
    state = memory.state_dict()                              # nested dicts of numpy arrays
    memory.load_state_dict(state)                            # resume bit for bit

For a plan after a warm-up the training code runs itself, use
:func:`~hvdsketch.memory.planner.plan_for_model` and keep it with ``Memory(plan.stores(), default=Nothing())``.
"""
from __future__ import annotations

from hvdsketch import spec as _spec
from hvdsketch.memory.planned import PlannedMemory, PlanSpec
from hvdsketch.memory.planner import DEFAULT_CANDIDATES, Plan, plan_for_model, solve
from hvdsketch.memory.registry import REGISTRY, create_store
from hvdsketch.memory.residual import Memory
from hvdsketch.memory.stores import Bf16, Fp16, Fp32, Nothing, Offload, Shared, Store, TopK
from hvdsketch.memory.warmup import TensorStats, Warmup

#: Everything ``--memory`` accepts: the stores and ``plan``.
FLAGS: dict[str, type] = {**REGISTRY, PlanSpec.name: PlanSpec}


def create(flag: "str | _spec.Spec | Memory | Store") -> Memory:
    """The residual memory a ``--memory`` flag (or one store for every tensor) names; raises
    :class:`hvdsketch.spec.SpecError` naming the valid flags."""
    if isinstance(flag, Memory):
        return flag
    if isinstance(flag, Store):
        return Memory(default=flag, spec=str(flag))
    if not isinstance(flag, (str, _spec.Spec)):
        raise _spec.SpecError(f"memory must be a --memory flag such as 'fp32' or 'plan:budget=0.25' (valid: "
                              f"{', '.join(sorted(FLAGS))}), a Memory or a Store, got {type(flag).__name__}")
    options = _spec.build(flag, FLAGS, kind="residual memory")
    if isinstance(options, PlanSpec):
        return PlannedMemory(options)
    return Memory(default=options, spec=str(options))


__all__ = ["Memory", "PlannedMemory", "PlanSpec", "Plan", "Store", "TensorStats", "Warmup", "REGISTRY", "FLAGS",
           "DEFAULT_CANDIDATES", "create", "create_store", "plan_for_model", "solve",
           "Bf16", "Fp16", "Fp32", "Nothing", "Offload", "Shared", "TopK"]
