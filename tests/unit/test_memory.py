"""Residual stores and the residual memory: round trips, loss bounds, bytes, checkpoints, error feedback."""
from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from hvdsketch.exchange.flight import run_local
from hvdsketch.memory import Memory, create, create_store
from hvdsketch.memory.stores import Nothing
from hvdsketch.ops import backend
from hvdsketch.spec import SpecError

BACKENDS = ["numpy", "torch", "tensorflow"]


def tensor(kind: str, a: np.ndarray):
    if kind == "torch":
        torch = pytest.importorskip("torch")
        return torch.from_numpy(np.array(a))
    if kind == "tensorflow":
        tf = pytest.importorskip("tensorflow")
        return tf.constant(a)
    return np.array(a)


def round_trip(store_flag: str, e: np.ndarray, kind: str = "numpy") -> np.ndarray:
    """Keep ``e`` as a residual (update), then take it back (compensate a zero gradient)."""
    memory = create(store_flag)
    x = tensor(kind, e)
    zero = tensor(kind, np.zeros_like(e))
    memory.update("w", x)
    return backend(x).to_numpy(memory.compensate("w", zero))


def heavy(shape, seed=0, scale=1e-3) -> np.ndarray:
    return (scale * np.random.default_rng(seed).standard_t(2, size=shape)).astype(np.float32)


# -- each store's round trip and its loss bound ------------------------------------------------

@pytest.mark.parametrize("kind", BACKENDS)
def test_fp32_and_offload_are_exact(kind):
    e = heavy((50, 40))
    for flag in ("fp32", "offload"):
        np.testing.assert_array_equal(round_trip(flag, e, kind), e)


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("case", ["typical", "tiny", "huge"])
def test_fp16_error_bound_holds_where_an_unscaled_cast_fails(kind, case):
    """Residuals of 1e-10 flush to zero in plain fp16; entries above 65504 overflow it."""
    e = heavy(4000, seed=1, scale={"typical": 1e-3, "tiny": 1e-10, "huge": 30.0}[case])
    if case == "huge":
        e[:3] = [1e5, -2e5, 7e4]
    bound = 2.0**-11 * np.abs(e) + 2.0**-39 * np.linalg.norm(e.astype(np.float64))
    back = round_trip("fp16", e, kind)
    assert np.all(np.abs(back - e) <= bound)
    if case != "typical":
        plain = e.astype(np.float16).astype(np.float32)
        assert not np.all(np.abs(plain - e) <= bound)


@pytest.mark.parametrize("kind", BACKENDS)
def test_bf16_relative_error_bound(kind):
    e = heavy(4000, seed=2)
    back = round_trip("bf16", e, kind)
    assert np.all(np.abs(back - e) <= 2.0**-8 * np.abs(e))
    assert np.abs(back - e).max() > 0  # bfloat16 does round


@pytest.mark.parametrize("kind", BACKENDS)
def test_topk_keeps_exactly_the_largest_entries(kind):
    rng = np.random.default_rng(3)
    e = (rng.permutation(1000) + 1).astype(np.float32) * rng.choice([-1, 1], 1000)  # distinct magnitudes
    back = round_trip("topk:ratio=0.05", e, kind)
    largest = np.argsort(-np.abs(e))[:50]
    kept = np.flatnonzero(back)
    np.testing.assert_array_equal(np.sort(kept), np.sort(largest))
    np.testing.assert_array_equal(back[kept], e[kept])
    lost = float(np.sum((back - e).astype(np.float64) ** 2))
    assert lost == pytest.approx(float(np.sum(np.sort(e.astype(np.float64) ** 2)[:950])))


def test_topk_of_a_scalar_keeps_it():
    e = np.array(2.5, dtype=np.float32)
    assert round_trip("topk:ratio=0.01", e) == pytest.approx(2.5)


def test_none_keeps_nothing_and_leaves_the_gradient_alone():
    memory = create("none")
    g = heavy(10)
    memory.update("w", g)
    assert memory.compensate("w", g) is g
    assert memory.nbytes() == 0 and memory.state_dict()["slots"] == {}


# -- the sketch store: linear, conserving, heavy hitters recovered ----------------------------

@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_sketch_store_is_linear(kind):
    store = create_store("sketch:ratio=0.1,rows=3")
    a, b = heavy(5000, 4), heavy(5000, 5)
    ops = backend(tensor(kind, a))
    both = store.put(ops, store.put(ops, None, tensor(kind, a), "w"), tensor(kind, b), "w")["S"]
    summed = store.put(ops, None, tensor(kind, a + b), "w")["S"]
    np.testing.assert_allclose(ops.to_numpy(both), ops.to_numpy(summed), rtol=1e-5, atol=1e-6)


