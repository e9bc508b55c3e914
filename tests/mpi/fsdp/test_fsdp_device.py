"""Every tensor on the FSDP front end's path is made on the gradient's device, proved without a GPU:
hvdsketch's reduce-scatter runs with torch's default device "meta" (entered inside
:meth:`FSDPReduction.reduce_scatter`, which FSDP calls), so a tensor made without ``device=`` meets
the CPU gradient and raises; FSDP itself runs as usual."""
import pytest

from hvdsketch.torch.fsdp import FSDPReduction
from tests.mpi.fsdp.cases import adam, batches, model, sharded, step
from tests.mpi.torch.test_device import _in_meta

COMPRESSIONS = ["none", "fp16", "fp16:dtype=bfloat16", "quantize", "quantize:bits=4,block=32", "rows", "auto:warmup=1,bandwidth=10mbit",
                "rows:wire=bfloat16,block=16"]


@pytest.mark.parametrize("memory", [None, "fp32"], ids=str)
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_reduce_scatter_runs_on_the_gradients_device(compression, memory):
    module, _ = sharded(model(), compression, memory=memory)
    optimizer = adam(module)
    with _in_meta(FSDPReduction, "reduce_scatter"):
        for batch in batches(2):
            step(module, optimizer, batch)
