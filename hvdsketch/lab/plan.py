"""``hvdsketch plan``: show the residual-memory plan for a model without training it.

Two ways to describe the model:

``--config configs/X.yaml``
    the YAML keys ``workload``, ``compression`` and ``memory`` (others are
    training's and ignored here). The workload's model is built and its real
    gradients on ``--steps`` real training batches, at the initial weights, go
    through the configured compressor in one process with full fp32 error
    feedback; the residuals of those steps are the warm-up statistics. The
    budget comes from ``memory: plan:budget=...`` unless ``--budget`` or
    ``--budget-bytes`` is given.

``--shapes 30000x256,256x1024,1024``
    a demo on SYNTHETIC residuals: heavy-tailed (Student-t, 2 degrees of
    freedom) with a random scale per tensor. They show how the planner works,
    not what a real model needs.

The plan is printed as a table with its bytes against full fp32 error
feedback; ``--json PATH`` writes it as JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from hvdsketch import spec
from hvdsketch.memory.planned import PlannedMemory, PlanSpec
from hvdsketch.memory.planner import DEFAULT_CANDIDATES, Plan, plan_for_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--config", help="YAML config with keys workload, compression, memory")
    model.add_argument("--shapes", help="demo on synthetic residuals: tensor shapes, e.g. 30000x256,256x1024,1024")
    parser.add_argument("--compression", help="the compressor whose residuals to plan (default: the config's)")
    parser.add_argument("--budget", type=float, help="residual memory as a fraction of full fp32 error feedback")
    parser.add_argument("--budget-bytes", type=int, help="residual memory in bytes")
    parser.add_argument("--steps", type=int, default=3, help="warm-up steps observed (default 3)")
    parser.add_argument("--candidate", action="append", dest="candidates", metavar="STORE",
                        help=f"a store to choose from (repeat; default: {' '.join(DEFAULT_CANDIDATES)})")
    parser.add_argument("--time-weight", type=float, default=0.0,
                        help="weight of one second of store time per step against the total residual energy")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic residuals (--shapes)")
    parser.add_argument("--json", help="write the plan as JSON to this path")


def parse_shapes(text: str) -> dict[str, tuple[int, ...]]:
    """``"30000x256,1024"`` -> ``{"t0": (30000, 256), "t1": (1024,)}``."""
    shapes = {}
    for i, item in enumerate(filter(None, (part.strip() for part in text.split(",")))):
        try:
            shape = tuple(int(d) for d in item.lower().split("x"))
        except ValueError:
            raise ValueError(f"bad shape {item!r} in --shapes: expected sizes joined by x, e.g. 256x1024") from None
        if not shape or min(shape) < 1:
            raise ValueError(f"bad shape {item!r} in --shapes: every size must be >= 1")
        shapes[f"t{i}"] = shape
    if not shapes:
        raise ValueError("--shapes names no tensor")
    return shapes


def synthetic_residuals(shapes: Mapping[str, tuple[int, ...]], steps: int, seed: int) -> dict[str, list[np.ndarray]]:
    """SYNTHETIC warm-up residuals: Student-t (df 2) entries, a log-uniform scale per tensor."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        scale = 10.0 ** rng.uniform(-3, 0)
        out[name] = [(scale * rng.standard_t(2, size=shape)).astype(np.float32) for _ in range(steps)]
    return out


def _config(path: str) -> dict[str, Any]:
    import yaml

    raw = yaml.safe_load(Path(path).read_text())
    if not isinstance(raw, dict) or "workload" not in raw:
        raise spec.SpecError(f"{path}: a config must be a mapping with at least 'workload: NAME'")
    return raw


