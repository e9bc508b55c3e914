"""The memory planner: within budget always, optimal against brute force, fp32 at 100%, shared groups, CLI."""
from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvdsketch.lab import cli
from hvdsketch.memory import Memory, Plan, TensorStats, create_store, plan_for_model, solve
from hvdsketch.lab.plan import parse_shapes, synthetic_residuals
from hvdsketch.memory.stores import Nothing, numel

SHAPES = [(1,), (7,), (16, 16), (64, 8), (100,), (30, 20), (3, 4, 5)]
#: Candidates in the order of the loss fractions drawn for them, most lossy first (canonical flags,
#: as warm-up statistics key them).
LOSSY = ["topk:ratio=0.01", "topk:ratio=0.2", "fp16"]
CANDIDATES = ["none", "fp32", *LOSSY, "shared", "offload"]


def tensor_stats(shape, energies, fractions=None, seconds=None, on_host=True, direction=None) -> TensorStats:
    """Statistics of a residual that points the same way every step (so its loss accumulates) with
    ``energies[t] = ||e_t||^2``; each store in ``fractions`` loses that fraction of the accumulated energy."""
    u = np.ones(numel(shape)) if direction is None else np.asarray(direction, dtype=float)
    u = u / np.linalg.norm(u)
    samples = [math.sqrt(e) * u for e in energies]
    total = np.sum(samples, axis=0)
    fractions = {"fp32": 0.0, "offload": 0.0, "shared": 0.0, **(fractions or {})}
    return TensorStats(tuple(shape), list(energies), samples, {f: math.sqrt(x) * total for f, x in fractions.items()},
                       dict(seconds or {}), on_host)


@st.composite
def models(draw, max_tensors: int = 7):
    """Warm-up statistics of a random model: energies, nested loss fractions, realistic times."""
    count = draw(st.integers(1, max_tensors))
    steps = draw(st.integers(1, 4))
    on_host = draw(st.booleans())
    stats = {}
    for i in range(count):
        shape = draw(st.sampled_from(SHAPES))
        energies = [draw(st.floats(1e-6, 1e3)) for _ in range(steps)]
        fractions = sorted((draw(st.floats(0.0, 1.0)) for _ in LOSSY), reverse=True)
        n = numel(shape) * steps
        seconds = {"fp32": 1e-9 * n, "fp16": 3e-9 * n, "shared": 2e-9 * n, "topk:ratio=0.01": 2e-8 * n,
                   "topk:ratio=0.2": 2e-8 * n, "offload": 1e-7 * n}
        stats[f"t{i}"] = tensor_stats(shape, energies, dict(zip(LOSSY, fractions)), seconds, on_host)
    return stats


def full_bytes(stats) -> int:
    return sum(4 * numel(s.shape) for s in stats.values())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(models(), st.floats(0.0, 1.3), st.sampled_from([16, 256, 4096]), st.sampled_from([0.0, 1e3]))
def test_the_plan_never_exceeds_its_budget(stats, fraction, resolution, time_weight):
    budget = math.floor(fraction * full_bytes(stats))
    plan = solve(stats, budget, CANDIDATES, time_weight=time_weight, resolution=resolution)
    assert plan.planned_bytes <= budget
    assert [e.name for e in plan.entries] == list(stats)
    memory = Memory(plan.stores(), default=Nothing())  # the memory holds what the plan promised
    for e in plan.entries:
        residual = np.ones(e.shape, np.float32)
        memory.update(e.name, residual)
    assert memory.nbytes() == plan.planned_bytes


@settings(max_examples=80, deadline=None)
@given(models(), st.sampled_from([1.0, 1.2]))
def test_with_the_whole_budget_the_plan_is_full_fp32_error_feedback(stats, fraction):
    plan = solve(stats, math.floor(fraction * full_bytes(stats)), CANDIDATES, resolution=64)
    assert {e.store for e in plan.entries} == {"fp32"}
    assert plan.planned_bytes == plan.full_bytes and plan.lost_fraction == 0


def test_with_the_whole_budget_real_warmup_residuals_plan_full_fp32():
    shapes = parse_shapes("300x32,32x32,32x32,32,1")
    plan = plan_for_model(shapes, synthetic_residuals(shapes, 2, seed=3), 1.0)
    assert [e.store for e in plan.entries] == ["fp32"] * 5
    assert plan.planned_bytes == plan.full_bytes == plan.budget_bytes


