"""Properties of the count sketch, the same in the numpy, PyTorch and TensorFlow back-ends."""
import numpy as np
import pytest
import tensorflow as tf
import torch
from hypothesis import given, settings, strategies as st

from hvdsketch.compress import RowSparse, TensorContext, create
from hvdsketch.compress.hashing import P, HashFamily
from hvdsketch.compress.support import Layout
from hvdsketch.exchange import Flight
from hvdsketch.ops import numpy as np_ops, tensorflow as tf_ops, torch as torch_ops
from tests.peer_cases import lockstep

BACKENDS = {"numpy": (np_ops, np.asarray), "torch": (torch_ops, torch.from_numpy),
            "tensorflow": (tf_ops, tf.convert_to_tensor)}


def local_exchange(compressor, tensors, ctx):
    """Each 'rank' compresses, payloads are averaged in float64, every rank decompresses."""
    states, payloads = [], []
    for t in tensors:
        (message,), state = compressor.compress(t, ctx)
        payloads.append(message.tensor)
        states.append(state)
    ops, convert = BACKENDS[type(payloads[0]).__module__.split(".")[0]]
    mean = sum(np.asarray(ops.to_numpy(p), np.float64) for p in payloads) / len(payloads)
    reduced = convert(mean.astype(np.float32))
    return compressor.decompress([reduced], states[0], ctx)