def test_sketch_store_recovers_sparse_residuals_exactly_and_keeps_the_rest_in_the_sketch():
    """Five spikes in 5000 coordinates, 5 rows of 500 columns: the spikes are the heavy hitters.

    (With these hash seeds no zero coordinate collides with spikes in 3 of 5 rows; over random
    seeds that happens with probability about 5%.)
    """
    store = create_store("sketch:ratio=0.5,rows=5,recover=0.01")
    ops = backend(np.zeros(1))
    e = np.zeros(5000, np.float32)
    spikes = np.array([17, 400, 2222, 3001, 4999])
    e[spikes] = [3.0, -2.5, 4.0, -1.5, 2.0]
    state = store.put(ops, None, e, "w")
    back, held = store.take(ops, state, "w", e)
    np.testing.assert_array_equal(back, e)
    np.testing.assert_allclose(held["S"], 0, atol=1e-6)  # everything given back, nothing left behind
    # What is not given back stays in the sketch: S(held) + S(given back) == S(kept)
    e2 = heavy(5000, 6)
    state = store.put(ops, None, e2, "w")
    back, held = store.take(ops, state, "w", e2)
    np.testing.assert_allclose(held["S"] + store.put(ops, None, back, "w")["S"], state["S"], atol=1e-5)


def test_sketch_store_keeps_small_tensors_dense():
    e = heavy(4)  # 5 rows of one column would not be smaller
    np.testing.assert_array_equal(round_trip("sketch", e), e)
    # 5 rows of 2 float32 cells, and one byte marking the one block the residual may touch
    assert create_store("sketch").nbytes((4,)) == 16 and create_store("sketch").nbytes((100,)) == 4 * 5 * 2 + 1


# -- shared ------------------------------------------------------------------------------------

def test_shared_buffer_goes_to_the_largest_residual_and_never_to_another_tensor():
    memory = create("shared")
    small, large, other = heavy((6, 4), 7), 10 * heavy((6, 4), 8), heavy((3,), 9)
    zero = np.zeros((6, 4), np.float32)
    memory.update("a", small)
    memory.update("b", large)
    memory.update("c", other)
    assert memory.nbytes() == 4 * 24 + 4 * 3  # one buffer for the two 6x4 tensors
    g = heavy((6, 4), 10)
    np.testing.assert_array_equal(memory.compensate("a", g), g)  # a lost its residual, gets nothing of b's
    np.testing.assert_array_equal(memory.compensate("b", g), g + large)
    np.testing.assert_array_equal(memory.compensate("c", np.zeros(3, np.float32)), other)
    # b took the buffer back, so it is empty: a smaller residual now keeps it
    memory.update("a", small)
    np.testing.assert_array_equal(memory.compensate("a", zero), small)


# -- offload -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_offload_keeps_the_residual_on_the_host_and_reports_copy_time(kind):
    memory = create("offload")
    e = tensor(kind, heavy((64, 64)))
    ops = backend(e)
    memory.update("w", e)
    assert memory.nbytes() == 0 and memory.host_nbytes() == 4 * 64 * 64
    assert all(ops.device_name(v) == "cpu" for v in memory._state["w"].values())
    back = memory.compensate("w", e * 0.0)
    np.testing.assert_array_equal(ops.to_numpy(back), ops.to_numpy(e))
    assert memory.seconds["offload"] > 0


# -- bytes, flags, checkpoints -------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["fp32", "fp16", "bf16", "topk:ratio=0.1", "sketch:ratio=0.05", "shared"])
def test_memory_bytes_match_what_the_store_promises(flag):
    memory = create(flag)
    shapes = {"w": (300, 40), "v": (40,)}
    for name, shape in shapes.items():
        e = heavy(shape)
        memory.update(name, e)
    store = create_store(flag)
    assert memory.nbytes() == sum(store.nbytes(s) for s in shapes.values())


def test_unknown_stores_and_options_name_the_valid_ones():
    with pytest.raises(SpecError, match="valid: bf16, fp16, fp32, none, offload, plan, shared, sketch, topk"):
        create("fp8")
    with pytest.raises(SpecError, match="valid: ratio"):
        create("topk:k=3")
    with pytest.raises(SpecError, match="ratio"):
        create("topk:ratio=2")
    with pytest.raises(SpecError, match="exactly one"):
        create("plan")
    with pytest.raises(SpecError, match="exactly one"):
        create("plan:budget=0.1,budget_bytes=100")
    assert str(create("topk:ratio=0.05")) == "topk:ratio=0.05" and str(create("plan:budget=0.25")) == "plan:budget=0.25"


def _steps(memory: Memory, grads: list[dict[str, np.ndarray]], kind: str = "numpy") -> list[np.ndarray]:
    """Error feedback around a fixed sparsifier (keep every third entry) for a few steps."""
    out = []
    for step in grads:
        for name, g in step.items():
            x = tensor(kind, g)
            ops = backend(x)
            mask = tensor(kind, (np.arange(g.size) % 3 == 0).reshape(g.shape).astype(g.dtype))
            compensated = memory.compensate(name, x)
            estimate = compensated * mask
            memory.update(name, compensated - estimate)
            out.append(ops.to_numpy(estimate))
    return out


def _framework_free(tree) -> bool:
    """Numpy arrays and strings only (no framework's tensor), in dicts keyed by strings."""
    if isinstance(tree, dict):
        return all(isinstance(k, str) and _framework_free(v) for k, v in tree.items())
    return isinstance(tree, (np.ndarray, str))


