"""Per-tensor compression policies in one process: rules, flags and configs, the cost model's terms
and decisions, and the auto policy's warm-up and checkpoint on a one-rank MPI communicator."""
import math

import numpy as np
import pytest
from mpi4py import MPI

from hvdsketch import spec
from hvdsketch.collectives.mpi import MPICommunicator
from hvdsketch.collectives.stats import ring_allreduce_bytes
from hvdsketch.compress import RowSparse, TensorContext, create
from hvdsketch.policy import AutoPolicy, Fixed, Rule, Rules, create as create_policy, label
from hvdsketch.policy.cost import BLOCK, Link, densities, measure, parse_bandwidth, parse_latency
from hvdsketch.spec import SpecError
from hvdsketch.lab.config import TrainConfig

GBIT = parse_bandwidth("1gbit")
LATENCY = 50e-6  # a collective's latency on a fast LAN


def row_sparse(rows: int, cols: int, density: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    g = np.zeros((rows, cols), np.float32)
    picked = rng.choice(rows, max(1, int(density * rows)), replace=False)
    g[picked] = rng.normal(size=(len(picked), cols))
    return g


def decide(tensor: np.ndarray, link: Link, size: int, policy: AutoPolicy = AutoPolicy()) -> str:
    """The candidate the cost model picks for ``tensor`` alone, every rank holding a copy of its sparsity."""
    element, unit = densities(tensor, tensor.shape, BLOCK)
    ctx = TensorContext("t", tensor.shape, 0, size)
    candidates = policy.candidates(tensor.shape, str(tensor.dtype), element, min(1.0, unit * size))
    return str(candidates[policy.choose([measure(c, tensor, ctx) for c in candidates], link)])


# -- the cost model's decisions ------------------------------------------------------------------

@pytest.mark.parametrize("size", [2, 4])
def test_row_sparse_embedding_on_a_slow_link_is_compressed_well_below_fp16(size):
    choice = decide(row_sparse(30000, 256, 0.01), Link(LATENCY, GBIT), size)
    assert choice.split(":")[0] in ("allgather", "union", "balanced", "topk", "sketch", "powersgd"), choice


def test_small_bias_stays_dense():
    bias = np.random.default_rng(1).normal(size=256).astype(np.float32)
    assert decide(bias, Link(LATENCY, GBIT), 4) == "none"


def test_dense_matrix_on_a_fast_link_stays_dense():
    dense = np.random.default_rng(2).normal(size=(2048, 2048)).astype(np.float32)
    assert decide(dense, Link(LATENCY, parse_bandwidth("100gbit")), 2) == "none"


def test_dense_matrix_on_a_slow_link_is_compressed():
    dense = np.random.default_rng(3).normal(size=(2048, 2048)).astype(np.float32)
    assert decide(dense, Link(LATENCY, parse_bandwidth("100mbit")), 2) != "none"


def test_margin_keeps_dense_when_savings_are_small():
    """Everything costs the same as dense but 5% less: the 10% margin keeps dense, none of it wins."""
    from hvdsketch.policy.cost import Measurement

    link = Link(0.0, 1.0)
    dense, cheaper = Measurement(0.0, 100, 0), Measurement(0.0, 95, 0)
    assert AutoPolicy().choose([dense, cheaper], link) == 0
    assert AutoPolicy("auto:margin=0").choose([dense, cheaper], link) == 1


def test_a_small_tensor_rides_in_a_collective_the_step_launches_anyway():
    """fastText's step: the embedding goes by allgather; the classifier's own dense allreduce would be
    the step's only allreduce, so on a link where a collective costs 1 ms it joins the allgather (a
    few more bytes, one collective fewer), and where collectives cost nothing it stays dense."""
    from hvdsketch.policy.cost import Measurement, collectives, step_seconds
    from hvdsketch.compress import Message

    gather = collectives([[Message(np.zeros(3, np.int64), "allgather"), Message(np.zeros(3, np.float32), "allgather")]])
    average = collectives([[Message(np.zeros(3, np.float32), "average")]])
    assert gather == {(0, "gather", "int64"), (0, "gather", "float32")} and average == {(0, "average", "float32")}
    embedding = [Measurement(0.0, 10_000_000, 0, average), Measurement(1e-4, 400_000, 2, gather)]
    classifier = [Measurement(0.0, 12_000, 0, average), Measurement(1e-5, 36_000, 2, gather)]
    policy, measured = AutoPolicy(), [embedding, classifier]
    for latency, expected in ((1e-3, [1, 1]), (0.0, [1, 0])):
        link = Link(latency, GBIT)
        per_tensor = [policy.choose(ms, link) for ms in measured]
        assert per_tensor == [1, 0]  # each alone: the classifier's allreduce priced as riding one anyway
        shared = policy.share(measured, per_tensor, link)
        assert shared == expected, latency
        chosen = [ms[k] for ms, k in zip(measured, shared)]
        assert step_seconds(chosen, link) <= step_seconds([ms[k] for ms, k in zip(measured, per_tensor)], link)


def test_candidates_follow_shape_and_density():
    policy = AutoPolicy("auto:powersgd_rank=2,headroom=2")
    sparse = [str(c) for c in policy.candidates((30000, 256), "float32", 0.01, 0.04)]
    assert sparse[:2] == ["none", "fp16"]
    assert "topk:ratio=0.02" in sparse and "sketch:density=0.08" in sparse
    assert "allgather" in sparse and "union" in sparse  # exact, where some rows are empty
    assert sparse[-1] == "powersgd:rank=2"  # error feedback makes low rank fit sparse matrices too: cost decides
    rows = [str(c) for c in policy.candidates((30000, 256), "float32", 0.01, 0.04, row_sparse=True)]
    assert rows == [c for c in sparse if not c.startswith("topk")]  # the exact allgather, never densified
    traced = [str(c) for c in policy.candidates((30000, 256), "float32", 0.01, 0.04, traced=True)]
    assert "allgather" not in traced and "union" not in traced  # sized at run time: no graph holds them
    assert "powersgd:rank=2" in traced  # its Q held in a variable the graph updates
    dense = [str(c) for c in policy.candidates((1024, 256), "float32", 1.0, 1.0)]
    assert dense == ["none", "fp16", "allgather", "powersgd:rank=2"]  # allgather: to share a collective
    assert [str(c) for c in policy.candidates((1024,), "float16", 1.0, 1.0)] == ["none", "allgather"]


# -- the cost model's terms ---------------------------------------------------------------------

def test_measured_wire_bytes_follow_each_collective():
    g = row_sparse(1000, 64, 0.05)
    n = g.size
    for size in (2, 4):
        ctx = TensorContext("g", g.shape, 0, size)
        assert measure(create("none"), g, ctx).wire == ring_allreduce_bytes(4 * n, size)
        assert measure(create("none"), g, ctx).calls == 0
        fp16 = measure(create("fp16"), g, ctx)
        assert fp16.wire == ring_allreduce_bytes(2 * n, size) and fp16.calls == 1
        k = math.ceil(0.05 * n)
        topk = measure(create("topk:ratio=0.05"), g, ctx)
        assert topk.wire == (size - 1) * 12 * k and topk.calls == 2  # int64 index + float32 value, allgathered
        powersgd = measure(create("powersgd:rank=2"), g, ctx)
        assert powersgd.wire == ring_allreduce_bytes(4 * 2 * 1000, size) + ring_allreduce_bytes(4 * 2 * 64, size)
        assert powersgd.calls == 1  # its second round
        assert all(m.compute >= 0 for m in (fp16, topk, powersgd))


@pytest.mark.parametrize("ring_bor", [False, True])
def test_union_is_priced_from_the_union_given_and_the_communicators_or(ring_bor):
    """One rank's run of union sees its own rows only: its second round is priced from the union
    given (auto's OR of the ranks' bitmaps); the bitmap's OR is an allgather in Horovod and a ring in
    the MPI layer."""
    g = row_sparse(4000, 64, 0.01)
    policy, ctx = AutoPolicy(), TensorContext("g", g.shape, 0, 4)
    measured = policy._measure(create("union"), g, ctx, union=0.04, ring_bor=ring_bor)
    bitmap = ring_allreduce_bytes(500, 4) if ring_bor else 3 * 500
    assert measured.wire == bitmap + ring_allreduce_bytes(160 * 64 * 4, 4) and measured.calls == 2
    gathered = policy._measure(create("allgather"), g, ctx, union=0.04, ring_bor=ring_bor)
    assert gathered.wire == 3 * 40 * (4 + 64 * 4)  # this rank's 40 rows and int32 indices to 3 others


def test_auto_warms_up_a_row_sparse_gradient_by_allgather_and_the_rest_dense():
    """Before it decides, auto exchanges exactly: dense, but a gradient that comes as rows by allgather,
    which takes it as it is (fastText's 41 MB embedding densified cost 0.4 s a step at 1 Gbit/s)."""
    policy = AutoPolicy("auto:warmup=2")
    rows, dense = TensorContext("emb", (4000, 64), row_sparse=True), TensorContext("w", (64, 64))
    assert policy.pending and str(policy.compressor(rows)) == "allgather" and create("allgather").row_sparse
    assert str(policy.compressor(dense)) == "none"
    assert {"none", "allgather"} <= set(policy.compressors())  # both may hold state in a checkpoint


@pytest.mark.parametrize("ratio", [0.001, 0.02, 0.5])
def test_topk_takes_a_row_sparse_gradient_as_it_is(ratio):
    """The auto policy's top-k candidate on an embedding's gradient: chosen from its rows, never
    densified, the same exchange as on the dense tensor (all non-zeros when k exceeds them)."""
    from hvdsketch.exchange.flight import run_local

    g = row_sparse(2000, 16, 0.02, seed=4)
    rows = np.flatnonzero(g.any(axis=1))
    ctx = TensorContext("e", g.shape, 0, 1)
    topk = create(f"topk:ratio={ratio}")
    np.testing.assert_array_equal(run_local(topk, RowSparse(rows, g[rows], g.shape), ctx)[0],
                                  run_local(topk, g, ctx)[0])


def test_measure_runs_from_the_initial_state_and_keeps_none():
    """A measurement is the first exchange of the tensor (a given state is not used: this one's Q
    has a shape no product with the tensor takes) and leaves no state anywhere: a compressor is a
    value, equal to a fresh one of its flag."""
    powersgd = create("powersgd:rank=1")
    warm = TensorContext("w", (64, 32), 0, 2, state=powersgd.State(np.ones((7, 1), np.float32)))
    measured = measure(powersgd, np.ones((64, 32), np.float32), warm)
    assert measured.wire > 0 and powersgd == create("powersgd") and hash(powersgd) == hash(create("powersgd"))


def test_measure_prices_the_median_timing_not_the_luckiest(monkeypatch):
    """Where ranks share cores the fastest of the repeats is the one that met the fewest other ranks;
    a step meets the typical one. Five timings of 1, 9, 10, 11 and 2 ms price the codec at 9 ms."""
    import hvdsketch.policy.cost as cost

    class Clock:  # each repeat reads the clock twice: before and after its exchange
        ticks = iter(np.cumsum([0, 1, 0, 9, 0, 10, 0, 11, 0, 2]) * 1e-3)

        @staticmethod
        def perf_counter() -> float:
            return float(next(Clock.ticks))

    monkeypatch.setattr(cost, "time", Clock)
    measured = measure(create("none"), np.ones(64, np.float32), TensorContext("t", (64,), 0, 2))
    assert measured.compute == pytest.approx(9e-3)


def test_row_sparse_densities_and_densify_cost():
    g = row_sparse(512, 16, 0.25)
    rows = np.flatnonzero(g.any(axis=1))
    sparse = RowSparse(rows, g[rows], g.shape)
    assert densities(sparse, g.shape, BLOCK) == densities(g, g.shape, BLOCK) == (len(rows) / 512, len(rows) / 512)
    vector = np.zeros(1000, np.float32)
    vector[[3, 700]] = 1
    assert densities(vector, vector.shape, BLOCK) == (2 / 1000, 2 / 4)
    ctx = TensorContext("e", g.shape, 0, 2)
    assert measure(create("none"), sparse, ctx).wire == measure(create("none"), g, ctx).wire


def test_link_units_and_errors():
    assert parse_bandwidth("1gbit") == 125e6 and parse_bandwidth("100mbit") == 12.5e6
    assert parse_latency("50us") == pytest.approx(5e-5) and parse_latency("2ms") == pytest.approx(2e-3)
    with pytest.raises(SpecError, match="unit, one of bit, kbit, mbit, gbit, tbit"):
        parse_bandwidth("fast")
    with pytest.raises(SpecError, match="unit, one of s, ms, us"):
        parse_latency("10")
    assert Link(1e-3, 1e6).seconds(2e6, calls=2) == pytest.approx(2.002)


# -- rules ---------------------------------------------------------------------------------------

def test_rules_match_first_rule_wins():
    rules = Rules([Rule("sketch:density=0.1", name="embedding.*"),
                   Rule("powersgd:rank=4", ndim=2, min_size=1000),
                   Rule("fp16", shape=(10, 10)),
                   {"compression": "topk:ratio=0.1", "max_size": 50}], default="none")
    assert rules.rule_for("embedding.weight", (100, 8)).compression == "sketch:density=0.1"
    assert rules.rule_for("decoder.weight", (100, 16)).compression == "powersgd:rank=4"
    assert rules.rule_for("other", (10, 10)).compression == "fp16"  # 100 elements: too small for rule 2
    assert rules.rule_for("bias", (50,)).compression == "topk:ratio=0.1"
    assert rules.rule_for("bias", (51,)) is None
    assert rules.rule_for("lstm.weight", (4, 5, 6)) is None


def step_through(policy, tensors, contexts, comm):
    """One step as the exchanger runs it: each tensor's compressor, then the step's end."""
    chosen = [policy.compressor(ctx) for ctx in contexts]
    policy.end_step(list(zip(tensors, contexts)) if policy.wants_inputs else [], comm)
    return chosen


def test_rules_assign_and_tabulate(capsys):
    comm = MPICommunicator(MPI.COMM_SELF)
    rules = create_policy({"rules": [{"name": "emb*", "compression": "topk:ratio=0.02"}], "default": "fp16"})
    tensors = [row_sparse(1000, 32, 0.01), np.ones(32, np.float32)]
    contexts = [TensorContext("emb.weight", (1000, 32), 0, 1), TensorContext("bias", (32,), 0, 1)]
    assert rules.pending
    assert [str(c) for c in step_through(rules, tensors, contexts, comm)] == ["topk:ratio=0.02", "fp16"]
    assert not rules.pending
    table = rules.assignment
    assert [row.tensor for row in table] == ["emb.weight"] and table[0].density == pytest.approx(0.01)
    assert "emb.weight" in capsys.readouterr().out
    assert str(rules) == "rules[name=emb*->topk:ratio=0.02; default=fp16]"


def test_rules_and_their_default_of_one_flag_hand_out_equal_compressors():
    """A rule and the default of one flag (spelled either way) give equal compressors, listed once
    under the flag, so a tensor's state (kept by the exchanger with the compressor that made it)
    follows the flag, not the object."""
    comm = MPICommunicator(MPI.COMM_SELF)
    contexts = [TensorContext("emb", (64, 8), 0, 1), TensorContext("w", (8, 8), 0, 1), TensorContext("v", (8, 8), 0, 1)]
    rules = Rules([Rule("powersgd", name="emb"), Rule("powersgd:rank=1", name="w")], default="powersgd:rank=1")
    chosen = step_through(rules, [np.ones(c.shape, np.float32) for c in contexts], contexts, comm)
    assert len(set(chosen)) == 1 and list(rules.compressors()) == ["powersgd"]
    assert rules.compressors()["powersgd"] == chosen[0]
    auto = Rules([Rule("powersgd:rank=4", name="emb")], default="auto:warmup=1,bandwidth=1gbit,powersgd_rank=4")
    step_through(auto, [np.ones(c.shape, np.float32) for c in contexts], contexts, comm)
    assert auto.compressor(contexts[0]) == auto.compressors()["powersgd:rank=4"]
    assert all(flag == str(c) for flag, c in auto.compressors().items())


@pytest.mark.parametrize("raw, message", [
    ({"rules": [{"name": "x", "compression": "sketchy"}]}, "unknown compressor 'sketchy'; valid: .*topk"),
    ({"rules": [{"name": "x"}]}, "needs a compression"),
    ({"rules": [{"pattern": "x", "compression": "none"}]}, r"a rule: unknown key\(s\) pattern; valid: compression, name"),
    ({"rules": [{"ndim": "two", "compression": "none"}]}, "ndim must be a non-negative integer"),
    ({"rules": [{"shape": "10x10", "compression": "none"}]}, "shape must be a list"),
    ({"rules": "emb*: sketch"}, "rules must be a list"),
    ({"rules": ["sketch"]}, "a rule must be a mapping"),
    ({"rule": []}, r"a compression mapping: unknown key\(s\) rule; valid: default, rules"),
    ({"default": "none"}, "needs rules"),
    ({"rules": [], "default": "auto:warmup=0"}, "warmup must be >= 1"),
])
def test_bad_rules_raise_clear_errors(raw, message):
    with pytest.raises(SpecError, match=message):
        create_policy(raw)


# -- flags and configs ----------------------------------------------------------------------------

def test_create_accepts_every_form(monkeypatch):
    monkeypatch.delenv(spec.ENV_VAR, raising=False)
    assert isinstance(create_policy(None), Fixed) and str(create_policy(None)) == "none"
    monkeypatch.setenv(spec.ENV_VAR, "auto:warmup=3")
    assert isinstance(create_policy(None), AutoPolicy) and create_policy(None).options.warmup == 3
    assert str(create_policy("sketch:density=0.1")) == "sketch:density=0.1"
    assert str(create_policy(create("fp16"))) == "fp16"
    assert str(create_policy("auto:bandwidth=1gbit,warmup=3")) == "auto:bandwidth=1gbit"  # defaults drop
    assert str(create_policy([Rule("fp16", name="*.weight")])) == "rules[name=*.weight->fp16; default=none]"
    auto = AutoPolicy()
    assert create_policy(auto) is auto
    assert [label(x) for x in ("auto:warmup=2", "topk", {"rules": []}, Rules([]))] == ["auto", "topk", "rules", "rules"]


@pytest.mark.parametrize("flag, message", [
    ("auto:bandwidth=fast", "bandwidth 'fast'"),
    ("auto:warmup=0", "warmup must be >= 1"),
    ("auto:replan=3", r"replan must be 0 \(never\) or more than warmup"),
    ("auto:margin=1", r"margin must be in \[0, 1\)"),
    ("auto:speed=1", r"unknown option\(s\) speed for 'auto'; valid: bandwidth, error, headroom"),
])
def test_bad_auto_flags_raise_clear_errors(flag, message):
    with pytest.raises(SpecError, match=message):
        create_policy(flag)


def test_bad_compression_type_raises():
    with pytest.raises(SpecError, match="compression must be a flag, a mapping of rules"):
        create_policy(3)


def test_yaml_compression_may_be_rules(tmp_path, monkeypatch):
    monkeypatch.delenv(spec.ENV_VAR, raising=False)
    path = tmp_path / "c.yaml"
    path.write_text("workload: lstm\ncompression:\n  rules:\n    - {name: 'embedding.*', compression: topk}\n"
                    "  default: auto:warmup=2\n")
    config = TrainConfig.load(str(path))
    assert config.compression == {"rules": [{"name": "embedding.*", "compression": "topk"}],
                                  "default": "auto:warmup=2"}
    policy = create_policy(config.compression)
    assert isinstance(policy.default, AutoPolicy) and policy.rules[0].compression == "topk"
    assert TrainConfig.load(str(path), compression="auto").compression == "auto"  # --compression beats it


# -- auto's life cycle in one process -------------------------------------------------------------

def test_auto_warms_up_dense_then_decides_and_checkpoints(capsys):
    comm = MPICommunicator(MPI.COMM_SELF)
    policy = AutoPolicy("auto:warmup=2,bandwidth=1gbit,latency=50us")
    rng = np.random.default_rng(0)
    contexts = [TensorContext("emb", (2000, 32), 0, 1), TensorContext("w", (64, 64), 0, 1),
                TensorContext("steps", (1,), 0, 1)]

    def step():
        return [row_sparse(2000, 32, 0.02, seed=int(rng.integers(1 << 30))),
                rng.normal(size=(64, 64)).astype(np.float32), np.array([7], np.int64)]

    for _ in range(2):
        assert policy.pending
        assert [str(c) for c in step_through(policy, step(), contexts, comm)] == ["none"] * 3
    assert not policy.pending
    chosen = step_through(policy, step(), contexts, comm)
    assert (policy.link.latency, policy.link.bandwidth) == pytest.approx((50e-6, GBIT))
    assert len(chosen) == 3 and str(chosen[2]) == "none"  # integers pass through
    table = policy.assignment
    assert [row.tensor for row in table] == ["emb", "w"]  # what can be compressed
    assert 0.02 <= table[0].density <= 0.03 and table[1].density == 1.0
    assert all(row.dense_bytes == 0 for row in table)  # one rank sends nothing
    assert "decided after step 1" in capsys.readouterr().out
    restored = AutoPolicy("auto:warmup=2,bandwidth=1gbit,latency=50us")
    restored.load_state_dict(policy.state_dict())
    assert [str(c) for c in step_through(restored, step(), contexts, comm)] == [str(c) for c in chosen]
    assert restored.assignment == table


def test_auto_lists_its_decisions_under_their_flags():
    """The compressors auto hands out (what a graph traced now would run) are listed by flag, the
    decision's spelling (``powersgd:rank=1`` is ``powersgd``), and a restored decision is equal to
    the one saved."""
    comm = MPICommunicator(MPI.COMM_SELF)
    policy = AutoPolicy("auto:warmup=1,bandwidth=1gbit,latency=50us,powersgd_rank=1")
    ctx = TensorContext("w", (32, 32), 0, 1)
    step_through(policy, [np.ones((32, 32), np.float32)], [ctx], comm)
    assert all(flag == str(c) for flag, c in policy.compressors().items())
    assert str(policy.compressor(ctx)) in policy.compressors()
    restored = AutoPolicy("auto:warmup=1,bandwidth=1gbit,latency=50us,powersgd_rank=1")
    restored.load_state_dict(policy.state_dict())
    assert restored.compressor(ctx) == policy.compressor(ctx)


def test_auto_replans_on_schedule(capsys):
    comm = MPICommunicator(MPI.COMM_SELF)
    policy = AutoPolicy("auto:warmup=1,replan=3,bandwidth=1gbit,latency=50us")
    contexts = [TensorContext("w", (32, 32), 0, 1)]
    for _ in range(8):
        step_through(policy, [np.ones((32, 32), np.float32)], contexts, comm)
    out = capsys.readouterr().out
    assert [line.split("decided after step ")[1] for line in out.splitlines() if "decided after" in line] == \
        ["0)", "3)", "6)"]


def test_the_table_splits_each_collectives_latency_among_its_tensors():
    from hvdsketch.policy.cost import Measurement, shares, step_seconds

    link = Link(1e-3, 1e9)
    a, b = Measurement(0.0, 0, 0, frozenset({(0, "gather", "int64")})), Measurement(0.0, 0, 0, frozenset({(0, "gather", "int64"), (1, "average", "float32")}))
    assert shares([a, b], link) == pytest.approx([0.5e-3, 1.5e-3])
    assert step_seconds([a, b], link) == pytest.approx(2e-3)
