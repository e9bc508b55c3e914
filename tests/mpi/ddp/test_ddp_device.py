"""Every tensor on the hook's path is made on the gradient's device, proved without a GPU: the
hook runs with torch's default device "meta" (:func:`tests.mpi.torch.test_device.meta_default`,
entered again inside :meth:`ExchangeState.reduce`, which DDP calls outside the mode), so a tensor
made without ``device=`` meets the CPU gradient and raises. Every compressor, residual memories,
the sparse embedding, a checkpoint's restore (through ``torch.save`` and PyTorch's default
``torch.load``); the replicas still agree."""
import io

import pytest
import torch

from hvdsketch.torch.ddp import ExchangeState
from tests.mpi.ddp.cases import assert_replicas_agree, batches, ddp, model, sgd, train
from tests.mpi.torch.test_device import AUTO, meta_default

COMPRESSIONS = ["none", "fp16", "sketch", "sketch:density=0.2", "allgather", "union", "topk:ratio=0.1",
                "randomk:ratio=0.1", "dgc:ratio=0.1", "qsgd", "terngrad", "efsignsgd", "powersgd", "balanced", *AUTO]
MEMORIES = [None, "fp32", "topk", "sketch", "offload"]


@pytest.mark.parametrize("memory", MEMORIES, ids=str)
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_hook_steps_on_the_gradients_device(compression, memory):
    module = model()
    wrapped, state = ddp(module, compression, memory=memory)
    optimizer = sgd(module)
    data = batches(3)
    with meta_default((ExchangeState, "reduce")):
        train(wrapped, optimizer, data[:2])  # auto and its probe decide after the first
        state.load_state_dict(saved_and_loaded(state.state_dict()))  # restored on the device
        train(wrapped, optimizer, data[2:])
    assert module[0].weight.grad.is_sparse
    assert_replicas_agree(module)


def saved_and_loaded(state):
    """``state`` through ``torch.save`` and ``torch.load`` with PyTorch's defaults (weights only)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.load(io.BytesIO(buffer.getvalue()))


@pytest.mark.parametrize("memory", ["fp16", "bf16", "shared", "plan:budget=0.5"])
def test_every_memory_saves_what_torch_load_loads_by_default(memory):
    module = model()
    wrapped, state = ddp(module, "topk:ratio=0.1", memory=memory)
    data = batches(3)
    train(wrapped, sgd(module), data[:2])
    state.load_state_dict(saved_and_loaded(state.state_dict()))
    train(wrapped, sgd(module), data[2:])
    assert_replicas_agree(module)


@pytest.mark.parametrize("compression", ["none", "allgather", "sketch", "powersgd", *AUTO])
def test_hook_over_mpi_steps_on_the_gradients_device(compression):
    """The same over hvdsketch's MPI layer (``collectives="mpi"``), whose results come back from
    host buffers."""
    module = model()
    wrapped, state = ddp(module, compression, memory="fp32", collectives="mpi")
    with meta_default((ExchangeState, "reduce")):
        train(wrapped, sgd(module), batches(3))
    assert module[0].weight.grad.is_sparse
    assert_replicas_agree(module)


def test_the_hook_runs_inside_the_meta_default():
    """The harness can fail: inside the hook, a tensor made without a device is on "meta"."""
    seen = []
    reduce = ExchangeState.reduce

    def probe(self, bucket):
        seen.append(torch.zeros(1).device.type)
        return reduce(self, bucket)

    module = model()
    wrapped, _ = ddp(module, "none")
    ExchangeState.reduce = probe
    try:
        with meta_default((ExchangeState, "reduce")):
            train(wrapped, sgd(module), batches(1))
    finally:
        ExchangeState.reduce = reduce
    assert seen and set(seen) == {"meta"}