@pytest.mark.parametrize("flag", ["fp32", "fp16", "bf16", "topk:ratio=0.2", "sketch:ratio=0.2,rows=3", "shared",
                                  "offload", "plan:budget=0.3,warmup=2", "plan:budget=0.3,warmup=5"])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_resume_from_state_dict_continues_bit_for_bit(flag, kind):
    rng = np.random.default_rng(11)
    grads = [{"w": rng.standard_normal((40, 30)).astype(np.float32),
              "v": rng.standard_normal((40, 30)).astype(np.float32),
              "b": rng.standard_normal(30).astype(np.float32)} for _ in range(6)]
    uninterrupted = create(flag)
    expected = _steps(uninterrupted, grads, kind)
    first = create(flag)
    _steps(first, grads[:3], kind)
    saved = pickle.loads(pickle.dumps(first.state_dict()))  # survives serialisation
    assert _framework_free({k: v for k, v in saved.items()})
    resumed = create(flag)
    resumed.load_state_dict(saved)
    got = _steps(resumed, grads[3:], kind)
    for a, b in zip(expected[-len(got):], got):
        np.testing.assert_array_equal(a, b)
    assert resumed.nbytes() == uninterrupted.nbytes()


def test_loading_a_state_saved_under_another_spec_fails_clearly():
    memory = create("fp16")
    memory.update("w", heavy(10))
    with pytest.raises(ValueError, match="saved with --memory 'fp16'.*uses 'fp32'"):
        create("fp32").load_state_dict(memory.state_dict())


def test_plan_memory_switches_after_warmup_within_budget_and_keeps_the_residuals():
    memory = create("plan:budget=0.3,warmup=2")
    grads = [{"emb": heavy((500, 16), s), "w": heavy((16, 16), s + 50), "b": heavy(16, s + 99)} for s in range(3)]
    _steps(memory, grads[:2])
    assert memory.plan is None
    before = {name: memory._state[name]["e"].copy() for name in grads[0]}
    zero = {name: np.zeros_like(g) for name, g in grads[0].items()}
    after = {name: memory.compensate(name, zero[name]) for name in zero}  # the first compensate switches
    plan = memory.plan
    assert plan is not None and plan.planned_bytes <= plan.budget_bytes == math.floor(0.3 * 4 * (8000 + 256 + 16))
    for name in zero:
        if plan.entry(name).store == "fp32":
            np.testing.assert_array_equal(after[name], before[name])
    for name in zero:
        memory.update(name, after[name])
    assert memory.nbytes() == plan.planned_bytes
    assert isinstance(memory.store("unseen"), Nothing)


# -- error feedback works ---------------------------------------------------------------------

def test_error_feedback_makes_topk_converge_where_plain_topk_stalls():
    """Distributed least squares: 4 workers with different data send their top-5% gradients.

    At the optimum the workers' gradients cancel but their top-k parts do not, so
    top-k without error feedback settles at a biased point whatever the step size;
    with fp32 error feedback (Karimireddy et al., 2019) what was dropped is sent
    later and, as the step size decays, it converges. A compressed residual
    (fp16, or the top 30% of it) keeps most of that benefit.
    """
    from hvdsketch.compress import TensorContext
    from hvdsketch.compress import create as compressor

    rng = np.random.default_rng(0)
    workers, n, d = 4, 200, 100
    data = [(rng.standard_normal((n, d)), rng.standard_normal(n) + 3 * rng.standard_normal()) for _ in range(workers)]
    a_all = np.concatenate([a for a, _ in data])
    b_all = np.concatenate([b for _, b in data])
    x_star = np.linalg.lstsq(a_all, b_all, rcond=None)[0]

    def excess_loss(x):
        return 0.5 * np.mean((a_all @ x - b_all) ** 2) - 0.5 * np.mean((a_all @ x_star - b_all) ** 2)

    topk = compressor("topk:ratio=0.05")

    def train(flag: str | None) -> list[float]:
        memories = [create(flag) for _ in range(workers)] if flag else [None] * workers
        x, losses = np.zeros(d), []
        for step in range(600):
            ctx = TensorContext("x", (d,), step, world_size=1)
            sent = []
            for (a, b), memory in zip(data, memories):
                sent.append(run_local(topk, a.T @ (a @ x - b) / n, ctx, memory)[0])
            x = x - 0.1 / (1 + step / 100) * np.mean(sent, axis=0)
            if step % 120 == 119:
                losses.append(excess_loss(x))
        return losses

    plain, fp32, fp16, partial = train(None), train("fp32"), train("fp16"), train("topk:ratio=0.3")
    assert plain[-1] > 0.1 and plain[-1] > 0.95 * plain[0]   # stalls at a biased point
    assert fp32[-1] < 1e-3 and fp32[-1] < fp32[0] / 5        # keeps converging
    assert fp16[-1] < 2 * fp32[-1]
    assert fp32[-1] < partial[-1] < plain[-1] / 3
