"""What DDP users do keeps working with the hook: ``find_unused_parameters``, ``static_graph``,
two DDP models in one process, a process group of their own, 16-bit parameters (a loss scaler that
skips overflowing steps: test_ddp_loss_scaler). Each against DDP's own allreduce with the same options."""
import pytest
import torch
import torch.distributed as dist

from hvdsketch.torch.ddp import ExchangeState, exchange_hook
from tests.mpi.ddp.cases import BUCKET_MB, assert_replicas_agree, batches, ddp, flat, loss, model, sgd


class Branchy(torch.nn.Module):
    """A head that only even steps use: unused parameters in the other steps."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = model(sparse=False), torch.nn.Linear(5, 5)
        self.calls = 0

    def forward(self, tokens):
        self.calls += 1
        out = self.body(tokens)
        return self.head(out) if self.calls % 2 else out


def run(make, compression, steps=4, process_group=None, **options):
    module = make()
    wrapped = torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=BUCKET_MB,
                                                        process_group=process_group, **options)
    if compression is not None:
        wrapped.register_comm_hook(ExchangeState(wrapped, compression=compression, process_group=process_group),
                                   exchange_hook)
    optimizer = sgd(module)
    for batch in batches(steps):
        optimizer.zero_grad()
        loss(wrapped, batch).backward()
        optimizer.step()
    return flat(module)


@pytest.mark.parametrize("make, options", [(Branchy, {"find_unused_parameters": True}), (model, {"static_graph": True})],
                         ids=["find_unused_parameters", "static_graph"])
def test_ddp_options_with_none_are_ddps_allreduce_bit_for_bit(make, options):
    assert torch.equal(run(make, "none", **options), run(make, None, **options))


def test_two_ddp_models_in_one_process_each_have_their_own_state():
    reference = [run(model, None), run(lambda: model(seed=1), None)]
    modules = [model(), model(seed=1)]
    wrapped = [torch.nn.parallel.DistributedDataParallel(m, bucket_cap_mb=BUCKET_MB) for m in modules]
    for w in wrapped:
        w.register_comm_hook(ExchangeState(w, compression="none"), exchange_hook)
    optimizers = [sgd(m) for m in modules]
    for batch in batches(4):
        for w, optimizer in zip(wrapped, optimizers):  # one after the other, as a GAN's two models
            optimizer.zero_grad()
            loss(w, batch).backward()
            optimizer.step()
    assert all(torch.equal(flat(m), r) for m, r in zip(modules, reference))


def test_a_process_group_of_its_own():
    group = dist.new_group(list(range(dist.get_world_size())))
    assert torch.equal(run(model, "allgather", process_group=group), run(model, "allgather"))
    torch.testing.assert_close(run(model, "allgather", process_group=group), run(model, None), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_parameters(dtype):
    """16-bit gradients come back 16-bit, averaged (bfloat16 travels as float32, so more exactly than
    DDP's own 16-bit sums; the reference is within one 16-bit rounding)."""
    ours = run(lambda: model(sparse=False).to(dtype), "none", steps=2)
    theirs = run(lambda: model(sparse=False).to(dtype), None, steps=2)
    assert ours.dtype == dtype
    torch.testing.assert_close(ours, theirs, rtol=1e-2, atol=1e-2)
