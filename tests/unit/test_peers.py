"""The defining property of every peer compressor, in the NumPy back-end, and agreement of the
PyTorch and TensorFlow back-ends where a method is deterministic."""
import dataclasses
import json
import math
import re

import numpy as np
import pytest
tf = pytest.importorskip("tensorflow")  # the pinned environment has it; the newest PyTorch's has not
import torch
from hypothesis import given, settings, strategies as st

from hvdsketch.lab.cli import main
from hvdsketch.compress import REGISTRY, TensorContext, create
from hvdsketch.compress.powersgd import PowerSGD
from hvdsketch.compress.topk import TopK
from hvdsketch.dropin import DropInCompression
from hvdsketch.exchange.flight import Flight, run_local
from hvdsketch.compress.state import StateTable
from hvdsketch.memory import Memory
from hvdsketch.ops import numpy as np_ops, tensorflow as tf_ops, torch as torch_ops
from hvdsketch.spec import SpecError
from tests import peer_cases as cases

BACKENDS = {"numpy": (np_ops, np.asarray), "torch": (torch_ops, torch.from_numpy),
            "tensorflow": (tf_ops, tf.convert_to_tensor)}


def exchange_one(compressor, g, step=0, memory=None, name="w", states=None):
    """One rank alone (world size 1, every reduction the identity), error feedback from ``memory``
    (none by default), the tensor's state from the table ``states`` and back (none: the initial
    state): the result and each round's messages."""
    return run_local(compressor, g, TensorContext(name, tuple(g.shape), step, 1), memory, states)


def first_round(compressor, g, world_size=1):
    """The messages a rank sends first, with ``world_size`` ranks in the job."""
    return Flight(compressor, g, TensorContext("w", tuple(g.shape), 0, world_size)).messages


# -- flags -----------------------------------------------------------------

@pytest.mark.parametrize("flag", ["topk:ratio=0.05", "randomk:ratio=0.1,scale=false,seed=3",
                                  "dgc:ratio=0.05,momentum=0.5,clip=2.0,sample=0.1", "qsgd:levels=15,bucket=none",
                                  "terngrad:seed=4", "efsignsgd", "powersgd:rank=4"])
def test_flag_round_trips_and_a_compressor_is_a_value_of_its_flag(flag):
    compressor = create(flag)
    assert REGISTRY[compressor.name] is type(compressor)
    assert create(str(compressor)) == compressor and hash(create(str(compressor))) == hash(compressor)
    assert "_" not in str(compressor)
    # no field outside the flag's options: the state a method keeps is its State record's
    assert all(field.init for field in dataclasses.fields(compressor))
    state = compressor.initial_state()
    assert state is None or dataclasses.is_dataclass(state) and type(state).__dataclass_params__.frozen


