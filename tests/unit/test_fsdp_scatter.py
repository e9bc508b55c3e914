"""The reduce-scatter methods of hvdsketch's FSDP front end in one process: their flags, their exchanges
over simulated ranks (each round's alltoall and reduce-scatter done here), their checkpoint format,
and what an older PyTorch is told."""
import io

import numpy as np
import pytest
import torch

from hvdsketch.compress import TensorContext, create as create_allreduce
from hvdsketch.compress import scatter
from hvdsketch.exchange.flight import Flight
from hvdsketch.ops import torch as torch_ops
from hvdsketch.policy.base import Fixed
from hvdsketch.policy.scatter import ScatterAutoPolicy, create as create_policy
from hvdsketch.spec import SpecError
from hvdsketch.torch.fsdp import checkpoint, modules


def simulate(flag: str, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every rank's result of ``flag``'s exchange of its tensor, the collectives done in this process."""
    size = len(tensors)
    compressor = scatter.create(flag)
    flights = [Flight(compressor, t, TensorContext("t", tuple(t.shape), 0, size, r)) for r, t in enumerate(tensors)]
    while not flights[0].done:
        sent = [f.messages for f in flights]
        for r, flight in enumerate(flights):
            reduced = []
            for k, message in enumerate(sent[r]):
                if message.op == "reduce_scatter":
                    reduced.append(torch.stack([s[k].tensor for s in sent]).mean(0).chunk(size)[r])
                else:  # alltoall: every rank's piece for rank r, in rank order
                    reduced.append(torch.cat([s[k].tensor.split(list(s[k].splits))[r] for s in sent]))
            flight.advance(reduced)
    return [f.result for f in flights]


def ranks_tensors(size: int, shape: tuple[int, ...], sparse_rows: bool = False) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(size)
    tensors = [torch.randn(*shape, generator=generator) for _ in range(size)]
    if sparse_rows:  # each rank touches a few rows
        for t in tensors:
            t[torch.randperm(shape[0], generator=generator)[:shape[0] - 3]] = 0
    return tensors


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("shape", [(12, 5), (36,), (12, 1, 7)])
@pytest.mark.parametrize("flag, tolerance", [("none", 1e-6), ("rows", 1e-6), ("rows:block=5", 1e-6),
                                             ("fp16", 2e-3), ("fp16:dtype=bfloat16", 1e-2),
                                             ("quantize:block=4", 2e-2), ("quantize:bits=4,block=4", 0.3)])
def test_every_rank_gets_its_block_of_the_average(flag, tolerance, size, shape):
    tensors = ranks_tensors(size, shape, sparse_rows=flag.startswith("rows"))
    average = torch.stack(tensors).mean(0)
    for rank, result in enumerate(simulate(flag, tensors)):
        block = average.chunk(size)[rank]
        assert result.shape == block.shape
        torch.testing.assert_close(result, block, rtol=0, atol=tolerance * average.abs().max().item())


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_codes_pack_and_unpack(bits):
    compressor = scatter.create(f"quantize:bits={bits},block=8")
    levels = compressor.levels
    codes = torch.arange(-levels, levels + 1, dtype=torch.int8).repeat(8)[:8 * (2 * levels + 1) // 8 * 8]
    packed = compressor._packed(torch_ops, codes)
    assert packed.numel() == codes.numel() * bits // 8
    assert torch.equal(compressor._unpacked(torch_ops, packed), codes)


@pytest.mark.parametrize("flag, message", [
    ("topk", "unknown reduce-scatter method 'topk'; valid: fp16, none, quantize, rows"),
    ("quantize:bits=3", "bits must be 2, 4 or 8"),
    ("quantize:bits=4,block=3", "multiple of 2"),
    ("fp16:dtype=float32", "not one of float16, bfloat16"),
    ("rows:wire=int8", "wire must be one of"),
])
def test_bad_flags_raise_clear_errors(flag, message):
    with pytest.raises(SpecError, match=message):
        create_policy(flag)


def test_policies():
    assert isinstance(create_policy("auto:warmup=2,bandwidth=1gbit"), ScatterAutoPolicy)
    assert isinstance(create_policy("rows"), Fixed) and str(create_policy("rows")) == "rows"
    with pytest.raises(SpecError, match="averages whole tensors"):
        create_policy(create_allreduce("fp16"))
    auto = ScatterAutoPolicy("auto")
    found = [str(c) for c in auto.candidates((64, 8), "float32", element=0.1, union=0.2)]
    assert found == ["none", "fp16:dtype=bfloat16", "quantize", "rows"]
    assert [str(c) for c in auto.candidates((64, 8), "bfloat16", element=1.0, union=1.0)] == ["none", "quantize"]


def test_a_ranks_state_loads_with_torchs_default_load():
    state = {"step": 3, "policy": {"decision": {"embed": "rows"}}, "memory": {"spec": "fp32",
             "slots": {"embed": {"store": "fp32", "residual": np.arange(6, dtype=np.float32)}}}}
    blob = checkpoint.pack(state)
    raw = torch.load(io.BytesIO(blob))  # weights_only=True: tensors, numbers, text
    assert raw["memory"]["spec"] == "fp32" and isinstance(raw["memory"]["slots"]["embed"]["residual"], torch.Tensor)
    back = checkpoint.unpack(blob)
    assert back["step"] == 3 and np.array_equal(back["memory"]["slots"]["embed"]["residual"], np.arange(6))
    with pytest.raises(ValueError, match="not what state_dict"):
        checkpoint.unpack({"not": "bytes"})


def test_an_older_pytorch_is_told_the_version_it_needs(monkeypatch):
    from torch.distributed.fsdp import FSDPModule

    assert modules.missing_api(replicate=True) is None
    monkeypatch.delattr(FSDPModule, "set_custom_reduce_scatter")
    assert modules.missing_api(replicate=False) == (
        f"hvdsketch.torch.fsdp needs PyTorch >= 2.9 (FSDPModule.set_custom_reduce_scatter); this is {torch.__version__}")
