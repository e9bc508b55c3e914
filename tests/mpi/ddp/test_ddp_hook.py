"""The hook against DDP's own reduction, on real gloo process groups (every rank runs these)."""
import sys

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

from hvdsketch.collectives.stats import ring_allreduce_bytes
from hvdsketch.torch.ddp import ExchangeState, exchange_hook
from tests.mpi.ddp.cases import batches, counting, ddp, flat, loss, model, sgd, train, trained


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_none_is_ddps_allreduce_bit_for_bit(sparse):
    """Several buckets a step, DDP's bucket rebuild after the first step, momentum: the same bits."""
    reference, _ = trained(None, sparse, steps=5)
    ours, state = trained("none", sparse, steps=5)
    assert torch.equal(ours, reference)
    report = state.report()
    assert report["steps"] == 5 and report["collectives"]["allreduce.average"]["bytes_sent"] == report["bytes_dense_allreduce"]


def test_buckets_ddp_calls_back_to_back_go_out_in_one_collective(monkeypatch):
    """With DDP's default buckets the sparse embedding's bucket comes first but backward reaches it
    last, so DDP calls the dense bucket's hook at once after it: they go out together, one all_gather
    a step (its rows, and at 2 ranks the dense layers' small sums; beyond, those in one all_reduce)
    where each bucket took its own. The same batch every step, so no rank's rows outgrow their bound."""
    module = model(sparse=True)
    wrapped = torch.nn.parallel.DistributedDataParallel(module)
    state = ExchangeState(wrapped, compression="allgather")
    wrapped.register_comm_hook(state, exchange_hook)
    optimizer, batch = sgd(module), batches(1)[0]
    train(wrapped, optimizer, [batch] * 3)  # the first step, DDP's rebuilt buckets, the bounds learnt
    calls = counting(monkeypatch)
    train(wrapped, optimizer, [batch] * 2)
    assert calls == {"all_gather": 2, "all_reduce": 0 if dist.get_world_size() == 2 else 2}


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("compression", ["allgather", "union"])
def test_exact_sparse_methods_equal_ddps_average(compression, sparse):
    """The exact sparse exchanges average as DDP does, to float rounding; the sparse embedding's
    gradient comes back sparse."""
    reference, _ = trained(None, sparse)
    module = model(sparse)
    wrapped, state = ddp(module, compression)
    optimizer = sgd(module)
    for batch in batches(4):
        optimizer.zero_grad()
        loss(wrapped, batch).backward()
        assert module[0].weight.grad.is_sparse == sparse
        optimizer.step()
    torch.testing.assert_close(flat(module), reference, rtol=1e-5, atol=1e-6)
    assert state.report()["collectives"]  # it went through the exchanger


@pytest.mark.parametrize("compression", ["none", "allgather"])
def test_over_mpi_the_hook_averages_as_ddp_does_without_a_torch_collective(compression, monkeypatch):
    """``collectives="mpi"``: hvdsketch's MPI layer moves every bucket's messages (the sparse
    embedding's rows, the dense layers' sums), DDP's average to float rounding, and the hook calls
    no torch.distributed collective."""
    reference, _ = trained(None)
    module = model()
    wrapped, state = ddp(module, compression, collectives="mpi")
    calls = counting(monkeypatch)
    train(wrapped, sgd(module), batches(4))
    torch.testing.assert_close(flat(module), reference, rtol=1e-5, atol=1e-6)
    assert calls == {"all_gather": 0, "all_reduce": 0}
    assert state.report()["bytes_sent"] > 0


def test_no_sync_accumulates_as_ddp_does():
    """Two micro-batches under no_sync(), a third synchronized: the hook sees the sum of the three,
    and ``none`` steps exactly as DDP's own allreduce."""
    results = []
    for compression in (None, "none"):
        module = model(sparse=False)
        wrapped, state = ddp(module, compression)
        optimizer = sgd(module)
        data = batches(6)
        for first in (0, 3):
            optimizer.zero_grad()
            with wrapped.no_sync():
                loss(wrapped, data[first]).backward()
                loss(wrapped, data[first + 1]).backward()
            loss(wrapped, data[first + 2]).backward()
            optimizer.step()
        results.append(flat(module))
        if state is not None:
            assert state.session.step == 2  # one exchange per synchronized backward
    assert torch.equal(results[0], results[1])


def powersgd_model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 40))


def test_powersgd_matches_pytorchs_powersgd_hook():
    """Gradients of rank at most 2 rows a rank, so rank ``2 N`` approximations are exact: hvdsketch's
    ``powersgd`` without warm start and PyTorch's PowerSGD hook (no error feedback, no warm start,
    compressing what hvdsketch compresses: ``min_compression_rate=1``) both give DDP's average, to
    float rounding, at every one of 6 steps, and send the same bytes in their PowerSGD steps (the P
    and Q allreduces and the biases). (With the warm start, the last step's Q spans the last step's
    row space, and the exact case drifts from the third step on: 1.7e-4 at step 3, 2e-3 at step 8.)"""
    size, steps, rank = dist.get_world_size(), 6, 2 * dist.get_world_size()
    generator = torch.Generator().manual_seed(dist.get_rank())
    data = [(torch.randn(2, 64, generator=generator), torch.randn(2, 40, generator=generator)) for _ in range(steps)]
    params, states = {}, {}
    for kind in ("ddp", "pytorch", "hvdsketch"):
        module = powersgd_model()
        wrapped = torch.nn.parallel.DistributedDataParallel(module)
        if kind == "pytorch":
            states[kind] = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=rank, start_powerSGD_iter=1,
                                                       min_compression_rate=1, use_error_feedback=False,
                                                       warm_start=False)
            wrapped.register_comm_hook(states[kind], powerSGD_hook.powerSGD_hook)
        elif kind == "hvdsketch":
            wrapped, states[kind] = ddp(module, f"powersgd:rank={rank},warm_start=false")
        optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
        for x, y in data:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(wrapped(x), y).backward()
            optimizer.step()
        params[kind] = flat(module)
    torch.testing.assert_close(params["hvdsketch"], params["ddp"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(params["pytorch"], params["ddp"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(params["hvdsketch"], params["pytorch"], rtol=1e-4, atol=1e-5)
    _, _, elements = states["pytorch"].compression_stats()  # in its steps after the first (dense) one
    theirs = ring_allreduce_bytes(int(elements) * 4, size) / (steps - 1)
    ours = states["hvdsketch"].report()["collectives"]["allreduce.average"]["bytes_sent"] / steps
    assert ours == theirs


def test_this_path_imports_no_horovod():
    assert not [name for name in sys.modules if name == "horovod" or name.startswith("horovod.")]