@pytest.mark.parametrize("flag, message", [
    ("topk:ratio=0", "ratio must be in (0, 1], got 0.0"),
    ("topk:ratio=1.5", "ratio must be in (0, 1], got 1.5"),
    ("topk:ratio=abc", "'abc' is not a valid float"),
    ("randomk:ratio=-0.1", "ratio must be in (0, 1]"),
    ("dgc:sample=0", "sample must be in (0, 1]"),
    ("dgc:momentum=1", "momentum must be in [0, 1), got 1.0"),
    ("dgc:clip=0", "clip must be > 0 or none"),
    ("qsgd:levels=0", "levels must be in 1..32767, got 0"),
    ("qsgd:levels=40000", "levels must be in 1..32767"),
    ("qsgd:bucket=0", "bucket must be >= 1 or none"),
    ("powersgd:rank=0", "rank must be >= 1, got 0"),
    ("powersgd:start=-1", "start must be >= 0, got -1"),
    ("terngrad:levels=3", "unknown option(s) levels for 'terngrad'; valid: seed"),
    ("efsignsgd:ratio=0.1", "unknown option(s) ratio for 'efsignsgd'; valid: (none)"),
])
def test_bad_options_are_clear_errors(flag, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        create(flag)


def test_bad_options_raise_value_error_when_constructed_directly():
    with pytest.raises(ValueError, match=re.escape("ratio must be in (0, 1]")):
        TopK(ratio=0)
    with pytest.raises(ValueError, match="rank must be >= 1"):
        PowerSGD(rank=-1)


@pytest.mark.parametrize("flag, rounds", [
    ("topk", [[("allgather", "int64"), ("allgather", "float32")]]),
    ("randomk", [[("average", "float32")]]),
    ("dgc", [[("allgather", "int64"), ("allgather", "float32")]]),
    ("qsgd", [[("allgather", "float32"), ("allgather", "int8")]]),
    ("qsgd:levels=300", [[("allgather", "float32"), ("allgather", "int16")]]),
    ("terngrad", [[("allgather", "float32"), ("allgather", "int8")]]),
    ("efsignsgd", [[("allgather", "float32"), ("allgather", "uint8")]]),
    ("powersgd", [[("average", "float32")], [("average", "float32")]]),
    ("union", [[("bor", "uint8")], [("average", "float32")]]),
    ("allgather", [[("allgather", "int32"), ("allgather", "float32")]]),
    ("balanced", [[("allgather", "int64"), ("allgather", "uint8")], [("alltoall", "float32")], [("allgather", "float32")]]),
    ("sketch:density=0.1", [[("bor", "uint8"), ("average", "float32")]]),
])
def test_each_method_declares_its_collectives(flag, rounds):
    g = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    _, sent = exchange_one(create(flag), g)
    assert [[(m.op, str(m.tensor.dtype)) for m in messages] for messages in sent] == rounds
    assert create(flag).drop_in == (flag == "randomk")


def test_payload_sizes():
    g = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)  # 2048 coordinates
    sizes = {flag: sum(m.tensor.nbytes for r in exchange_one(create(flag), g)[1] for m in r)
             for flag in ["topk:ratio=0.01", "randomk:ratio=0.01", "qsgd:bucket=512", "terngrad", "efsignsgd",
                          "powersgd:rank=2"]}
    assert sizes == {"topk:ratio=0.01": 21 * 12, "randomk:ratio=0.01": 21 * 4, "qsgd:bucket=512": 2048 + 4 * 4,
                     "terngrad": 2048 + 4, "efsignsgd": 2048 // 8 + 4, "powersgd:rank=2": (64 + 32) * 2 * 4}


# -- exactness ---------------------------------------------------------------

@pytest.mark.parametrize("case", [c for c in cases.CASES if c.exact], ids=str)
def test_exact_settings_round_trip_over_simulated_ranks(case):
    for t, results in enumerate(cases.simulate(case, 3, np.asarray)):
        for result in results:
            cases.assert_close(result, cases.dense_average(3, t, case), f"{case} step {t}")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=1, max_size=300, unique_by=abs),
       st.floats(0.001, 1.0))
def test_topk_keeps_exactly_the_k_largest_magnitudes(values, ratio):
    g = np.array(values, np.float32)
    k = min(g.size, max(1, math.ceil(ratio * g.size)))
    estimate, ((indices, sent),) = exchange_one(TopK(ratio), g)
    assert sorted(indices.tensor.tolist()) == sorted(np.argsort(-np.abs(g))[:k].tolist())
    np.testing.assert_array_equal(sent.tensor, g[indices.tensor])
    kept = np.zeros(g.size, bool)
    kept[indices.tensor] = True
    np.testing.assert_array_equal(estimate, np.where(kept, g, 0))


@settings(max_examples=40, deadline=None)
@given(st.integers(4, 40), st.integers(4, 40), st.integers(1, 4), st.data())
def test_powersgd_is_exact_on_a_matrix_of_rank_at_most_r(n, m, r, data):
    true_rank = data.draw(st.integers(0, r))
    if r * (n + m) >= n * m:
        assert PowerSGD(rank=r).matrix((n, m)) is None  # goes dense: exact anyway
    rng = np.random.default_rng([n, m, r, true_rank])
    matrix = rng.standard_normal((n, true_rank)) @ rng.standard_normal((true_rank, m))
    estimate, _ = exchange_one(PowerSGD(rank=r), matrix)
    np.testing.assert_allclose(estimate, matrix, atol=1e-9 * max(1.0, np.abs(matrix).max()))


def test_powersgd_sends_vectors_and_unprofitable_matrices_dense_in_one_round():
    for shape in [(30,), (3, 3), (2, 50)]:
        g = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        estimate, rounds = exchange_one(PowerSGD(rank=2), g)
        assert len(rounds) == 1 and rounds[0][0].tensor is g
        np.testing.assert_array_equal(estimate, g)


