"""The MPI collective layer against a dense reference, on every rank.

Each rank builds every rank's input from a shared seed, so it knows the exact
dense answer and the exact bytes each algorithm must move. Values are small
multiples of 1/2, so every partial sum is exact in float16, bfloat16 and
float32 and results must match bit for bit whatever the order of additions.
"""
from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pytest

from hvdsketch.collectives import reduce
from hvdsketch.collectives.mpi import MPICommunicator, WIRE_FORMATS
from hvdsketch.collectives.sparse import (SparseVector, densify, ibitmap_or, iblock_allreduce,
                                          isparcml_allreduce, isparse_allgather)
from hvdsketch.compress.base import Message

KINDS = ["empty", "identical", "disjoint", "dense", "random", "one_rank"]
DTYPES = ["float32", "float16"]
HEADER = 24  # bytes before each SparCML message: count, size, dtype digest


@pytest.fixture(autouse=True)
def fresh_stats(mpi):
    mpi.stats.reset()


def rng_for(*key) -> np.random.Generator:
    """The same generator on every rank for the same key."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def exact_values(rng: np.random.Generator, count: int, dtype: str) -> np.ndarray:
    """Non-zero multiples of 1/2 in [-4, 4]: any sum of four is exact in every float format here."""
    return (rng.integers(1, 9, count) * rng.choice([-0.5, 0.5], count)).astype(dtype)


def supports(kind: str, n: int, size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Every rank's sorted support for one kind of overlap."""
    if kind == "empty":
        return [np.empty(0, np.int64)] * size
    if kind == "dense":
        return [np.arange(n)] * size
    if kind == "identical":
        return [np.sort(rng.choice(n, n // 5, replace=False))] * size
    if kind == "disjoint":
        perm = rng.permutation(n)
        return [np.sort(perm[q::size][: max(1, n // (3 * size))]) for q in range(size)]
    if kind == "one_rank":
        return [np.sort(rng.choice(n, n // 4, replace=False))] + [np.empty(0, np.int64)] * (size - 1)
    return [np.sort(rng.choice(n, int(rng.uniform(0, 0.6) * n), replace=False)) for _ in range(size)]


def all_inputs(kind: str, n: int, dtype: str, size: int) -> list[SparseVector]:
    rng = rng_for(kind, n, dtype, size)
    return [SparseVector(s.astype(np.int64), exact_values(rng, len(s), dtype), n)
            for s in supports(kind, n, size, rng)]


def dense_sum(vectors: list[SparseVector]) -> np.ndarray:
    return np.sum([v.to_dense().astype(np.float64) for v in vectors], axis=0).astype(vectors[0].values.dtype)


def ring_bytes(n: int, itemsize: int, size: int, r: int) -> tuple[int, int]:
    """Sent, received by rank ``r`` in a ring allreduce of ``n`` elements: every chunk but
    ``r+1`` and ``r+2`` out, every chunk but ``r`` and ``r+1`` in."""
    if size == 1:
        return 0, 0
    c = [n // size + (i < n % size) for i in range(size)]
    return ((2 * n - c[(r + 1) % size] - c[(r + 2) % size]) * itemsize,
            (2 * n - c[r] - c[(r + 1) % size]) * itemsize)


def gather_bytes(blocks: list[int], size: int, r: int) -> tuple[int, int]:
    """Sent, received by rank ``r`` in a ring allgather of per-rank blocks of ``blocks`` bytes."""
    total = sum(blocks)
    return (total - blocks[(r + 1) % size], total - blocks[r]) if size > 1 else (0, 0)


def counter(mpi, label: str) -> tuple[int, int]:
    c = mpi.stats.snapshot()[label]
    assert c["calls"] == 1
    return c["bytes_sent"], c["bytes_received"]


# --- sparse allgather ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_sparse_allgather_returns_every_rank_vector_and_counts_its_bytes(mpi, kind, dtype):
    inputs = all_inputs(kind, 1000, dtype, mpi.size)
    gathered = isparse_allgather(mpi, inputs[mpi.rank]).wait()
    assert len(gathered) == mpi.size
    for got, want in zip(gathered, inputs):
        assert np.array_equal(got.indices, want.indices) and np.array_equal(got.values, want.values)
        assert got.values.dtype == want.values.dtype
    pair = 8 + np.dtype(dtype).itemsize
    head = gather_bytes([16] * mpi.size, mpi.size, mpi.rank)
    body = gather_bytes([len(v.indices) * pair for v in inputs], mpi.size, mpi.rank)
    assert counter(mpi, "sparse_allgather") == (head[0] + body[0], head[1] + body[1])


# --- SparCML recursive doubling -------------------------------------------------------------


def sparcml_schedule(inputs: list[SparseVector], dense_at: float, r: int) -> tuple[int, int, bool]:
    """Replay recursive doubling on supports alone: rank ``r``'s bytes sent and received, and
    whether its result stays sparse."""
    size, n = len(inputs), inputs[0].size
    itemsize = inputs[0].values.itemsize
    p = 1 << (size.bit_length() - 1)

    def settle(support: set) -> tuple[set, bool]:
        return support, len(support) * (8 + itemsize) >= dense_at * n * itemsize

    def wire(state) -> int:
        support, dense = state
        return HEADER + (n * itemsize if dense else len(support) * (8 + itemsize))

    def merge(a, b):
        return (set(), True) if a[1] or b[1] else settle(a[0] | b[0])

    state = [settle(set(v.indices.tolist())) for v in inputs]
    sent, received = [0] * size, [0] * size

    def move(src: int, dst: int) -> None:
        sent[src] += wire(state[src])
        received[dst] += wire(state[src])

    for q in range(p, size):
        move(q, q - p)
        state[q - p] = merge(state[q - p], state[q])
    mask = 1
    while mask < p:
        for q in range(p):
            move(q, q ^ mask)
        state[:p] = [merge(state[q], state[q ^ mask]) for q in range(p)]
        mask <<= 1
    for q in range(p, size):
        move(q - p, q)
        state[q] = state[q - p]
    return sent[r], received[r], not state[r][1]


@pytest.mark.parametrize("dense_at", [1.0, 0.05])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_sparcml_allreduce_is_exact_and_switches_to_dense_when_it_should(mpi, kind, dtype, dense_at):
    inputs = all_inputs(kind, 1000, dtype, mpi.size)
    result = isparcml_allreduce(mpi, inputs[mpi.rank], dense_at).wait()
    sent, received, sparse = sparcml_schedule(inputs, dense_at, mpi.rank)
    assert isinstance(result, SparseVector) == sparse
    assert np.array_equal(densify(result), dense_sum(inputs))
    assert densify(result).dtype == np.dtype(dtype)
    assert counter(mpi, "sparcml") == (sent, received)


def test_sparcml_result_is_bit_identical_on_every_rank(mpi, comm):
    rng = np.random.default_rng(7 + mpi.rank)  # rank-own data with inexact float sums
    n = 5000
    idx = np.sort(rng.choice(n, 900, replace=False)).astype(np.int64)
    mine = SparseVector(idx, rng.standard_normal(900).astype(np.float32), n)
    result = densify(isparcml_allreduce(mpi, mine).wait())
    everyone = comm.allgather(result.tobytes())
    assert all(b == everyone[0] for b in everyone)


# --- OmniReduce block-sparse ---------------------------------------------------------------


@pytest.mark.parametrize("block", [1, 7, 64])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_block_allreduce_is_exact_and_moves_only_union_blocks(mpi, kind, dtype, block):
    n = 1000
    inputs = all_inputs(kind, n, dtype, mpi.size)
    result = iblock_allreduce(mpi, inputs[mpi.rank].to_dense().reshape(40, 25), block).wait()
    assert result.shape == (40, 25) and result.dtype == np.dtype(dtype)
    assert np.array_equal(result.reshape(-1), dense_sum(inputs))
    union_blocks = set().union(*[set((v.indices // block).tolist()) for v in inputs])
    moved = sum(min(block, n - b * block) for b in union_blocks)
    bitmap = ring_bytes(math.ceil(math.ceil(n / block) / 8), 1, mpi.size, mpi.rank)
    values = ring_bytes(moved, np.dtype(dtype).itemsize, mpi.size, mpi.rank)
    assert counter(mpi, "omnireduce") == (bitmap[0] + values[0], bitmap[1] + values[1])


# --- dense collectives: bitmap OR, allreduce with wire formats ------------------------------


@pytest.mark.parametrize("n", [0, 5, 8, 1001])
def test_bitmap_or_is_the_union_in_packed_bits(mpi, n):
    rng = rng_for("bits", n, mpi.size)
    bits = [rng.random(n) < 0.2 for _ in range(mpi.size)]
    union = ibitmap_or(mpi, bits[mpi.rank]).wait()
    assert union.dtype == bool and np.array_equal(union, np.any(bits, axis=0))
    assert counter(mpi, "bitmap") == ring_bytes(math.ceil(n / 8), 1, mpi.size, mpi.rank)


@pytest.mark.parametrize("wire", [None, "float16", "bfloat16"])
@pytest.mark.parametrize("n", [1, 3, 1000])
def test_sketch_sum_is_exact_in_every_wire_format(mpi, wire, n):
    rng = rng_for("cells", n, mpi.size)
    cells = [exact_values(rng, n, "float32") for _ in range(mpi.size)]
    out = mpi.iallreduce(cells[mpi.rank], "sum", wire=wire, label="sketch").wait()
    assert out.dtype == np.float32 and np.array_equal(out, np.sum(cells, axis=0))
    itemsize = 4 if wire is None else 2
    assert counter(mpi, "sketch") == ring_bytes(n, itemsize, mpi.size, mpi.rank)


def test_wire_rounding_gives_every_rank_the_same_bits(mpi, comm):
    cells = np.random.default_rng(mpi.rank).standard_normal(999).astype(np.float32)
    for wire in ("float16", "bfloat16"):
        out = mpi.iallreduce(cells, wire=wire).wait()
        everyone = comm.allgather(out.tobytes())
        assert all(b == everyone[0] for b in everyone)
        exact = comm.allreduce(cells.astype(np.float64))
        assert np.allclose(out, exact, rtol=0.05, atol=0.05 * mpi.size)


def test_bfloat16_encoding_rounds_to_nearest_even_like_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    fmt = WIRE_FORMATS["bfloat16"]
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(10000).astype(np.float32) * 1e3,
                        np.array([0.0, -0.0, np.inf, -np.inf, 3.4e38, 1e-40, 1.00390625, 1.01171875],
                                 np.float32)])
    assert np.array_equal(fmt.encode(x), x.astype(ml_dtypes.bfloat16).view(np.uint16))
    assert np.array_equal(fmt.decode(fmt.encode(x)), x.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert np.isnan(fmt.decode(fmt.encode(np.array([np.nan], np.float32))))[0]


# --- the communicator protocol -------------------------------------------------------------


def test_reduce_protocol_average_max_allgather_bor(mpi):
    size, r = mpi.size, mpi.rank
    rng = rng_for("protocol", size)
    a = [exact_values(rng, 12, "float32").reshape(3, 4) for _ in range(size)]
    b = [exact_values(rng, 5, "float32") for _ in range(size)]
    h = [exact_values(rng, 7, "float16") for _ in range(size)]
    m = [rng.integers(-50, 50, 6) for _ in range(size)]
    g = [np.full((q, 2), q, np.int32) for q in range(size)]  # rank q gathers q rows, rank 0 none
    bits = [rng.integers(0, 256, 9).astype(np.uint8) for _ in range(size)]
    messages = [Message(a[r]), Message(m[r], "max"), Message(g[r], "allgather"), Message(h[r]),
                Message(bits[r], "bor"), Message(b[r])]
    out = reduce(mpi, messages, "protocol")
    assert np.array_equal(out[0], np.sum(a, axis=0) / size) and out[0].shape == (3, 4)
    assert np.array_equal(out[1], np.max(m, axis=0))
    assert np.array_equal(out[2], np.concatenate(g)) and out[2].shape == (size * (size - 1) // 2, 2)
    assert out[3].dtype == np.float16 and np.array_equal(out[3], (np.sum(h, axis=0) / size).astype(np.float16))
    assert np.array_equal(out[4], np.bitwise_or.reduce(bits, axis=0))
    assert np.array_equal(out[5], np.sum(b, axis=0) / size)
    stats = mpi.stats.snapshot()
    assert stats["allreduce.average"]["calls"] == 2  # float32 messages fused, float16 apart
    fused, half = ring_bytes(17, 4, size, r), ring_bytes(7, 2, size, r)
    assert (stats["allreduce.average"]["bytes_sent"], stats["allreduce.average"]["bytes_received"]) == (
        fused[0] + half[0], fused[1] + half[1])
    assert (stats["bor"]["bytes_sent"], stats["bor"]["bytes_received"]) == ring_bytes(9, 1, size, r)
    head = gather_bytes([16] * size, size, r)
    rows = gather_bytes([q * 8 for q in range(size)], size, r)
    assert (stats["allgather"]["bytes_sent"], stats["allgather"]["bytes_received"]) == (
        head[0] + rows[0], head[1] + rows[1])


def test_reduce_rejects_unknown_ops_and_foreign_tensors(mpi):
    with pytest.raises(ValueError, match="valid: average, sum, max, allgather, bor"):
        reduce(mpi, [Message(np.zeros(3), "median")], "bad")
    with pytest.raises(TypeError, match="no array back-end for list"):
        reduce(mpi, [Message([1.0, 2.0])], "bad")
    with pytest.raises(ValueError, match="valid: float32, float16, bfloat16"):
        mpi.iallreduce(np.zeros(3, np.float32), wire="int8")
    with pytest.raises(ValueError, match="uint8"):
        mpi.iallreduce(np.zeros(3, np.int32), "bor")


def test_allgather_with_disagreeing_dtypes_fails_on_every_rank(mpi):
    x = np.zeros((2, 3), np.float64 if mpi.rank == 0 else np.float32)
    if mpi.size == 1:
        pytest.skip("needs two ranks")
    with pytest.raises(ValueError, match="disagree"):
        mpi.iallgatherv(x).wait()


def test_sparse_vector_rejects_bad_indices():
    with pytest.raises(ValueError, match="strictly increasing"):
        SparseVector(np.array([3, 1], np.int64), np.ones(2, np.float32), 5)
    with pytest.raises(ValueError, match="strictly increasing"):
        SparseVector(np.array([5], np.int64), np.ones(1, np.float32), 5)
    with pytest.raises(ValueError, match="int64"):
        SparseVector(np.array([1], np.int32), np.ones(1, np.float32), 5)


# --- non-blocking --------------------------------------------------------------------------


def test_collectives_overlap_and_finish_in_any_wait_order(mpi):
    inputs = all_inputs("random", 3000, "float32", mpi.size)
    mine = inputs[mpi.rank]
    handles = [isparcml_allreduce(mpi, mine), iblock_allreduce(mpi, mine.to_dense(), 16),
               isparse_allgather(mpi, mine), mpi.iallreduce(mine.to_dense(), wire="bfloat16")]
    busy = sum(not h.test() for h in handles)  # may all be done on one rank; the test only moves them on
    assert 0 <= busy <= len(handles)
    results = [h.wait() for h in reversed(handles)][::-1]
    want = dense_sum(inputs)
    assert np.array_equal(densify(results[0]), want)
    assert np.array_equal(results[1], want)
    assert np.array_equal(dense_sum(results[2]), want)
    assert np.array_equal(results[3], want)
    assert set(mpi.stats.snapshot()) == {"sparcml", "omnireduce", "sparse_allgather", "allreduce.sum"}


# --- the benchmark -------------------------------------------------------------------------


def test_bench_collectives_checks_every_sum_and_reports_counted_bytes(comm, tmp_path):
    from hvdsketch.lab.cli import build_parser

    out = tmp_path / "bench.json"
    args = build_parser().parse_args(["bench", "collectives", "--size", "4000", "--densities", "0.01,0.5",
                                      "--repeats", "1", "--warmup", "0", "--json", str(out)])
    assert args.run(args) == 0
    if comm.rank != 0:
        return
    report = json.loads(out.read_text())
    rows = {(r["density"], r["algorithm"]): r for r in report["results"]}
    assert len(rows) == 2 * 6 and report["config"]["ranks"] == comm.size
    sparse = rows[(0.01, "allgather")]
    per_rank = 40 * 12 + 16  # 1% of 4000 pairs of 12 bytes, and a 16-byte header, to every other rank
    assert sparse["received_bytes"] == (comm.size - 1) * per_rank
    assert rows[(0.5, "dense.ring")]["sent_bytes"] == max(ring_bytes(4000, 4, comm.size, r)[0] for r in range(comm.size))
    assert set(report["crossover"]) == {"allgather", "sparcml", "omnireduce", "sketch"}
