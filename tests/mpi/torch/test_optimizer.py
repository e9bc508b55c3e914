"""hvdsketch.torch.DistributedOptimizer behaves as Horovod's: exchanges start from the gradients' hooks
(overlapping backward), Horovod's arguments mean what they mean in Horovod (checked against Horovod's
own optimizer on the same data), and its guards against misuse are Horovod's."""
import warnings

import numpy as np
import pytest
import torch

from hvdsketch.compress import REGISTRY
from hvdsketch.torch import DistributedOptimizer

STEPS = 4


class Net(torch.nn.Module):
    """An embedding, three linear layers; ``branch`` is used only where ``use_branch`` is set."""

    def __init__(self, sparse: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding = torch.nn.Embedding(200, 8, sparse=sparse)
        self.first = torch.nn.Linear(8 * 4, 32)
        self.second = torch.nn.Linear(32, 32)
        self.last = torch.nn.Linear(32, 5)
        self.branch = torch.nn.Linear(32, 32)
        self.use_branch = True

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(self.embedding(tokens).flatten(1)))
        h = torch.relu(self.second(h))
        if self.use_branch:
            h = h + self.branch(h)
        return self.last(h)


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng([rank, step])
    return torch.from_numpy(rng.integers(0, 200, (16, 4))), torch.from_numpy(rng.integers(0, 5, 16))


def train(model: Net, optimizer: torch.optim.Optimizer, rank: int, passes: int = 1) -> torch.Tensor:
    for step in range(STEPS):
        optimizer.zero_grad()
        for p in range(passes):
            tokens, labels = batch(rank, passes * step + p)
            torch.nn.functional.cross_entropy(model(tokens), labels).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def both(hvd, sparse: bool = False, passes: int = 1, groups=None, **arguments):
    """Parameters after training with Horovod's optimizer and with hvdsketch's (compression none);
    ``groups(model)``: the parameter groups of that model."""
    out = []
    for wrap in (hvd.DistributedOptimizer, DistributedOptimizer):
        model = Net(sparse)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        if groups is not None:
            arguments["groups"] = groups(model) if callable(groups) else groups
        optimizer = wrap(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                         backward_passes_per_step=passes, sparse_as_dense=sparse, **arguments)
        out.append(train(model, optimizer, hvd.rank(), passes))
    return out


def test_each_exchange_starts_from_its_hook_before_backward_ends(hvd):
    """When the first layer's gradient is computed (the last of backward), the exchanges of the
    layers after it, whose gradients came first, are already in flight."""
    model = Net()
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    seen = []
    model.first.weight.register_hook(lambda grad: seen.append(set(optimizer._session.in_flight)))
    tokens, labels = batch(hvd.rank(), 0)
    torch.nn.functional.cross_entropy(model(tokens), labels).backward()
    assert {"last.weight", "last.bias", "second.weight"} <= seen[0]
    assert "first.weight" not in seen[0] and "embedding.weight" not in seen[0]
    optimizer.step()
    assert optimizer._session.in_flight == []


def layers(model: Net) -> list:
    return [[model.first.weight, model.first.bias], [model.last.weight, model.second.weight]]


@pytest.mark.parametrize("arguments", [
    {}, {"passes": 2}, {"op": "Sum"}, {"gradient_predivide_factor": 2.0}, {"groups": 2}, {"groups": layers},
    {"sparse": True}], ids=lambda a: ",".join(f"{k}={getattr(v, '__name__', v)}" for k, v in a.items()) or "plain")
def test_horovod_arguments_mean_what_they_mean_in_horovod(hvd, arguments):
    if arguments.get("op") == "Sum":
        arguments = dict(arguments, op=hvd.Sum)
    horovod, ours = both(hvd, **arguments)
    torch.testing.assert_close(ours, horovod, rtol=1e-6, atol=1e-7)


def test_two_process_sets_average_within_each(hvd):
    if hvd.size() != 4:
        pytest.skip("needs 4 ranks")
    sets = [hvd.add_process_set([0, 1]), hvd.add_process_set([2, 3])]
    try:
        mine = sets[hvd.rank() // 2]
        horovod, ours = both(hvd, process_set=mine)
        torch.testing.assert_close(ours, horovod, rtol=1e-6, atol=1e-7)
        gathered = hvd.allgather(ours[None, :], name="process_sets.params")
        assert torch.equal(gathered[0], gathered[1]) and torch.equal(gathered[2], gathered[3])
        assert not torch.equal(gathered[0], gathered[2])  # each set averaged its own ranks' gradients
    finally:
        for process_set in sets:
            hvd.remove_process_set(process_set)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("compression", ["none", "topk:ratio=0.1", "sketch:error=0.5", "powersgd:rank=2"])
def test_a_parameter_without_gradient_on_one_rank_takes_part_with_zeros(hvd, compression):
    """A branch taken on rank 0 only: every rank still exchanges the branch's gradient (zeros where
    it was not taken), as Horovod does, so no rank waits for a collective another never starts."""
    model = Net()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                     compression=compression)
    for step in range(STEPS):
        model.use_branch = hvd.rank() == 0 or step % 2 == 0
        tokens, labels = batch(hvd.rank(), step)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(tokens), labels).backward()
        optimizer.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat[None, :], name=f"branch.params.{compression}")
    assert all(torch.equal(gathered[0], row) for row in gathered)