def test_powersgd_error_feedback_keeps_what_was_not_sent():
    m = np.random.default_rng(2).standard_normal((30, 20)).astype(np.float32)
    memory = Memory()  # float32 residuals
    estimate, _ = exchange_one(PowerSGD(rank=2), m, memory=memory)
    assert np.linalg.norm(estimate - m) > 0.5 * np.linalg.norm(m)  # full rank: far from exact
    np.testing.assert_allclose(estimate + memory.compensate("w", np.zeros_like(m)), m, atol=1e-6)


def test_powersgd_averages_dense_and_keeps_no_residual_before_its_start_step():
    m = np.random.default_rng(4).standard_normal((30, 20)).astype(np.float32)
    compressor, memory, states = PowerSGD(rank=2, start=2), Memory(), StateTable()
    for step in (0, 1):
        estimate, rounds = exchange_one(compressor, m, step=step, memory=memory, states=states)
        assert len(rounds) == 1 and rounds[0][0].tensor.shape == m.shape
        np.testing.assert_array_equal(estimate, m)
        np.testing.assert_array_equal(memory.compensate("w", np.zeros_like(m)), 0)
    estimate, rounds = exchange_one(compressor, m, step=2, memory=memory, states=states)
    assert [r[0].tensor.shape for r in rounds] == [(30, 2), (2, 20)]  # P, then Q^T
    assert np.linalg.norm(estimate - m) > 0.5 * np.linalg.norm(m)
    assert not compressor.traceable() and PowerSGD(rank=2).traceable()  # a graph would freeze its step


def test_powersgd_warm_start_is_subspace_iteration():
    """Without error feedback, repeating the same matrix converges to the best rank-r approximation."""
    rng = np.random.default_rng(3)
    u, _ = np.linalg.qr(rng.standard_normal((40, 10)))
    v, _ = np.linalg.qr(rng.standard_normal((30, 10)))
    spectrum = 2.0 ** -np.arange(10)
    m = (u * spectrum) @ v.T
    best = np.sqrt(np.sum(spectrum[2:] ** 2))
    compressor, states = PowerSGD(rank=2), StateTable()
    errors = [np.linalg.norm(exchange_one(compressor, m, step=t, states=states)[0] - m) for t in range(25)]
    assert errors[0] > 1.05 * best
    assert errors[-1] == pytest.approx(best, rel=1e-6)


# -- unbiasedness ------------------------------------------------------------

def mean_and_z(flag, draws=4000):
    g = np.random.default_rng(5).standard_normal(32)
    compressor = create(flag)
    samples = np.stack([exchange_one(compressor, g, step=t)[0] for t in range(draws)])
    mean = samples.mean(axis=0)
    z = np.abs(mean - g) / (samples.std(axis=0) / np.sqrt(draws) + 1e-12)
    return g, mean, z


@pytest.mark.parametrize("flag", ["randomk:ratio=0.25", "qsgd:levels=2,bucket=8", "terngrad"])
def test_unbiased_in_expectation(flag):
    g, mean, z = mean_and_z(flag)
    assert z.max() < 4.5, f"{flag}: the mean of 4000 draws is {z.max():.1f} standard errors from g"
    np.testing.assert_allclose(mean, g, atol=0.2)


def test_the_unbiasedness_check_catches_a_biased_estimator():
    g, mean, z = mean_and_z("randomk:ratio=0.25,scale=false")
    assert z.max() > 20
    np.testing.assert_allclose(mean, 0.25 * g, atol=0.05)


def test_qsgd_variance_is_that_of_its_rounding_and_within_lemma_3_1():
    """E||Q_s(v) - v||^2 = sum (||v|| / s)^2 p (1 - p) with p = frac(s |v_i| / ||v||), at most
    min(B / s^2, sqrt(B) / s) ||v||^2."""
    s, v = 2, np.random.default_rng(6).standard_normal(64)
    compressor = create(f"qsgd:levels={s},bucket=none")
    errors = [np.sum((exchange_one(compressor, v, step=t)[0] - v) ** 2) for t in range(3000)]
    x = s * np.abs(v) / np.linalg.norm(v)
    p = x - np.floor(x)
    exact = np.sum((np.linalg.norm(v) / s) ** 2 * p * (1 - p))
    assert np.mean(errors) == pytest.approx(exact, rel=0.05)
    assert exact <= min(64 / s**2, 8 / s) * np.sum(v**2)