def _lost(stats, choice: dict[str, str]) -> float:
    return sum(stats[name].lost_energy(create_store(flag)) for name, flag in choice.items())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(models(max_tensors=4), st.floats(0.0, 1.0), st.sampled_from([8, 64]))
def test_the_plan_is_optimal_among_plans_whose_rounded_costs_fit(stats, fraction, resolution):
    """Brute force: no plan within the budget loses less; none whose rounded cost fits loses less either
    (the dynamic programme is exact over budget units, the greedy pass only improves on it)."""
    candidates = ["none", "fp32", *LOSSY]
    budget = math.floor(fraction * full_bytes(stats))
    plan = solve(stats, budget, candidates, resolution=resolution)
    stores = {flag: create_store(flag) for flag in candidates}
    best_exact = best_rounded = math.inf
    for combo in itertools.product(candidates, repeat=len(stats)):
        choice = dict(zip(stats, combo))
        sizes = [stores[flag].nbytes(stats[name].shape) for name, flag in choice.items()]
        if sum(sizes) <= budget:
            best_exact = min(best_exact, _lost(stats, choice))
        if sum(0 if b == 0 else -(-b * resolution // budget) if budget else resolution + 1 for b in sizes) <= resolution:
            best_rounded = min(best_rounded, _lost(stats, choice))
    got = _lost(stats, {e.name: e.store for e in plan.entries})
    tolerance = 1e-9 * (1 + sum(s.energy() for s in stats.values()))
    assert best_exact - tolerance <= got <= best_rounded + tolerance


def test_a_shape_group_shares_one_buffer_when_its_largest_residual_moves_around():
    """Three 1000-element tensors, each the largest in one step; room for one fp32 buffer.

    Alone, one buffer protects one tensor (loses the other two always); shared, it
    keeps each step's largest, which loses less.
    """
    energies = {"a": [100.0, 1.0, 1.0], "b": [1.0, 100.0, 1.0], "c": [1.0, 1.0, 100.0]}
    seconds = {"fp32": 1e-6, "shared": 2e-6}  # sharing also computes a norm
    stats = {name: tensor_stats((1000,), e, seconds=seconds) for name, e in energies.items()}
    plan = solve(stats, 4000, ["none", "fp32", "shared"])
    assert [e.store for e in plan.entries] == ["shared"] * 3
    assert plan.planned_bytes == 4000
    # each tensor loses its two steps of energy 1 in one direction: ||2 u||^2 / 3
    assert [e.lost for e in plan.entries] == pytest.approx([4 / 3] * 3)
    # with one tensor always the largest, sharing saves nothing over fp32 for it alone
    stats["a"] = tensor_stats((1000,), [100.0] * 3, seconds=seconds)
    plan = solve(stats, 4000, ["none", "fp32", "shared"])
    assert plan.entry("a").store == "fp32" and plan.entry("b").store == "none"


def _device_stats(fp32_s: float, offload_s: float) -> dict[str, TensorStats]:
    return {f"t{i}": tensor_stats((100, 10), [10.0] * 3, seconds={"fp32": fp32_s, "offload": offload_s},
                                  on_host=False) for i in range(3)}


def test_offload_costs_no_device_memory_and_loses_to_fp32_on_time_when_both_fit():
    stats = _device_stats(fp32_s=1e-6, offload_s=1e-3)
    full = solve(stats, 12000, ["none", "fp32", "offload"])
    assert {e.store for e in full.entries} == {"fp32"}
    none = solve(stats, 0, ["none", "fp32", "offload"])
    assert {e.store for e in none.entries} == {"offload"}
    assert none.planned_bytes == 0 and none.host_bytes == 12000 and none.lost_fraction == 0
    host = {name: dataclasses.replace(s, on_host=True) for name, s in stats.items()}
    assert {e.store for e in solve(host, 0, ["none", "fp32", "offload"]).entries} == {"none"}  # saves nothing there


def test_a_time_weight_trades_lost_energy_for_store_time():
    stats = _device_stats(fp32_s=1e-6, offload_s=1.0)  # offload: 1/3 s per step and tensor
    assert {e.store for e in solve(stats, 0, ["none", "offload"]).entries} == {"offload"}
    assert {e.store for e in solve(stats, 0, ["none", "offload"], time_weight=10.0).entries} == {"none"}


def test_budgets_that_no_plan_fits_and_bad_options_fail_clearly():
    stats = {"w": tensor_stats((10,), [1.0], {"fp16": 0.0})}
    with pytest.raises(ValueError, match="below the smallest plan"):
        solve(stats, 19, ["fp32", "fp16"])  # fp16 needs 20 bytes
    # 3 x 10 bytes fit 30 bytes exactly, though their rounded units (3 x 1366) exceed 4096
    three = {f"t{i}": tensor_stats((5,), [1.0], {"fp16": 0.1}) for i in range(3)}
    assert solve(three, 30, ["fp32", "fp16"]).planned_bytes == 30
    with pytest.raises(ValueError, match="exactly one"):
        plan_for_model({"w": (10,)}, {"w": [np.ones(10, np.float32)]})
    with pytest.raises(ValueError, match="missing: \\['v'\\]"):
        plan_for_model({"w": (10,), "v": (3,)}, {"w": [np.ones(10, np.float32)]}, 0.5)
    with pytest.raises(ValueError, match="shape"):
        plan_for_model({"w": (10,)}, {"w": [np.ones(11, np.float32)]}, 0.5)


def test_the_table_and_json_report_bytes_against_full_fp32():
    shapes = parse_shapes("400x50,50x50,50x50,50")
    plan = plan_for_model(shapes, synthetic_residuals(shapes, 2, seed=1), 0.25)
    table = plan.table()
    for name in shapes:
        assert f"\n{name} " in table
    # 25050 elements: 100200 bytes of fp32 residuals, a budget of 25050 bytes
    assert "vs 97.9 KiB for full fp32 error feedback" in table and "budget 24.5 KiB (25.0%)" in table
    data = json.loads(plan.to_json())
    assert data["planned_bytes"] <= data["budget_bytes"] == math.floor(0.25 * data["full_fp32_bytes"])
    assert Plan.from_dict(data) == plan


def test_plan_command_on_synthetic_shapes(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--shapes", "3000x64,64x256,256", "--budget", "0.25", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "SYNTHETIC" in printed and "residual memory:" in printed
    data = json.loads(out.read_text())
    assert [t["name"] for t in data["tensors"]] == ["t0", "t1", "t2"]
    assert data["planned_bytes"] <= data["budget_bytes"]
    assert cli.main(["plan", "--shapes", "3000xa", "--budget", "0.25"]) == 2
    assert "bad shape" in capsys.readouterr().err


def test_plan_command_on_a_real_workload_config(tmp_path, capsys):
    config = tmp_path / "fashion.yaml"
    config.write_text("workload: fashion:batch_size=16\ncompression: sketch\nmemory: plan:budget=0.25\nepochs: 3\n")
    assert cli.main(["plan", "--config", str(config), "--steps", "2", "--json", str(tmp_path / "p.json")]) == 0
    assert "warm-up: 2 steps of fashion" in capsys.readouterr().out
    data = json.loads((tmp_path / "p.json").read_text())
    assert {t["name"] for t in data["tensors"]} >= {"0.weight", "0.bias"}
    assert data["planned_bytes"] <= data["budget_bytes"] == math.floor(0.25 * data["full_fp32_bytes"])
    config.write_text("workload: fashion\nmemory: fp16\n")
    assert cli.main(["plan", "--config", str(config)]) == 2
    assert "not plan:budget" in capsys.readouterr().err
    config.write_text("workload: fashion:batch_size=16\ncompression: auto\n")  # the main job's kind of config
    assert cli.main(["plan", "--config", str(config), "--budget", "0.25"]) == 2
    assert "chooses one per tensor while training: give --compression" in capsys.readouterr().err
    assert cli.main(["plan", "--config", str(config), "--budget", "0.25", "--steps", "2",
                     "--compression", "topk:ratio=0.05"]) == 0
    assert "with compression topk:ratio=0.05" in capsys.readouterr().out
