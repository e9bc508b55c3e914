"""Properties of the count sketch, the same in the numpy, PyTorch and TensorFlow back-ends, and of
its one-round exchange: sizing from the union seen last, overflow, dense fallback."""
import numpy as np
import pytest
tf = pytest.importorskip("tensorflow")  # the pinned environment has it; the newest PyTorch's has not
import torch
from hypothesis import given, settings, strategies as st

from hvdsketch.compress import RowSparse, TensorContext, create
from hvdsketch.compress.hashing import P, HashFamily, KeyHash
from hvdsketch.compress.sketch import median
from hvdsketch.compress.support import Layout
from hvdsketch.exchange.flight import Flight
from hvdsketch.compress.state import StateTable
from hvdsketch.ops import numpy as np_ops, tensorflow as tf_ops, torch as torch_ops
from tests.peer_cases import lockstep

BACKENDS = {"numpy": (np_ops, np.asarray), "torch": (torch_ops, torch.from_numpy),
            "tensorflow": (tf_ops, tf.convert_to_tensor)}


def reduce_across(per_rank):
    """Reduce each rank's list of messages position by position, by the message's op."""
    out = []
    for messages in zip(*per_rank):
        tensors = [m.tensor for m in messages]
        ops, convert = BACKENDS[type(tensors[0]).__module__.split(".")[0]]
        arrays = [np.asarray(ops.to_numpy(t)) for t in tensors]
        if messages[0].op == "bor":
            out.append(convert(np.bitwise_or.reduce(arrays)))
        else:
            mean = sum(a.astype(np.float64) for a in arrays) / len(arrays)
            out.append(convert(mean.astype(arrays[0].dtype)))
    return out


def exchange_across(compressors, tensors, ctx_of, tables=None):
    """One exchange of ``tensors`` (one per simulated rank, each with its own compressor and, where
    given, its own state table, as each rank's exchanger keeps one): every round's (op, size) of rank
    0's messages and every rank's result."""
    tables = tables or [None] * len(tensors)
    flights = [Flight(c, t, ctx_of(r), states=tables[r]) for r, (c, t) in enumerate(zip(compressors, tensors))]
    rounds, outs = lockstep(flights, reduce_across)
    return [[(m.op, int(np.prod(m.tensor.shape))) for m in messages] for messages in rounds], outs


def local_exchange(compressor, tensors, ctx):
    """``tensors`` exchanged by simulated ranks, each from ``compressor``'s initial state (its first
    plan fixed by ratio or density): every rank's messages reduced, rank 0's result."""
    ranks = [compressor] * len(tensors)
    return exchange_across(ranks, tensors, lambda r: TensorContext(ctx.name, ctx.shape, ctx.step, len(tensors), r))[1][0]


