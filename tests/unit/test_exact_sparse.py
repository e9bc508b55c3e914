"""The exact sparse methods, union, allgather and balanced: what they send, and when they go dense."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hvdsketch.ops import numpy as np_ops

from hvdsketch.compress import RowSparse, TensorContext, create
from hvdsketch.exchange.flight import Flight
from hvdsketch.compress.state import StateTable
from tests import exact_cases
from tests.peer_cases import lockstep, reduce_in_process

SHAPE = (5000, 16)


def row_sparse(rank: int, rows: int, seed: int = 0, repeat: int = 1) -> RowSparse:
    """``rows`` distinct rows of small integers, each given ``repeat`` times (as autograd gives a
    word that occurs several times in a batch)."""
    rng = np.random.default_rng([seed, rank])
    picked = rng.choice(SHAPE[0], rows, replace=False)
    values = rng.integers(-4, 5, (rows, SHAPE[1])).astype(np.float32)
    return RowSparse(np.tile(picked, repeat), np.tile(values / repeat, (repeat, 1)), SHAPE)


def run(flag, tensors, step=0, tables=None):
    """One exchange over simulated ranks (each with its own state table, where given): rank 0's
    messages per round and every rank's result."""
    tables = tables or [None] * len(tensors)
    flights = [Flight(create(flag), t, TensorContext("emb", SHAPE, step, len(tensors), r), states=tables[r])
               for r, t in enumerate(tensors)]
    return lockstep(flights, lambda pending: [reduce_in_process(same) for same in zip(*pending)])


@pytest.mark.parametrize("flag", ["union", "allgather", "balanced"])
@pytest.mark.parametrize("size", [2, 3, 4])
def test_equal_to_the_dense_average_and_stay_row_sparse(flag, size):
    tensors = [row_sparse(r, 40, repeat=2) for r in range(size)]
    truth = sum(t.to_dense() for t in tensors) / size
    _, outs = run(flag, tensors)
    for out in outs:
        assert isinstance(out, RowSparse)
        np.testing.assert_array_equal(out.to_dense(), truth)
        np.testing.assert_array_equal(out.indices, np.flatnonzero(np.any(truth != 0, axis=1)))


def test_allgather_sends_each_rank_coalesced_rows_with_int32_indices():
    """Horovod's sparse path gathers a word's row once per occurrence, with an int64 index; here a row
    is sent once, its index in 4 bytes (and its values in 2 with wire=float16)."""
    tensors = [row_sparse(r, 40, repeat=3) for r in range(2)]
    horovod = 3 * 40 * (8 + 16 * 4)
    (messages,), _ = run("allgather", tensors)
    assert [(m.op, str(m.tensor.dtype), m.tensor.shape) for m in messages] == [
        ("allgather", "int32", (40,)), ("allgather", "float32", (40, 16))]
    assert sum(m.tensor.nbytes for m in messages) == 40 * (4 + 16 * 4) < horovod / 3
    (half,), outs = run("allgather:wire=float16", tensors)
    assert sum(m.tensor.nbytes for m in half) == 40 * (4 + 16 * 2)
    np.testing.assert_array_equal(outs[0].to_dense(), sum(t.to_dense() for t in tensors) / 2)  # small integers