@pytest.mark.parametrize("flag", ["qsgd:levels=2,bucket=8", "terngrad"])
def test_ranks_round_independently_so_averaging_shrinks_the_rounding_error(flag):
    """Four ranks quantize the same gradient: their draws differ (the same rank's repeat), so the
    average of their codes has about a quarter of one rank's squared rounding error."""
    g = np.random.default_rng(8).standard_normal(4096).astype(np.float32)
    compressor = create(flag)

    def codes(rank):
        ctx = TensorContext("g", g.shape, step=3, world_size=4, rank=rank)
        return compressor.estimate(*compressor.compress(g, ctx), ctx)

    one = [codes(r) for r in range(4)]
    np.testing.assert_array_equal(one[0], codes(0))
    assert not np.array_equal(one[0], one[1])
    single = np.mean([np.sum((q - g) ** 2) for q in one])
    assert np.sum((np.mean(one, axis=0) - g) ** 2) < 0.4 * single


def test_quantizer_codes_are_small_integers_within_their_levels():
    g = np.random.default_rng(7).standard_normal(1000).astype(np.float32)
    _, ((scales, codes),) = exchange_one(create("qsgd:levels=5,bucket=100"), g)
    assert codes.tensor.dtype == np.int8 and 0 < np.abs(codes.tensor).max() <= 5
    np.testing.assert_allclose(scales.tensor, np.linalg.norm(g.reshape(10, 100), axis=1), rtol=1e-6)
    _, ((scales, codes),) = exchange_one(create("qsgd:levels=5,bucket=1"), g)  # |v_i| / ||v_i|| = 1
    np.testing.assert_array_equal(codes.tensor, 5 * np.sign(g))
    _, ((scale, codes),) = exchange_one(create("terngrad"), g)
    assert set(np.unique(codes.tensor)) == {-1, 0, 1}
    assert scale.tensor[0] == np.abs(g).max()
    assert np.all(np.sign(codes.tensor[codes.tensor != 0]) == np.sign(g[codes.tensor != 0]))


# -- EF-SignSGD ----------------------------------------------------------------

def test_efsignsgd_sends_the_l1_scaled_sign_as_bits():
    g = np.random.default_rng(8).standard_normal(37).astype(np.float32)
    g[3] = 0
    estimate, ((scale, bits),) = exchange_one(create("efsignsgd"), g)
    assert bits.tensor.dtype == np.uint8 and bits.tensor.size == 5
    np.testing.assert_allclose(scale.tensor, [np.abs(g).mean()], rtol=1e-6)
    np.testing.assert_allclose(estimate, np.abs(g).mean() * np.where(g >= 0, 1, -1), rtol=1e-6)


def test_efsignsgd_error_feedback_telescopes():
    """sum_t C(p_t) + e_{T+1} = sum_t g_t: nothing is lost, only delayed."""
    rng = np.random.default_rng(9)
    grads = [rng.standard_normal(50) for _ in range(20)]
    memory, compressor = Memory(), create("efsignsgd")  # float32 residuals
    sent = sum(exchange_one(compressor, g, step=t, memory=memory)[0] for t, g in enumerate(grads))
    np.testing.assert_allclose(sent + memory.compensate("w", np.zeros(50)), sum(grads), atol=1e-5)


# -- DGC -----------------------------------------------------------------------

def test_dgc_momentum_correction_and_factor_masking_follow_the_paper():
    """With an exact threshold (sample=1), DGC equals this from-scratch recurrence."""
    rng = np.random.default_rng(10)
    grads = [rng.standard_normal(200) for _ in range(6)]
    compressor, memory, states = create("dgc:ratio=0.1,momentum=0.9,sample=1"), Memory(), StateTable()
    u = v = np.zeros(200)
    for t, g in enumerate(grads):
        u = 0.9 * u + g
        v = v + u
        sent = np.argsort(-np.abs(v))[:20]
        expected = np.zeros(200)
        expected[sent] = v[sent]
        v, u = v.copy(), u.copy()
        v[sent] = u[sent] = 0
        np.testing.assert_allclose(exchange_one(compressor, g, step=t, memory=memory, states=states)[0], expected,
                                   rtol=1e-6,
                                   err_msg=f"step {t}")  # v accumulates in the memory's float32


