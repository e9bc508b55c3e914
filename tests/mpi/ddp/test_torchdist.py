"""The torch.distributed communicator on its own: every op, sizes differing by rank, fusion, and
the bytes Horovod's communicator would count for the same messages."""
import time

import pytest
import torch
import torch.distributed as dist

from hvdsketch.collectives import reduce, torchdist
from hvdsketch.collectives.stats import alltoall_bytes, ring_allreduce_bytes
from hvdsketch.collectives.torchdist import GATHERED_BELOW, TorchDistCommunicator
from hvdsketch.compress.base import Message
from tests.mpi.ddp.cases import counting


@pytest.fixture
def comm():
    return TorchDistCommunicator()


def test_reductions_of_one_round(comm):
    rank, size = comm.rank, comm.size
    x = torch.arange(6, dtype=torch.float32) * (rank + 1)
    ints = torch.tensor([rank, 2 * rank + 1])
    bits = torch.tensor([1 << rank % 8, 0], dtype=torch.uint8)
    average, summed, most, integer, ored = reduce(comm, [
        Message(x, "average"), Message(x.reshape(2, 3), "sum"), Message(-x, "max"), Message(ints, "average"),
        Message(bits, "bor")], "round")
    scale = sum(r + 1 for r in range(size))
    torch.testing.assert_close(average, torch.arange(6, dtype=torch.float32) * scale / size)
    torch.testing.assert_close(summed, torch.arange(6, dtype=torch.float32).reshape(2, 3) * scale)
    assert torch.equal(most, -torch.arange(6, dtype=torch.float32))
    assert torch.equal(integer, torch.tensor([sum(range(size)) // size, sum(2 * r + 1 for r in range(size)) // size]))
    assert torch.equal(ored, torch.tensor([sum({1 << r % 8 for r in range(size)}), 0], dtype=torch.uint8))
    counted = comm.stats.snapshot()
    assert counted["allreduce.average"]["calls"] == 2  # one per dtype: float32, int64
    assert counted["allreduce.average"]["bytes_sent"] == ring_allreduce_bytes(24, size) + ring_allreduce_bytes(16, size)
    assert counted["bor"] == {"calls": 1, "bytes_sent": 2 * (size - 1), "bytes_received": 2 * (size - 1)}


def test_allgathers_of_rows_differing_by_rank(comm):
    rank, size = comm.rank, comm.size
    rows = torch.full((rank + 1, 3), float(rank))
    empty = torch.zeros((0, 2), dtype=torch.int64)
    gathered, none = reduce(comm, [Message(rows, "allgather"), Message(empty, "allgather")], "gather")
    assert torch.equal(gathered, torch.cat([torch.full((r + 1, 3), float(r)) for r in range(size)]))
    assert none.shape == (0, 2)
    mine = 12 * (rank + 1)
    assert comm.stats.snapshot()["allgather"]["bytes_sent"] == mine * (size - 1)
    assert comm.stats.snapshot()["allgather"]["bytes_received"] == 12 * sum(r + 1 for r in range(size)) - mine


def test_gathers_of_every_dtype_travel_in_one_allgather_their_counts_with_the_integers(comm, monkeypatch):
    """A round of a step tag (``max``, int64), an int32 ``sum``, allgathers of rows differing by rank in
    three dtypes (one empty on rank 0) and a bitmap of odd length: two all_gathers in all (the counts
    with the integers, then the rows) and no all_reduce, every result exact."""
    rank, size = comm.rank, comm.size
    calls = counting(monkeypatch)
    tag = torch.tensor([7, rank])
    halves = torch.full((rank + 1, 3), rank + 0.5, dtype=torch.float16)
    indices = torch.arange(rank, dtype=torch.int32) + 10 * rank
    rows = torch.full((2 * rank, 5), float(rank))
    bits = torch.tensor([1 << rank % 8, 0, 1], dtype=torch.uint8)
    votes = torch.tensor([1, rank, -3], dtype=torch.int32)
    most, got_halves, got_indices, got_rows, ored, summed = reduce(comm, [
        Message(tag, "max"), Message(halves, "allgather"), Message(indices, "allgather"),
        Message(rows, "allgather"), Message(bits, "bor"), Message(votes, "sum")], "round")
    assert torch.equal(most, torch.tensor([7, size - 1]))
    assert torch.equal(summed, torch.tensor([size, sum(range(size)), -3 * size], dtype=torch.int32))
    assert torch.equal(got_halves, torch.cat([torch.full((r + 1, 3), r + 0.5, dtype=torch.float16) for r in range(size)]))
    assert torch.equal(got_indices, torch.cat([torch.arange(r, dtype=torch.int32) + 10 * r for r in range(size)]))
    assert torch.equal(got_rows, torch.cat([torch.full((2 * r, 5), float(r)) for r in range(size)]))
    assert torch.equal(ored, torch.tensor([sum({1 << r % 8 for r in range(size)}), 0, 1], dtype=torch.uint8))
    assert calls == {"all_gather": 2, "all_reduce": 0}


def sparse_rows(rank: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s ``count`` row indices and rows, told apart by rank."""
    return (torch.arange(count, dtype=torch.int32) + 1000 * rank,
            torch.arange(3 * count, dtype=torch.float32).reshape(count, 3) + 100 * rank)


def test_rows_differing_by_rank_go_padded_to_the_bound_their_last_launch_set(comm, monkeypatch):
    """A row-sparse gradient's allgather under one name, step after step: its first launch sends the
    row counts first (two all_gathers); the next ones go in one, padded to the most rows a rank sent
    in its last launches; a rank whose rows outgrow that bound sends the rest in one more, and an empty
    launch does not lower it. The step tag rides along; every result exact."""
    rank, size = comm.rank, comm.size
    calls = counting(monkeypatch)
    steps = [[r + 1 for r in range(size)], [r + 1 for r in range(size)], [1] * (size - 1) + [4 * size], [0] * size,
             [2 * size] * size]
    gathers = []
    for counts in steps:
        before = calls["all_gather"]
        indices, rows = sparse_rows(rank, counts[rank])
        most, got_indices, got_rows = reduce(comm, [Message(torch.tensor([rank]), "max"),
                                                    Message(indices, "allgather"), Message(rows, "allgather")], "embedding")
        assert torch.equal(most, torch.tensor([size - 1]))
        assert torch.equal(got_indices, torch.cat([sparse_rows(r, n)[0] for r, n in enumerate(counts)]))
        assert torch.equal(got_rows, torch.cat([sparse_rows(r, n)[1] for r, n in enumerate(counts)]))
        gathers.append(calls["all_gather"] - before)
    assert gathers == [2, 1, 2, 1, 1] and calls["all_reduce"] == 0
    assert comm.stats.snapshot()["allgather"]["bytes_sent"] == sum(
        (4 + 12) * counts[rank] * (size - 1) for counts in steps)  # counted as sent, not as padded


def test_rows_past_a_bound_go_before_the_next_launch(comm):
    """A bounded launch that rank 0 outgrows, then another launch before its results are read: the rest
    of its rows go first, on every rank, and both come back exact."""
    rank, size = comm.rank, comm.size
    reduce(comm, [Message(sparse_rows(rank, 1)[1], "allgather")], "table")
    grown = [9 if r == 0 else 1 for r in range(size)]
    first = comm.start([Message(sparse_rows(rank, grown[rank])[1], "allgather")], "table")
    second = comm.start([Message(torch.full((4,), float(rank)), "sum")], "dense")
    assert torch.equal(second.wait()[0], torch.full((4,), float(sum(range(size)))))
    assert torch.equal(first.wait()[0], torch.cat([sparse_rows(r, n)[1] for r, n in enumerate(grown)]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_small_float_reduction_is_an_allgather_at_2_ranks_only(comm, monkeypatch, dtype):
    """At 2 ranks an all_gather sends the ring's bytes in one hop: a small float round goes so, its
    average DDP's bit for bit (each rank's half, summed); beyond 2 ranks, and above the size bound, it
    stays an all_reduce."""
    calls = counting(monkeypatch)
    x = (torch.arange(5, dtype=torch.float32) / 3 + comm.rank).to(dtype)
    big = torch.ones(GATHERED_BELOW // 4, dtype=torch.float32)
    average, most, _ = reduce(comm, [Message(x, "average"), Message(-x, "max"), Message(big, "sum")], "round")
    every = [(torch.arange(5, dtype=torch.float32) / 3 + r).to(dtype) for r in range(comm.size)]
    if comm.size == 2:
        assert torch.equal(average, every[0] * 0.5 + every[1] * 0.5)
    else:
        torch.testing.assert_close(average, sum(every) / comm.size)
    assert torch.equal(most, -every[0])
    assert calls == ({"all_gather": 1, "all_reduce": 1} if comm.size == 2 else {"all_gather": 0, "all_reduce": 3})


def test_alltoall_with_splits(comm):
    rank, size = comm.rank, comm.size
    splits = tuple(q + rank for q in range(size))  # rank r sends q + r values to rank q
    values = torch.cat([torch.full((q + rank,), float(10 * rank + q)) for q in range(size)])
    (received,) = reduce(comm, [Message(values, "alltoall", splits)], "a2a")
    assert torch.equal(received, torch.cat([torch.full((rank + r,), float(10 * r + rank)) for r in range(size)]))
    assert comm.stats.snapshot()["alltoall"]["bytes_sent"] == alltoall_bytes(4 * values.numel(), 4 * 2 * rank,
                                                                              4 * received.numel())[0]


def test_a_fusing_block_sends_one_allreduce_and_reports_nothing_done_until_it_ends(comm):
    a, b = torch.ones(3), torch.ones(2)
    with comm.fusing():
        first = comm.start([Message(a, "average")], "a")
        second = comm.start([Message(b, "average")], "b")
        assert not first.test() and not second.test()
    assert torch.equal(second.wait()[0], b) and torch.equal(first.wait()[0], a)
    # counted per start call, as Horovod's communicator counts
    assert comm.stats.snapshot()["allreduce.average"]["calls"] == 2


def test_every_collective_it_polls_reports_its_completion(comm, monkeypatch):
    """A wait over gloo polls ``work.is_completed()``; a work that never says it completed until
    waited (gloo's reduce-scatter) would spin each wait until the poll gives up. Every op kind, each
    polled work given 30 s to report."""
    silent = []

    def bounded(work):
        deadline = time.monotonic() + 30
        while not work.is_completed():
            if time.monotonic() > deadline:
                silent.append(work)
                return
            time.sleep(0.001)

    monkeypatch.setattr(torchdist, "poll", bounded)
    size = comm.size
    x = torch.arange(4.0 * size)
    rows = torch.ones((comm.rank + 1, 2))
    reduce(comm, [Message(x, "average"), Message(x.to(torch.int64), "max"), Message(rows, "allgather"),
                  Message(x, "alltoall", (4,) * size), Message(x, "reduce_scatter")], "every")
    assert comm.polling and silent == []


def test_an_unknown_op_is_a_clear_error(comm):
    with pytest.raises(ValueError, match="unknown reduction op 'median'; valid: average, sum, max, allgather"):
        comm.start([Message(torch.ones(1), "median")], "bad")