def sparse_rows(seed: int, shape=(400, 8), rows=5, integer=False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    g = np.zeros(shape, np.float32)
    picked = rng.choice(shape[0], rows, replace=False)
    g[picked] = rng.integers(-9, 10, (rows, shape[1])) if integer else rng.standard_normal((rows, shape[1]))
    return g


@given(st.lists(st.integers(0, 2**40), min_size=1, max_size=200), st.integers(1, 10_000), st.integers(0, 2**31))
@settings(max_examples=50, deadline=None)
def test_hashes_agree_bit_for_bit_across_backends(coords, cols, seed):
    family = HashFamily.draw(rows=3, cols=cols, seed=seed, name="w", step=4)
    c = np.asarray(coords, np.int64)
    for j in range(3):
        b = family.bucket(np_ops, j, c)
        s = family.sign(np_ops, j, c, "float32")
        assert b.min() >= 0 and b.max() < cols and set(np.unique(s)) <= {-1.0, 1.0}
        for ops, convert in (BACKENDS["torch"], BACKENDS["tensorflow"]):
            np.testing.assert_array_equal(ops.to_numpy(family.bucket(ops, j, convert(c))), b)
            np.testing.assert_array_equal(ops.to_numpy(family.sign(ops, j, convert(c), "float32")), s)


def test_hash_coefficients_change_with_name_and_step():
    base = HashFamily.draw(2, 100, seed=1, name="a", step=0)
    assert base == HashFamily.draw(2, 100, seed=1, name="a", step=0)
    assert base != HashFamily.draw(2, 100, seed=1, name="a", step=1)
    assert base != HashFamily.draw(2, 100, seed=1, name="b", step=0)
    assert all(0 < c < P for row in base.coefficients for c in row)


def test_signs_are_balanced_and_buckets_uniform():
    family = HashFamily.draw(1, 50, seed=3)
    coords = np.arange(200_000, dtype=np.int64)
    signs = family.sign(np_ops, 0, coords, "float64")
    counts = np.bincount(family.bucket(np_ops, 0, coords), minlength=50)
    assert abs(signs.mean()) < 0.01
    assert counts.min() > 0.9 * counts.mean() and counts.max() < 1.1 * counts.mean()


@given(st.integers(0, 10_000), st.integers(0, 10_000))
@settings(max_examples=25, deadline=None)
def test_sketch_is_linear(seed_a, seed_b):
    """sketch(a) + sketch(b) == sketch(a + b) on a shared support (the AllReduce identity);
    the bitmap part of the payload is an indicator, not summed, so only the cells are compared."""
    a = sparse_rows(seed_a)
    b = np.where(a != 0, sparse_rows(seed_b, rows=400), 0).astype(np.float32)  # same support as a
    sketch = create("sketch:ratio=0.2,rows=3")
    ctx = TensorContext("w", a.shape, step=2)
    (pa,), _ = sketch.compress(a, ctx)
    (pb,), _ = sketch.compress(b, ctx)
    (pab,), _ = sketch.compress(a + b, ctx)
    units = sketch.plan(a.shape).layout.units
    np.testing.assert_allclose(pa.tensor[units:] + pb.tensor[units:], pab.tensor[units:], rtol=1e-5, atol=1e-5)


@given(st.integers(0, 10_000), st.integers(1, 4))
@settings(max_examples=25, deadline=None)
def test_recovery_is_exact_when_nonzeros_are_few(seed, ranks):
    tensors = [sparse_rows(seed + r, shape=(5000, 4), rows=2, integer=True) for r in range(ranks)]
    sketch = create("sketch:ratio=0.3,rows=5")
    out = local_exchange(sketch, tensors, TensorContext("w", (5000, 4), step=seed))
    np.testing.assert_array_equal(out, sum(tensors) / ranks)


@pytest.mark.parametrize("rows", [1, 3])
def test_recovery_error_within_count_sketch_bound(rows):
    """Relative L2 error about sqrt(nnz/cols); averaged over trials it stays below 1.5x that."""
    errors, bounds = [], []
    for trial in range(20):
        g = sparse_rows(trial, shape=(2000, 16), rows=50)
        sketch = create(f"sketch:error=0.6,density=0.05,rows={rows}")
        out = local_exchange(sketch, [g], TensorContext("w", g.shape, step=trial))
        cols = sketch.plan(g.shape).cols
        errors.append(np.linalg.norm(out - g) / np.linalg.norm(g))
        bounds.append(np.sqrt(50 * 16 / cols))
    assert 0 < np.mean(errors) < 1.5 * np.mean(bounds)


@pytest.mark.parametrize("shape", [(300, 7), (1000,), (999,)])
def test_backends_agree(shape):
    numel = int(np.prod(shape))
    g = np.resize(sparse_rows(1, shape=(numel // 10 + 1, 10), rows=4).reshape(-1), numel).reshape(shape)
    sketch = create("sketch:error=0.7,density=0.1,rows=3,block=10")
    ctx = TensorContext("w", shape, step=9)
    ref_payload = sketch.compress(g, ctx)[0][0].tensor
    ref = local_exchange(sketch, [g], ctx)
    assert sketch.plan(shape) is not None
    units = sketch.plan(shape).layout.units
    for name in ("torch", "tensorflow"):
        ops, convert = BACKENDS[name]
        payload = ops.to_numpy(sketch.compress(convert(g), ctx)[0][0].tensor)
        np.testing.assert_array_equal(payload[:units], ref_payload[:units])  # bitmaps bit for bit
        np.testing.assert_allclose(payload, ref_payload, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(ops.to_numpy(local_exchange(sketch, [convert(g)], ctx)), ref, rtol=1e-5, atol=1e-6)


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


def reduce_across(per_rank):
    """Reduce each rank's list of messages position by position, by the message's op."""
    out = []
    for messages in zip(*per_rank):
        tensors = [m.tensor for m in messages]
        out.append(np.bitwise_or.reduce(tensors) if messages[0].op == "bor" else np.mean(tensors, axis=0))
    return out


def exchange_across(compressors, tensors, ctx):
    """One exchange of ``tensors`` (one per simulated rank, each with its own compressor): the
    rounds' message sizes and every rank's result."""
    rounds, outs = lockstep([Flight(c, t, ctx) for c, t in zip(compressors, tensors)], reduce_across)
    return [[m.tensor.size for m in messages] for messages in rounds], outs


def test_a_tensor_found_dense_is_counted_again_only_every_recheck_exchanges():
    """After a bitmap round that sends a tensor dense, the next recheck-1 exchanges send it dense at
    once (one round, no bitmap); the recheck-th ORs the bitmaps again and a now sparse tensor is sketched."""
    rng = np.random.default_rng(0)
    dense = [rng.standard_normal((3000, 50)).astype(np.float32) for _ in range(2)]
    sparse = [sparse_rows(r, shape=(3000, 50), rows=10) for r in range(2)]
    union = int(np.any((sparse[0] != 0) | (sparse[1] != 0), axis=1).sum())
    ranks = [create("sketch:error=0.5,recheck=3") for _ in range(2)]
    ctx = TensorContext("w", (3000, 50), step=1, world_size=2)
    assert exchange_across(ranks, dense, ctx)[0] == [[3000 // 8], [150000]]  # bitmaps ORed, sent dense
    for tensors in (dense, sparse):  # no bitmap round: dense, even when sparse
        rounds, outs = exchange_across(ranks, tensors, ctx)
        assert rounds == [[150000]]
        np.testing.assert_allclose(outs[0], np.mean(tensors, axis=0), rtol=1e-6)
    assert exchange_across(ranks, sparse, ctx)[0] == [[3000 // 8], [union * 50 * 4]]  # cols = nnz / 0.5^2
    every_time = [create("sketch:error=0.5,recheck=1") for _ in range(2)]
    for _ in range(2):
        assert exchange_across(every_time, dense, ctx)[0] == [[3000 // 8], [150000]]
    with pytest.raises(ValueError, match="recheck"):
        create("sketch:recheck=0")


def test_agreed_sizing_sends_dense_tensors_dense_and_sparse_ones_sketched():
    """Unset density: the ranks first OR their bitmaps, packed 8 units per byte (2 simulated ranks),
    then send a sketch sized for the union they now share, or the dense tensor."""
    assert not create("sketch:error=0.5").drop_in
    rng = np.random.default_rng(0)
    dense = [rng.standard_normal((300, 50)).astype(np.float32) for _ in range(2)]
    sparse = [sparse_rows(r, shape=(3000, 50), rows=10) for r in range(2)]
    for tensors, expect_dense in ((dense, True), (sparse, False)):
        ctx = TensorContext("w", tensors[0].shape, step=1, world_size=2)
        gens = [create("sketch:error=0.5").exchange(t, ctx) for t in tensors]  # a compressor per rank
        bitmaps = [next(g).messages for g in gens]
        assert all([m.op for m in b] == ["bor"] for b in bitmaps)
        for b, t in zip(bitmaps, tensors):
            np.testing.assert_array_equal(b[0].tensor, np.packbits(np.any(t != 0, axis=1)))
        payloads = [g.send(reduce_across(bitmaps)).messages for g in gens]
        assert len({tuple(m.tensor.size for m in p) for p in payloads}) == 1  # both ranks sized alike
        if expect_dense:
            assert [m.tensor.size for m in payloads[0]] == [tensors[0].size]
        else:
            union = np.any((tensors[0] != 0) | (tensors[1] != 0), axis=1).sum()
            assert [(m.op, m.tensor.size) for m in payloads[0]] == [("average", union * 50 * 4)]
        reduced = reduce_across(payloads)
        outs = []
        for g in gens:
            with pytest.raises(StopIteration) as done:
                g.send(reduced)
            outs.append(done.value.value)
        truth = np.mean(tensors, axis=0)
        if expect_dense:
            np.testing.assert_allclose(outs[0], truth, rtol=1e-6)
        else:
            assert 0 < np.linalg.norm(outs[0] - truth) / np.linalg.norm(truth) < 1.5
            assert np.all(outs[0][~np.any(truth != 0, axis=1)] == 0)
        np.testing.assert_array_equal(outs[0], outs[1])