def test_dgc_clips_each_rank_to_clip_over_sqrt_n():
    g = np.random.default_rng(11).standard_normal(100)
    compressor = create("dgc:ratio=1,sample=1,momentum=0,clip=2")
    indices, values = first_round(compressor, 10 * g / np.linalg.norm(g), world_size=4)
    assert np.linalg.norm(values.tensor) == pytest.approx(2 / np.sqrt(4))
    small = 0.5 * g / np.linalg.norm(g)
    indices, values = first_round(create("dgc:ratio=1,sample=1,momentum=0,clip=2"), small, world_size=4)
    np.testing.assert_allclose(values.tensor, small[indices.tensor])


def test_dgc_sampled_threshold_sends_at_most_k_of_the_largest():
    v = np.random.default_rng(12).standard_normal(100_000).astype(np.float32)
    indices, values = first_round(create("dgc:ratio=0.01,momentum=0,sample=0.01"), v)
    sent = np.zeros(v.size, bool)
    sent[indices.tensor] = True
    assert 250 <= sent.sum() <= 1000
    assert np.abs(v[sent]).min() >= np.abs(v[~sent]).max()


# -- random-k ------------------------------------------------------------------

def test_randomk_draws_the_same_coordinates_on_every_rank_and_new_ones_every_step():
    g = np.arange(1, 1001, dtype=np.float32)
    picks = {t: sorted(first_round_indices(create("randomk:ratio=0.01"), g, step=t)) for t in range(3)}
    assert picks[0] == sorted(first_round_indices(create("randomk:ratio=0.01"), g, step=0))  # another rank
    assert picks[0] != picks[1] != picks[2]
    assert len(set(picks[0])) == 10


def first_round_indices(compressor, g, step):
    _, state = compressor.compress(g, TensorContext("w", g.shape, step, 1))
    return state.tolist()


def test_randomk_drop_in_changes_coordinates_between_calls():
    compression = DropInCompression("randomk:ratio=0.5")
    g = np.arange(1, 101, dtype=np.float32)
    outputs = []
    for _ in range(2):
        payload, state = compression.compress(g)
        outputs.append(compression.decompress(payload, state))  # one rank: the allreduce is the identity
    assert (outputs[0] != 0).sum() == 50 and not np.array_equal(outputs[0], outputs[1])
    np.testing.assert_array_equal(outputs[0][outputs[0] != 0], 2 * g[outputs[0] != 0])


# -- back-ends ----------------------------------------------------------------

DETERMINISTIC = [cases.Case("topk:ratio=0.05"), cases.Case("dgc:ratio=0.05,momentum=0.9,sample=1"),
                 cases.Case("efsignsgd", (333,)), cases.Case("topk:ratio=0.05", memory=True),
                 *[c for c in cases.CASES if c.exact]]


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_backends_agree_where_deterministic(backend):
    convert = BACKENDS[backend][1]
    for case in DETERMINISTIC:
        reference = cases.simulate(case, 3, np.asarray)
        for t, results in enumerate(cases.simulate(case, 3, convert)):
            cases.assert_close(BACKENDS[backend][0].to_numpy(results[1]), reference[t][1], f"{backend} {case} {t}")


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("flag", ["randomk:ratio=0.1", "qsgd:levels=3,bucket=16", "terngrad:",
                                  "dgc:ratio=0.05,sample=0.05", "powersgd:rank=2"])
def test_random_draws_are_a_function_of_the_seed(backend, flag):
    ops, convert = BACKENDS[backend]
    g = convert(np.random.default_rng(13).standard_normal((48, 20)).astype(np.float32))
    runs = [ops.to_numpy(exchange_one(create(f"{flag},seed={seed}"), g)[0]) for seed in (1, 1, *range(2, 9))]
    np.testing.assert_array_equal(runs[0], runs[1])
    assert any(not np.array_equal(runs[0], other) for other in runs[2:])


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_uniform_is_uniform(backend):
    ops, convert = BACKENDS[backend]
    u = ops.to_numpy(ops.uniform(200_000, 42, convert(np.zeros(1, np.float32))))
    assert u.dtype == np.float32 and u.min() >= 0 and u.max() < 1
    counts, _ = np.histogram(u, bins=10, range=(0, 1))
    assert np.all(np.abs(counts - 20_000) < 5 * np.sqrt(20_000 * 0.9))


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_primitives_match_numpy(backend):
    ops, convert = BACKENDS[backend]
    rng = np.random.default_rng(14)
    for n in (1, 7, 8, 9, 33):
        mask = rng.random(n) < 0.5
        bits = ops.to_numpy(ops.pack_bits(convert(mask)))
        np.testing.assert_array_equal(bits, np.packbits(mask))
        np.testing.assert_array_equal(ops.to_numpy(ops.unpack_bits(convert(bits)))[:n], mask)
    x = rng.standard_normal(50).astype(np.float32)
    for threshold, limit in [(1.0, 50), (1.0, 3), (0.0, 5)]:
        got = ops.to_numpy(ops.select_abs_at_least(convert(x), threshold, limit))
        qualifying = np.flatnonzero(np.abs(x) >= threshold)
        assert sorted(got.tolist()) == sorted(qualifying[np.argsort(-np.abs(x[qualifying]))][:limit].tolist())
    m = rng.standard_normal((20, 3))
    q = ops.to_numpy(ops.orthonormalize(convert(m)))
    np.testing.assert_allclose(q.T @ q, np.eye(3), atol=1e-12)
    np.testing.assert_allclose(q @ q.T @ m, m, atol=1e-12)
    np.testing.assert_array_equal(ops.to_numpy(ops.clip(convert(x), low=-0.5, high=0.5)), np.clip(x, -0.5, 0.5))


