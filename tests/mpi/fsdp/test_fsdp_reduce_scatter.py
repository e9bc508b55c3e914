"""hvdsketch's reduce-scatter under real ``fully_shard`` over gloo, against FSDP's own (every rank runs these)."""
import re

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import hvdsketch.torch.fsdp
from hvdsketch.exchange import AgreementError
from tests.mpi.fsdp.cases import (VOCAB, WIDTH, adam, batches, exact_gradients, gradients, local, loss, model,
                                  sharded, step)


def test_none_is_fsdps_reduce_scatter_bit_for_bit():
    """Several FSDP modules, padded shards, Adam over several steps: the same bits as FSDP's own."""
    data = batches(4)
    runs = []
    for compression in (None, "none"):
        module, reduction = sharded(model(), compression)
        optimizer = adam(module)
        for batch in data:
            step(module, optimizer, batch)
        runs.append(local(module))
    assert torch.equal(runs[0], runs[1])
    report = reduction.report()
    assert report["steps"] == len(data)
    assert report["collectives"]["reduce_scatter"]["bytes_sent"] == report["bytes_dense_reduce_scatter"] > 0


def test_sixteen_bit_transport_sums_in_float32_closer_than_fsdps_bfloat16_reduction():
    """On the same gradients: every element within bfloat16's rounding of the exact average (each
    rank's value rounded once, the sum in float32), and the whole error smaller than that of FSDP's
    ``reduce_dtype=torch.bfloat16``, which sums in bfloat16; the wire carries half the bytes."""
    (batch,) = batches(1)
    exact, magnitude = exact_gradients(batch)
    errors = {}
    for name, compression, dtype in (("ours", "fp16:dtype=bfloat16", None), ("fsdp", None, torch.bfloat16)):
        module, reduction = sharded(model(), compression, reduce_dtype=dtype)
        loss(module, batch).backward()
        got = gradients(module)
        errors[name] = torch.cat([(got[k].double() - exact[k]).reshape(-1) for k in exact])
        if name == "ours":
            unit = 2.0 ** -8  # bfloat16's unit roundoff (8 significant bits)
            bound = torch.cat([(unit * magnitude[k] + 1e-7 * exact[k].abs() + 1e-12).reshape(-1) for k in exact])
            assert (errors[name].abs() <= bound).all()
            report = reduction.report()
            assert report["collectives"]["alltoall"]["bytes_sent"] == report["bytes_dense_reduce_scatter"] / 2
    assert errors["ours"].norm() < errors["fsdp"].norm()


def test_ranks_with_other_flags_fail_alike_on_every_rank():
    flag = "none" if dist.get_rank() else "fp16"
    with pytest.raises(AgreementError, match="compression is fp16 on rank 0 but none on rank 1"):
        sharded(model(), flag)


def test_rows_average_exactly():
    """Every module's non-zero rows to their owners (the embedding's few, every row of the dense
    layers, blocks of elements where a module's shards have rows of several widths): the exact
    average to float32's rounding of a sum, and at 2 ranks FSDP's own bits."""
    (batch,) = batches(1)
    exact, magnitude = exact_gradients(batch)
    results = {}
    for compression in ("none", "rows", "rows:block=7"):
        module, _ = sharded(model(), compression)
        loss(module, batch).backward()
        results[compression] = gradients(module)
    for k in exact:
        for flag in ("rows", "rows:block=7"):
            bound = 4 * dist.get_world_size() * 2.0 ** -24 * magnitude[k] + 1e-12
            assert ((results[flag][k].double() - exact[k]).abs() <= bound).all(), (flag, k)
            if dist.get_world_size() == 2:
                assert torch.equal(results[flag][k], results["none"][k]), (flag, k)


def test_rows_send_only_the_rows_other_ranks_own():
    """An embedding alone in its FSDP module: a rank sends the rows it touched in other ranks'
    blocks, each with its int32 index, and one count to each rank."""
    size, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Embedding(VOCAB, WIDTH))
    fully_shard(module[0])
    fully_shard(module)
    reduction = hvdsketch.torch.fsdp.compress(module, "rows")
    (batch,) = batches(1)
    module(batch).square().sum().backward()
    touched = torch.unique(batch)
    others = int((touched // (VOCAB // size) != rank).sum())
    sent = reduction.report()["collectives"]["alltoall"]["bytes_sent"]
    assert sent == (size - 1) * 8 + others * (4 + 4 * WIDTH)
    assert others < VOCAB // 4  # far fewer than the dense reduce-scatter's (N - 1) / N * VOCAB rows


def test_ranks_with_other_models_or_pytorch_fail_alike_on_every_rank(monkeypatch):
    """Before any reduce-scatter (FSDP's own collectives would wait for ranks that never come)."""
    rank, version = dist.get_rank(), re.escape(torch.__version__)
    module = torch.nn.Sequential(torch.nn.Embedding(VOCAB + 4 * (rank > 0), WIDTH))
    fully_shard(module[0])
    fully_shard(module)
    with pytest.raises(AgreementError, match="fsdp module '0' is float32 .* on rank 0 but float32 .* on rank 1"):
        hvdsketch.torch.fsdp.compress(module, "rows")
    if rank:
        monkeypatch.setattr(torch, "__version__", "2.12.0")
    with pytest.raises(AgreementError, match=f"pytorch is {version} on rank 0 but 2.12.0 on rank 1"):
        sharded(model(), "none")