def test_union_sends_the_union_once_after_its_bitmap():
    tensors = [row_sparse(r, 40) for r in range(3)]
    union = np.unique(np.concatenate([t.indices for t in tensors])).size
    rounds, _ = run("union", tensors)
    assert [[(m.op, m.tensor.size) for m in messages] for messages in rounds] == [
        [("bor", SHAPE[0] // 8)], [("average", union * SHAPE[1])]]


@pytest.mark.parametrize("flag", ["union", "allgather"])
def test_a_dense_tensor_goes_dense_and_is_counted_again_every_recheck_exchanges(flag):
    rng = np.random.default_rng(0)
    dense = [torch.from_numpy(rng.standard_normal(SHAPE).astype(np.float32)) for _ in range(2)]
    flag, tables = f"{flag}:recheck=2", [StateTable() for _ in range(2)]
    first, _ = run(flag, dense, 0, tables)  # tried sparse once: the bitmap, or the gather, shows it dense
    assert [[m.op for m in r] for r in first] == ([["bor"], ["average"]] if flag.startswith("union") else
                                                  [["allgather", "allgather"]])
    for step in (1, 2):  # latched dense, one round; the second counts its result again
        rounds, outs = run(flag, dense, step, tables)
        assert [[(m.op, m.tensor.numel()) for m in r] for r in rounds] == [[("average", SHAPE[0] * SHAPE[1])]]
        np.testing.assert_allclose(outs[0].numpy(), ((dense[0] + dense[1]) / 2).numpy(), rtol=1e-6)
    rounds, _ = run(flag, dense, 3, tables)  # still dense when counted: latched again, no bitmap
    assert [[m.op for m in r] for r in rounds] == [["average"]]


def test_union_error_above_one_sends_fewer_cells_than_the_union_and_keeps_what_it_missed():
    from hvdsketch.memory import Memory

    tensors = [row_sparse(r, 40) for r in range(2)]
    union = np.unique(np.concatenate([t.indices for t in tensors])).size
    memories = [Memory() for _ in range(2)]
    flights = [Flight(create("union:error=2"), t, TensorContext("emb", SHAPE, 0, 2, r), m)
               for r, (t, m) in enumerate(zip(tensors, memories))]
    rounds, outs = lockstep(flights, lambda pending: [reduce_in_process(same) for same in zip(*pending)])
    assert rounds[1][0].tensor.size == int(np.ceil(union * SHAPE[1] / 4))
    for memory, t in zip(memories, tensors):
        held = memory.state_dict()["slots"]["emb"]
        assert set(held["i"].tolist()) <= set(t.indices.tolist())
    with pytest.raises(ValueError, match="error must be > 1"):
        create("union:error=0.5")


def simulate(flag, scenario, size, convert=np.asarray):
    """Every rank's result and rank by rank messages of ``scenario`` exchanged in process."""
    shape = exact_cases.SHAPE
    flights = [Flight(create(flag), exact_cases.row_sparse(scenario, r, size, convert),
                      TensorContext("emb", shape, 0, size, r)) for r in range(size)]
    sent = [[] for _ in range(size)]
    for r, f in enumerate(flights):  # record every rank's messages, not only rank 0's
        exchange = f.advance

        def advance(reduced, r=r, f=f, exchange=exchange):
            sent[r].append(f.messages)
            return exchange(reduced)
        f.advance = advance
    _, outs = lockstep(flights)
    return outs, sent


@pytest.mark.parametrize("flag", exact_cases.FLAGS)
@pytest.mark.parametrize("scenario", exact_cases.SCENARIOS)
@pytest.mark.parametrize("size", [2, 3, 4])
def test_balanced_is_the_dense_average_in_every_scenario(flag, scenario, size):
    outs, _ = simulate(flag, scenario, size)
    truth = exact_cases.dense_average(scenario, size)
    for out in outs:
        assert isinstance(out, RowSparse)
        np.testing.assert_array_equal(out.to_dense(), truth)


@pytest.mark.parametrize("scenario", ["disjoint", "overlap", "one_empty", "union_is_every_row", "every_row_everywhere"])
@pytest.mark.parametrize("size", [2, 3, 4])
def test_balanced_sends_the_lower_bound_of_rows(scenario, size):
    """Rows leaving the ranks, all together: sum over rows of (m - 1) in the alltoall (each owner
    touched its rows) and (N - 1) u in the gather: N z + (N - 2) u, the bound times N."""
    outs, sent = simulate("balanced", scenario, size)
    width = exact_cases.SHAPE[1]
    rows = [exact_cases.rows_of(scenario, r, size) for r in range(size)]
    z, u = sum(map(len, rows)), len(np.unique(np.concatenate(rows)))
    shipped = 0
    for r in range(size):
        alltoall, gather = sent[r][1][0], sent[r][2][0]
        assert alltoall.op == "alltoall" and sum(alltoall.splits) == alltoall.tensor.size
        shipped += (alltoall.tensor.size - alltoall.splits[r]) // width + (size - 1) * gather.tensor.size // width
    assert shipped == z + (size - 2) * u
    if scenario in ("overlap", "every_row_everywhere"):  # every rank owns u / N rows, give or take one
        owned = [sent[r][2][0].tensor.size // width for r in range(size)]
        assert max(owned) - min(owned) <= 1


def test_balanced_codes_each_ranks_rows_as_the_smaller_of_bitmap_and_deltas():
    from hvdsketch.compress import rowcode

    # (units, n, header, bytes): 4 rows of 100000, gaps up to 691: 2-byte deltas, not 12500 bitmap bytes;
    # every other row of 600: the 75-byte bitmap, not 300 one-byte deltas; no rows: no bytes
    for units, n, header, size in [([3, 9, 700, 701], 100_000, (2, 4), 8), (range(0, 600, 2), 600, (0, 300), 75),
                                   ([], 600, (1, 0), 0), ([0, 255, 511], 10_000, (2, 3), 6), ([0, 255], 10_000, (1, 2), 2)]:
        units = np.array(list(units), np.int64)
        got, code = rowcode.encode(np_ops, units, n)
        assert (got, code.dtype, code.size, rowcode.size(*got, n)) == (header, np.uint8, size, size)
        np.testing.assert_array_equal(rowcode.decode(np_ops, *got, code, n), units)


def test_balanced_makes_every_tensor_on_the_gradients_device():
    """With torch's default device 'meta', a tensor made without the gradient's device would not mix
    with the CPU gradient: the exchange runs, and is exact."""
    outs = None
    with torch.device("meta"):
        outs, _ = simulate("balanced:wire=float16", "union_is_every_row", 3, torch.from_numpy)
    for out in outs:
        assert out.values.device.type == "cpu"
        np.testing.assert_array_equal(out.to_dense().numpy(), exact_cases.dense_average("union_is_every_row", 3))


def test_auto_prices_balanced_at_the_bound_plus_its_index_and_picks_it_where_it_sends_least():
    """4 ranks, 40 rows of 4000 each, at most 160 in the union: balanced sends the bound's values,
    z + (N - 2) u / N rows, plus its rows' code (2-byte deltas, a 16-byte header) to 3 ranks; on a
    slow link that is the fewest bytes of the exact candidates, so auto takes it."""
    from hvdsketch.policy.auto import AutoPolicy
    from hvdsketch.policy.cost import Link, lower_bound

    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(4000, 40, replace=False))
    g = RowSparse(rows, rng.standard_normal((40, 64)).astype(np.float32), (4000, 64))
    policy, ctx = AutoPolicy(), TensorContext("g", (4000, 64), 0, 4)
    measured = policy._measure(create("balanced"), g, ctx, union=0.04, touched=0.01)
    on_rank_2 = policy._measure(create("balanced"), g, TensorContext("g", (4000, 64), 0, 4, 2), union=0.04)
    assert on_rank_2.wire == int(lower_bound(4000, 256, 40, 160, 4)[0] + 3 * (40 * 2 + 16))  # run alone, as rank 0 of 1
    values, _ = lower_bound(4000, 64 * 4, 40, 160, 4)
    assert values == 64 * 4 * (40 + 2 * 160 / 4)
    assert measured.wire == int(values + 3 * (40 * 2 + 16))
    candidates = policy.candidates((4000, 64), "float32", 0.01, 0.04, row_sparse=True)
    assert "balanced" in [str(c) for c in candidates]
    wires = {str(c): policy._measure(c, g, ctx, union=0.04, touched=0.01).wire for c in candidates}
    assert wires["balanced"] < min(wires["allgather"], wires["union"])
    costs = [policy._measure(c, g, ctx, union=0.04, touched=0.01) for c in candidates]
    slow = Link(latency=0.0, bandwidth=1e3)  # bytes dominate every compute time
    assert str(candidates[policy.choose(costs, slow)]) == "balanced"