@pytest.mark.parametrize("flag", ["topk", "randomk", "qsgd", "terngrad", "efsignsgd", "powersgd"])
def test_tensorflow_compressors_trace_inside_tf_function(flag):
    g = tf.constant(np.random.default_rng(15).standard_normal((48, 20)).astype(np.float32))
    eager = exchange_one(create(flag), g)[0]
    traced = tf.function(lambda x: exchange_one(create(flag), x)[0])(g)
    np.testing.assert_allclose(traced.numpy(), eager.numpy(), rtol=1e-5, atol=1e-6)


def test_dgc_inside_tf_function_is_a_clear_error():
    """Tracing would freeze DGC's velocity at its first value (PowerSGD's Q a graph holds)."""
    g = tf.constant(np.ones((48, 20), np.float32))
    assert not create("dgc").traceable() and create("powersgd").traceable()
    assert not create("powersgd:warm_start=false").traceable()  # each step draws from its step
    with pytest.raises(ValueError, match="outside tf.function"):
        tf.function(lambda x: exchange_one(create("dgc"), x)[0])(g)

@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("flag", ["topk", "randomk:ratio=1", "dgc", "dgc:sample=1", "qsgd", "terngrad", "efsignsgd",
                                  "powersgd"])
def test_a_nan_reaches_the_collectives(backend, flag):
    """So the exchange driver's finiteness check fails on every rank, not just on the one with the NaN."""
    ops, convert = BACKENDS[backend]
    g = np.random.default_rng(16).standard_normal((48, 20)).astype(np.float32)
    g[7, 3] = np.nan
    messages = first_round(create(flag), convert(g))
    assert any(not ops.all_true([ops.all_finite_flag(m.tensor)]) for m in messages if ops.is_floating(m.tensor))

# -- benchmark -----------------------------------------------------------------

def test_bench_compressors_prints_a_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "compressors.json"
    assert main(["bench", "compressors", "--numel", "2000", "--width", "20", "--density", "0.01",
                 "--framework", "numpy", "--repeats", "1", "--json", str(out)]) == 0
    rows = {row["compressor"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == set(REGISTRY)
    assert rows["none"]["ratio"] == 1 and rows["none"]["relative_error"] == 0
    assert rows["topk"]["relative_error"] == 0  # one non-zero row of 20 = the 1% that top-k keeps
    assert rows["efsignsgd"]["ratio"] == pytest.approx(2000 * 4 / (2000 / 8 + 4))
    assert rows["powersgd"]["collectives"] == "average | average"
    assert all(row["compress_ms"] > 0 and row["copy_ratio"] > 0 for row in rows.values())
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["copy_ms"] > 0 and report["clone_ms"] > 0
    printed = capsys.readouterr().out
    assert "decompress ms" in printed and "x copy" in printed and "one copy of the gradient into an existing buffer" in printed


def test_bench_compressors_runs_on_a_device_with_torch_only():
    with pytest.raises(ValueError, match="--device cuda runs PyTorch"):
        main(["bench", "compressors", "--numel", "100", "--width", "10", "--framework", "numpy", "--device", "cuda"])


def test_bench_compressors_rejects_a_shape_it_cannot_make():
    with pytest.raises(ValueError, match="not a multiple of --width"):
        main(["bench", "compressors", "--numel", "1001", "--width", "10", "--framework", "numpy"])