def sparse_rows(seed: int, shape=(400, 8), rows=5, integer=False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    g = np.zeros(shape, np.float32)
    picked = rng.choice(shape[0], rows, replace=False)
    g[picked] = rng.integers(-9, 10, (rows, shape[1])) if integer else rng.standard_normal((rows, shape[1]))
    return g


# -- hashes -----------------------------------------------------------------------------------

@given(st.lists(st.integers(0, 2**40), min_size=1, max_size=60), st.integers(1, 10_000), st.integers(0, 2**31),
       st.integers(1, 9))
@settings(max_examples=40, deadline=None)
def test_hashes_agree_bit_for_bit_across_backends(units, cols, seed, unit_len):
    family = HashFamily.draw(rows=3, cols=cols, seed=seed, name="w", step=4)
    u = np.asarray(units, np.int64)
    for j in range(3):
        b = family.buckets(np_ops, j, u, unit_len, 2**41)
        s = family.signs(np_ops, j, u, unit_len, "float32", 2**41)
        assert b.shape == (len(units) * unit_len,) and b.min() >= 0 and b.max() < cols
        assert set(np.unique(s)) <= {-1.0, 1.0}
        offsets = np.tile(np.arange(unit_len), len(units))
        np.testing.assert_array_equal(family.element_buckets(np_ops, j, np.repeat(u, unit_len), offsets, unit_len,
                                                             2**41), b)
        for ops, convert in (BACKENDS["torch"], BACKENDS["tensorflow"]):
            np.testing.assert_array_equal(ops.to_numpy(family.buckets(ops, j, convert(u), unit_len, 2**41)), b)
            np.testing.assert_array_equal(ops.to_numpy(family.signs(ops, j, convert(u), unit_len, "float32", 2**41)), s)


def test_hash_coefficients_change_with_name_and_step():
    base = HashFamily.draw(2, 100, seed=1, name="a", step=0)
    assert base == HashFamily.draw(2, 100, seed=1, name="a", step=0)
    assert base != HashFamily.draw(2, 100, seed=1, name="a", step=1)
    assert base != HashFamily.draw(2, 100, seed=1, name="a", step=2**32)
    assert base != HashFamily.draw(2, 100, seed=1, name="b", step=0)
    assert all(0 < c < P for h in base.units + base.offsets for c in (h.a2, h.a1, h.a0, h.s3, h.s2, h.s1, h.s0, h.fold))


def test_signs_are_balanced_and_buckets_uniform():
    family = HashFamily.draw(1, 50, seed=3)
    units = np.arange(2000, dtype=np.int64)
    signs = family.signs(np_ops, 0, units, 100, "float64", 2000)
    counts = np.bincount(family.buckets(np_ops, 0, units, 100, 2000), minlength=50)
    assert abs(signs.mean()) < 0.01
    assert counts.min() > 0.9 * counts.mean() and counts.max() < 1.1 * counts.mean()


def test_pairs_of_elements_collide_as_rarely_as_in_a_random_sketch():
    """Elements of different units, and of one unit, collide with probability about 1/cols over draws."""
    cols, draws = 64, 400
    same_unit = other_unit = 0
    for seed in range(draws):
        family = HashFamily.draw(1, cols, seed)
        b = family.buckets(np_ops, 0, np.array([3, 7], np.int64), 16, 10).reshape(2, 16)
        same_unit += b[0, 1] == b[0, 5]
        other_unit += b[0, 1] == b[1, 5]
    for hits in (same_unit, other_unit):
        assert hits < 3 * draws / cols


def test_keys_beyond_two_to_the_31_get_independent_buckets():
    """Key k and key k + p (p = 2^31 - 1) must not be tied: with a chunk id added their buckets
    were always one apart; folded into the key they agree or differ by one about 2/cols of the time."""
    h = KeyHash(*np.random.default_rng(0).integers(1, P, 8).tolist())
    cols = 1000
    keys = np.arange(5000, dtype=np.int64)
    low, high = h.bucket(keys, cols, 2**40), h.bucket(keys + P, cols, 2**40)
    tied = np.mean(((high - low) % cols == 1) | (high == low))
    assert tied < 10 / cols
    assert np.array_equal(h.bucket(keys, cols, P), h.bucket(keys, cols, 2**40))  # small keys hash alike either way


def test_median_of_an_even_number_of_rows_is_the_mean_of_the_middle_two():
    xs = [np.array([1.0, 5.0]), np.array([4.0, -1.0]), np.array([2.0, 0.0]), np.array([10.0, 2.0])]
    np.testing.assert_array_equal(median(np_ops, xs), [3.0, 1.0])
    np.testing.assert_array_equal(median(np_ops, xs[:2]), [2.5, 2.0])
    for k in (1, 3, 5):
        rng = np.random.default_rng(k)
        ys = [rng.standard_normal(50) for _ in range(k)]
        np.testing.assert_array_equal(median(np_ops, ys), np.median(ys, axis=0))


# -- the count sketch ---------------------------------------------------------------------------

@given(st.integers(0, 10_000), st.integers(0, 10_000))
@settings(max_examples=25, deadline=None)
def test_sketch_is_linear(seed_a, seed_b):
    """sketch(a) + sketch(b) == sketch(a + b) on a shared support (the AllReduce identity)."""
    a = sparse_rows(seed_a)
    b = np.where(a != 0, sparse_rows(seed_b, rows=400), 0).astype(np.float32)  # same support as a
    sketch = create("sketch:ratio=0.2,rows=3")
    ctx = TensorContext("w", a.shape, step=2)
    cells = [sketch.compress(x, ctx)[0][1].tensor for x in (a, b, a + b)]
    np.testing.assert_allclose(cells[0] + cells[1], cells[2], rtol=1e-5, atol=1e-5)


@given(st.integers(0, 10_000), st.integers(1, 4))
@settings(max_examples=25, deadline=None)
def test_recovery_is_exact_when_nonzeros_are_few(seed, ranks):
    tensors = [sparse_rows(seed + r, shape=(5000, 4), rows=2, integer=True) for r in range(ranks)]
    out = local_exchange(create("sketch:ratio=0.3,rows=5"), tensors, TensorContext("w", (5000, 4), step=seed))
    np.testing.assert_array_equal(out, sum(tensors) / ranks)


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_recovery_error_within_count_sketch_bound(rows):
    """Relative L2 error about sqrt(nnz/cols); averaged over trials it stays below 1.5x that."""
    errors, bounds = [], []
    for trial in range(20):
        g = sparse_rows(trial, shape=(2000, 16), rows=50)
        sketch = create(f"sketch:error=0.6,density=0.025,rows={rows}")
        out = local_exchange(sketch, [g], TensorContext("w", g.shape, step=trial))
        cols = sketch.plan(g.shape).cols
        errors.append(np.linalg.norm(out - g) / np.linalg.norm(g))
        bounds.append(np.sqrt(50 * 16 / cols))
    assert 0 < np.mean(errors) < 1.5 * np.mean(bounds)


@pytest.mark.parametrize("shape", [(300, 7), (1000,), (999,)])
@pytest.mark.parametrize("flag", ["sketch:error=0.7,density=0.1,rows=3,block=10",
                                  "sketch:error=0.7,density=0.1,rows=2,block=10,bitmap=float"])
def test_backends_agree(shape, flag):
    numel = int(np.prod(shape))
    g = np.resize(sparse_rows(1, shape=(numel // 10 + 1, 10), rows=4).reshape(-1), numel).reshape(shape)
    sketch = create(flag)
    ctx = TensorContext("w", shape, step=9)
    assert sketch.plan(shape) is not None
    ref = [m.tensor for m in sketch.compress(g, ctx, sketch.plan(shape))[0]]
    ref_out = local_exchange(sketch, [g], ctx)
    for name in ("torch", "tensorflow"):
        ops, convert = BACKENDS[name]
        got = [ops.to_numpy(m.tensor) for m in sketch.compress(convert(g), ctx, sketch.plan(shape))[0]]
        if len(ref) == 2:
            np.testing.assert_array_equal(got[0], ref[0])  # bitmaps bit for bit
        np.testing.assert_allclose(got[-1], ref[-1], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(ops.to_numpy(local_exchange(sketch, [convert(g)], ctx)), ref_out,
                                   rtol=1e-5, atol=1e-6)


def test_dense_gradient_goes_dense_and_round_trips():
    g = np.random.default_rng(0).standard_normal((100, 10)).astype(np.float32)
    sketch = create("sketch:error=0.5,density=1.0")
    assert sketch.plan(g.shape) is None
    np.testing.assert_array_equal(local_exchange(sketch, [g], TensorContext("w", g.shape)), g)


def test_row_sparse_input_equals_dense_input():
    g = sparse_rows(5, shape=(3000, 6), rows=7)
    rows = np.flatnonzero(np.any(g != 0, axis=1))
    sketch = create("sketch:error=0.5,density=0.05,rows=3")
    ctx = TensorContext("emb", g.shape, step=1)
    dense_out = local_exchange(sketch, [g], ctx)
    # rows listed twice (as PyTorch's uncoalesced sparse gradients do) are summed
    doubled = RowSparse(np.concatenate([rows, rows]), np.concatenate([g[rows] / 2, g[rows] / 2]), g.shape)
    sparse_out = local_exchange(sketch, [doubled], ctx)
    assert isinstance(sparse_out, RowSparse)
    np.testing.assert_allclose(sparse_out.to_dense(), dense_out, rtol=1e-6)


def test_layout_covers_every_element_once():
    for shape, block in (((10, 3), 4), ((10,), 4), ((8,), 4)):
        layout = Layout.of(shape, block)
        coords = layout.coordinates(np_ops, np.arange(layout.units))
        np.testing.assert_array_equal(np.sort(coords), np.arange(layout.numel))


# -- one round, sized from the union seen last --------------------------------------------------

def ctx_of(shape, step, size=2):
    return lambda r: TensorContext("w", shape, step, size, r)


def test_one_round_sized_from_the_union_seen_last():
    """A tensor's first exchange is dense; every later one is one round of packed bitmap (OR) and
    cells (average), sized for the previous union with headroom, on a quantized grid of sizes, so
    sizes repeat while the union stays about the same."""
    shape = (3000, 50)
    ranks = [create("sketch:error=0.5") for _ in range(2)]
    tables = [StateTable() for _ in ranks]
    seen, prev_union = [], 0
    for step in range(6):
        tensors = [sparse_rows(10 * step + r, shape=shape, rows=10 + step % 2) for r in range(2)]
        rounds, outs = exchange_across(ranks, tensors, ctx_of(shape, step), tables)
        truth = np.mean(tensors, axis=0)
        union = int(np.any(truth != 0, axis=1).sum())
        if step == 0:
            assert rounds == [[("average", 150000)]]
            np.testing.assert_allclose(outs[0], truth, rtol=1e-6)
        else:
            assert len(rounds) == 1 and [op for op, _ in rounds[0]] == ["bor", "average"]
            assert rounds[0][0][1] == 3000 // 8
            cells = rounds[0][1][1]
            bound = cells * 0.25 / 50
            assert prev_union * 1.1 <= bound <= prev_union * 1.1 * 1.25 ** 2 + 1  # headroom, quantized
            seen.append(cells)
            assert 0 < np.linalg.norm(outs[0] - truth) / np.linalg.norm(truth) < 1
            assert np.all(outs[0][~np.any(truth != 0, axis=1)] == 0)  # nothing outside the union
        np.testing.assert_array_equal(outs[0], outs[1])
        prev_union = union
    assert len(set(seen)) <= 2 and len(set(seen[1:])) == 1  # the union moved between 20 and 22 rows


def test_a_union_that_overflows_its_plan_is_seen_alike_and_resizes_the_next_step():
    shape = (40000, 20)
    ranks = [create("sketch:error=0.5,rows=3") for _ in range(3)]
    tables = [StateTable() for _ in ranks]
    small = [sparse_rows(r, shape=shape, rows=5) for r in range(3)]
    big = [sparse_rows(100 + r, shape=shape, rows=200) for r in range(3)]
    first, _ = exchange_across(ranks, small, ctx_of(shape, 0, 3), tables)
    sized_small, _ = exchange_across(ranks, small, ctx_of(shape, 1, 3), tables)
    overflow, outs = exchange_across(ranks, big, ctx_of(shape, 2, 3), tables)  # 600 rows in a plan for ~15
    assert overflow == sized_small
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])
    assert len({t.get("w", c).level for t, c in zip(tables, ranks)}) == 1
    resized, outs = exchange_across(ranks, big, ctx_of(shape, 3, 3), tables)
    truth = np.mean(big, axis=0)
    assert resized[0][1][1] > 30 * sized_small[0][1][1]
    assert np.linalg.norm(outs[0] - truth) / np.linalg.norm(truth) < 0.5


def test_a_tensor_found_dense_is_counted_again_only_every_recheck_exchanges():
    """A dense tensor goes dense; the next recheck exchanges send it dense without a bitmap, and the
    last of them counts its dense average again, so a now sparse tensor is sketched after it."""
    rng = np.random.default_rng(0)
    shape = (3000, 50)
    dense = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    sparse = [sparse_rows(r, shape=shape, rows=10) for r in range(2)]
    ranks = [create("sketch:error=0.5,recheck=3") for _ in range(2)]
    tables = [StateTable() for _ in ranks]
    one_dense = [[("average", 150000)]]
    assert exchange_across(ranks, dense, ctx_of(shape, 0), tables)[0] == one_dense  # first: dense, counted
    for step in (1, 2, 3):  # latched dense: dense even when sparse; the third counts the result
        rounds, outs = exchange_across(ranks, sparse, ctx_of(shape, step), tables)
        assert rounds == one_dense
        np.testing.assert_allclose(outs[0], np.mean(sparse, axis=0), rtol=1e-6)
    assert [op for op, _ in exchange_across(ranks, sparse, ctx_of(shape, 4), tables)[0][0]] == ["bor", "average"]
    with pytest.raises(ValueError, match="recheck"):
        create("sketch:recheck=0")


def test_a_dense_layer_never_goes_through_an_overfilled_sketch():
    """Sized from density=0.05, a dense layer's first step is a sketch; from the next step on, the
    union it showed sends it dense."""
    rng = np.random.default_rng(1)
    shape = (500, 64)
    dense = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    ranks = [create("sketch:error=0.5,density=0.05") for _ in range(2)]
    tables = [StateTable() for _ in ranks]
    assert [op for op, _ in exchange_across(ranks, dense, ctx_of(shape, 0), tables)[0][0]] == ["bor", "average"]
    for step in (1, 2):
        rounds, outs = exchange_across(ranks, dense, ctx_of(shape, step), tables)
        assert rounds == [[("average", 500 * 64)]]
        np.testing.assert_allclose(outs[0], np.mean(dense, axis=0), rtol=1e-6)


@pytest.mark.parametrize("wire", ["float16", "bfloat16"])
def test_cells_travel_in_a_narrow_wire_format(wire):
    shape = (3000, 16)
    g = [sparse_rows(r, shape=shape, rows=2, integer=True) for r in range(2)]
    flag = f"sketch:ratio=0.5,rows=5,wire={wire}"
    rounds, outs = exchange_across([create(flag) for _ in range(2)], g, ctx_of(shape, 1))
    cells = create(flag).compress(g[0], TensorContext("w", shape, 1))[0][1]
    assert str(cells.tensor.dtype) == wire and rounds[0][1][1] == 5 * 4800
    np.testing.assert_array_equal(outs[0], np.mean(g, axis=0))  # small integers: still exact


def test_float_bitmap_makes_one_averaged_message_for_horovods_drop_in_path():
    sketch = create("sketch:density=0.05")
    assert not sketch.drop_in and sketch.one_message().drop_in and sketch.one_message().bitmap == "float"
    g = sparse_rows(3, shape=(1000, 8), rows=6, integer=True)
    (message,), _ = sketch.one_message().compress(g, TensorContext("w", g.shape))
    assert message.op == "average" and message.tensor.shape == (1000 + 50 * 8 * 4,)


def test_drop_in_path_infers_steps_and_sizes_tensors_of_one_shape_apart():
    """Horovod compresses a step's gradients, then decompresses them: a compress after a decompress is
    the next step (new hash seeds), and the k-th tensor of a shape within a step keeps its own plan, so a
    dense output layer of the embedding's shape goes dense while the embedding is sketched."""
    from hvdsketch.dropin import DropInCompression

    shape = (4000, 16)
    embedding = sparse_rows(1, shape=shape, rows=20)
    output = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    compression = DropInCompression("sketch:error=0.5")
    sizes = []
    for step in range(3):
        sent = [compression.compress(g) for g in (embedding, output)]
        assert [ctx[1].name for _, ctx in sent] == [f"shape{shape}#0", f"shape{shape}#1"]
        assert all(ctx[1].step == step for _, ctx in sent)
        sizes.append([payload.size for payload, _ in sent])
        outs = [compression.decompress(payload, ctx) for payload, ctx in sent]
        np.testing.assert_allclose(outs[1], output, rtol=1e-6)  # dense, exactly
    dense = output.size + 6  # three tags and their squares ride on float32 payloads
    assert sizes[0] == [dense, dense]  # each tensor's first exchange is dense
    assert sizes[1][1] == sizes[2][1] == dense and sizes[1][0] == sizes[2][0] < dense / 4
