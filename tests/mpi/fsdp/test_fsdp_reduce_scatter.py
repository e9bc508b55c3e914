"""hvdsketch's reduce-scatter under real ``fully_shard`` over gloo, against FSDP's own (every rank runs these)."""
import pytest
import torch

from hvdsketch.exchange import AgreementError
from tests.mpi.fsdp.cases import adam, batches, exact_gradients, gradients, local, loss, model, sharded, step


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
    import torch.distributed as dist

    flag = "none" if dist.get_rank() else "fp16"
    with pytest.raises(AgreementError, match="compression is fp16 on rank 0 but none on rank 1"):
        sharded(model(), flag)
