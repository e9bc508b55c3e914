"""HSDP on a 2 x 2 mesh at 4 ranks: FSDP shards over one dimension, hvdsketch averages each shard
across the replicas in FSDP's all-reduce hook (every rank runs these; they need 4 ranks)."""
import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import hvdsketch.torch.fsdp
from tests.mpi.fsdp.cases import LM, adam, batches, local, model, step


@pytest.fixture(scope="module")
def mesh():
    if dist.get_world_size() != 4:
        pytest.skip("a 2 x 2 mesh needs 4 ranks")
    return init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))


def hsdp(module: LM, mesh, compression: str | None = None, **kwargs):
    """``module`` sharded per block over the mesh's shard dimension with hvdsketch carrying the
    replica all-reduce (``compression`` given), or over the whole mesh as FSDP's native HSDP."""
    over = mesh if compression is None else mesh["shard"]
    for part in (module.embed, *module.blocks):
        fully_shard(part, mesh=over)
    fully_shard(module, mesh=over)
    if compression is None:
        return module, None
    return module, hvdsketch.torch.fsdp.compress(module, compression, replicate=mesh["replicate"], **kwargs)


def test_exact_methods_give_native_hsdps_bits(mesh):
    """hvdsketch's none, then none across the replicas, against FSDP's own HSDP, over Adam steps;
    the exact sparse rows across the shards and allgather across the replicas too."""
    data = batches(3)
    runs = {}
    for name, compression, replica in (("native", None, None), ("none", "none", "none"), ("rows", "rows", "allgather")):
        module, reduction = hsdp(model(), mesh, compression, replicate_compression=replica)
        optimizer = adam(module)
        for batch in data:
            step(module, optimizer, batch)
        runs[name] = local(module)
        if reduction is not None:
            assert reduction.report()["replica"]["steps"] == len(data)
    assert torch.equal(runs["none"], runs["native"])
    torch.testing.assert_close(runs["rows"], runs["native"], rtol=1e-5, atol=1e-6)


def test_lossy_replica_methods_keep_the_replicas_alike(mesh):
    """PowerSGD across the replicas, 16-bit transport within them: each shard's two replicas hold
    the same parameters after every step, and the model trains."""
    module, reduction = hsdp(model(), mesh, "fp16:dtype=bfloat16", replicate_compression="powersgd:rank=2")
    optimizer = adam(module)
    for batch in batches(3):
        step(module, optimizer, batch)
        mine = local(module)
        theirs = [torch.empty_like(mine) for _ in range(2)]
        dist.all_gather(theirs, mine, group=mesh["replicate"].get_group())
        assert torch.equal(theirs[0], theirs[1])
    assert reduction.report()["replica"]["compression"] == "powersgd:rank=2"


def test_native_hsdp_with_hvdsketch_is_a_clear_error(mesh):
    module = model()
    fully_shard(module.embed, mesh=mesh)
    fully_shard(module, mesh=mesh)
    with pytest.raises(ValueError, match="native HSDP"):
        hvdsketch.torch.fsdp.compress(module, "none")