def test_misuse_is_caught_as_horovod_catches_it(hvd):
    model = Net()
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                     compression="topk:ratio=0.1")
    tokens, labels = batch(hvd.rank(), 0)
    torch.nn.functional.cross_entropy(model(tokens), labels).backward()
    with pytest.raises(AssertionError, match="zero_grad.*before.*step"):
        optimizer.zero_grad()
    with pytest.raises(AssertionError, match="more than backward_passes_per_step"):
        torch.nn.functional.cross_entropy(model(tokens), labels).backward()
    optimizer.synchronize()
    before = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optimizer.step()  # synchronize() then step() without skip_synchronize(): warns, does not re-exchange
    assert any("skip_synchronize" in str(w.message) for w in caught)
    after = [p.grad for p in model.parameters() if p.grad is not None]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    with pytest.raises(ValueError, match="backward_passes_per_step must be > 0"):
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                             backward_passes_per_step=0)
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported with op != Average"):
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                             op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="Adasum combines the ranks' updates non-linearly"):
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                             op=hvd.Adasum, compression="topk:ratio=0.1")


@pytest.mark.parametrize("memory", [None, "fp32"])
def test_a_second_step_without_backward_warns_and_exchanges_nothing(hvd, memory):
    """``step()`` twice after one backward: the second would compress the averaged gradient again
    (lossy top-k, and its residual fed back once more); it warns and steps with the average as it is."""
    model = Net()
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                     compression="topk:ratio=0.1", memory=memory)
    train(model, optimizer, hvd.rank())
    averaged = [p.grad.clone() for p in model.parameters()]
    before = optimizer.report()
    with pytest.warns(UserWarning, match="again without a backward pass.*not exchanged again"):
        optimizer.step()
    after = optimizer.report()
    assert (after["steps"], after["bytes_sent"]) == (before["steps"], before["bytes_sent"])
    assert all(torch.equal(a, p.grad) for a, p in zip(averaged, model.parameters()))
    train(model, optimizer, hvd.rank())  # the next steps exchange as before, alike on every rank
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat[None, :], name=f"second.step.params.{memory}")
    assert all(torch.equal(gathered[0], row) for row in gathered)


@pytest.mark.timeout(60)
def test_a_rank_at_another_step_fails_on_every_rank(hvd):
    """A checkpoint loaded on rank 0 only: the ranks' steps (which seed the hashes) differ, and the
    next step raises on every rank instead of averaging mismatched exchanges."""
    from hvdsketch.exchange import AgreementError

    model = Net()
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                     compression="topk:ratio=0.1")
    train(model, optimizer, hvd.rank())
    saved = optimizer.state_dict()
    model = Net()  # the first optimizer's hooks stay on the first model's parameters, as Horovod's do
    resumed = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                   compression="topk:ratio=0.1")
    if hvd.rank() == 0:
        resumed.load_state_dict(saved)
    tokens, labels = batch(hvd.rank(), 0)
    with pytest.raises(AgreementError, match="different steps"):  # where the new world begins: the first step
        torch.nn.functional.cross_entropy(model(tokens), labels).backward()
        resumed.step()


@pytest.mark.parametrize("compression", sorted(REGISTRY))
def test_the_average_is_written_into_each_gradients_own_memory(hvd, compression):
    """As Horovod's optimizer averages ``.grad`` in place: no dense tensor is allocated for the result."""
    model = Net()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters(), compression=compression)
    for step in range(3):
        optimizer.zero_grad(set_to_none=False)
        tokens, labels = batch(hvd.rank(), step)
        torch.nn.functional.cross_entropy(model(tokens), labels).backward()
        local = {p: p.grad.clone() for p in model.parameters()}
        memory = {p: p.grad.data_ptr() for p in model.parameters()}
        optimizer.synchronize()
        assert all(p.grad.data_ptr() == memory[p] for p in model.parameters())
        assert any(not torch.equal(p.grad, local[p]) for p in model.parameters())
        if compression == "none":
            for p in model.parameters():
                torch.testing.assert_close(p.grad, hvd.allreduce(local[p]))
        with optimizer.skip_synchronize():
            optimizer.step()