def _gradients(workload: Any, steps: int) -> Iterator[dict[str, Any]]:
    """The model's dense gradients on ``steps`` real training batches, at the initial weights."""
    model = workload.build_model()
    batches = workload.train_batches(0)
    if hasattr(model, "named_parameters"):  # PyTorch
        for _, batch in zip(range(steps), batches):
            model.zero_grad()
            workload.loss(model, batch).backward()
            yield {name: p.grad.to_dense() if p.grad.is_sparse else p.grad.clone()
                   for name, p in model.named_parameters() if p.grad is not None}
    else:  # tf-keras
        import tensorflow as tf

        for _, batch in zip(range(steps), batches):
            with tf.GradientTape() as tape:
                loss = workload.loss(model, batch)
            grads = tape.gradient(loss, model.trainable_variables)
            yield {v.name: tf.convert_to_tensor(g) for v, g in zip(model.trainable_variables, grads) if g is not None}


def _observe(compressor: Any, gradients: Iterator[dict[str, Any]], memory: PlannedMemory) -> None:
    """Run every gradient's exchange on one rank with ``memory`` observing the residuals."""
    from hvdsketch.compress import TensorContext
    from hvdsketch.exchange.flight import run_local
    from hvdsketch.compress.state import StateTable
    from hvdsketch.ops import backend

    states = StateTable()  # each tensor's compressor state, step to step, as the exchanger keeps it
    for step, grads in enumerate(gradients):
        for name, grad in grads.items():
            run_local(compressor, grad, TensorContext(name, backend(grad).shape(grad), step, world_size=1), memory,
                      states)


def plan_from_config(path: str, steps: int, budget: float | None, budget_bytes: int | None,
                     candidates: Any, time_weight: float, compression: str | None = None) -> Plan:
    """The plan for a config's workload and compressor (or ``compression``) from real warm-up
    gradients (one process)."""
    from hvdsketch.compress import create as create_compressor
    from hvdsketch.memory import FLAGS
    from hvdsketch.lab.workloads import get

    raw = _config(path)
    if budget is None and budget_bytes is None:
        options = spec.build(str(raw.get("memory") or "none"), FLAGS, kind="residual memory")
        if not isinstance(options, PlanSpec):
            raise spec.SpecError(f"{path}: memory is {options}, not plan:budget=...; give --budget or --budget-bytes")
        options = dataclasses.replace(options, warmup=steps)
    else:
        options = PlanSpec(budget, budget_bytes, steps, time_weight)
    flag = spec.resolve(None, compression, raw)
    if not isinstance(flag, str) or spec.Spec.parse(flag).name == "auto":
        raise spec.SpecError(f"hvdsketch plan plans the residuals of one compressor; {path}'s compression "
                             f"({flag}) chooses one per tensor while training: give --compression, e.g. "
                             f"--compression topk:ratio=0.01")
    compressor = create_compressor(flag)
    memory = PlannedMemory(options, candidates)
    _observe(compressor, _gradients(get(str(raw["workload"])), steps), memory)
    print(f"warm-up: {steps} steps of {raw['workload']} with compression {compressor} "
          f"and full fp32 error feedback (one process, initial weights)")
    return memory.make_plan()


def run(args: argparse.Namespace) -> int:
    candidates = tuple(args.candidates or DEFAULT_CANDIDATES)
    try:
        if args.steps < 1:
            raise ValueError("--steps must be >= 1")
        if args.config:
            plan = plan_from_config(args.config, args.steps, args.budget, args.budget_bytes, candidates,
                                    args.time_weight, args.compression)
        else:
            shapes = parse_shapes(args.shapes)
            print(f"SYNTHETIC warm-up residuals (Student-t, df 2, {args.steps} steps, seed {args.seed}): "
                  f"a demo of the planner, not a real model's statistics")
            plan = plan_for_model(shapes, synthetic_residuals(shapes, args.steps, args.seed), args.budget,
                                  budget_bytes=args.budget_bytes, candidates=candidates,
                                  time_weight=args.time_weight)
    except ValueError as err:  # includes SpecError
        print(f"hvdsketch plan: {err}", file=sys.stderr)
        return 2
    print(plan.table())
    if args.json:
        plan.save(args.json)
        print(f"plan written to {args.json}")
    return 0
