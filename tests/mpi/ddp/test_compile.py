"""The hook under ``torch.compile``, in both of dynamo's DDP modes, on real gloo process groups.

``optimize_ddp="ddp_optimizer"`` (torch.compile's default): DDP's reducer calls the hook with
buckets. ``"python_reducer"`` with compiled autograd: DDP has no buckets and calls it once per
parameter with ``(grad, param)`` (:mod:`hvdsketch.torch.ddp_param`). The training step, backward
included, is one compiled function, so in both modes the hook is called from a compiled frame.

The backend is ``aot_eager``: dynamo, AOTAutograd and compiled autograd trace and split the graphs
as they do for inductor (DDPOptimizer's split at bucket boundaries wraps whichever backend is
given; compiled autograd compiles its backward graph, post-accumulate-grad hooks and all, with the
same ``torch.compile`` backend); only inductor's code generation, minutes on two cores, is left
out. One compiled step per mode serves every test: later models of the same structure reuse its
graphs (counted below), so each test trains in well under a second.
"""
import contextlib
import functools

import pytest
import torch
import torch.distributed as dist

from hvdsketch.torch.ddp import ExchangeState, exchange_hook
from hvdsketch.torch.ddp_param import ParameterSteps
from tests.mpi.ddp.cases import assert_replicas_agree, batches, flat, loss, model, sgd
from tests.mpi.ddp.test_ddp_device import COMPRESSIONS
from tests.mpi.torch.test_device import AUTO, meta_default

STEPS = 5
MODES = {"ddp_optimizer": {"optimize_ddp": "ddp_optimizer"},
         "python_reducer": {"optimize_ddp": "python_reducer", "compiled_autograd": True}}
#: An older PyTorch has no per-parameter form in DDP, or no compiled autograd in torch.compile's config.
per_parameter_form = pytest.mark.skipif(
    not (hasattr(torch.nn.parallel.DistributedDataParallel, "_register_accum_grad_hook")
         and hasattr(torch._dynamo.config, "compiled_autograd")),
    reason="this PyTorch has no optimize_ddp='python_reducer' with compiled autograd")
EVERY_MODE = pytest.mark.parametrize(
    "mode", [pytest.param(mode, marks=per_parameter_form if mode == "python_reducer" else ()) for mode in MODES])


def backward(wrapped: torch.nn.Module, batch) -> None:
    loss(wrapped, batch).backward()


@functools.cache
def compiled_backward(mode: str):
    """The compiled step of ``mode`` (made under its config: compiled autograd is fixed when made)."""
    with torch._dynamo.config.patch(**MODES[mode]):
        return torch.compile(backward, backend="aot_eager")


@contextlib.contextmanager
def dynamo_mode(mode: str | None):
    """``mode``'s config for DDP's construction and the steps (``None``: eager, as configured)."""
    with torch._dynamo.config.patch(**MODES[mode]) if mode else contextlib.nullcontext():
        yield


def assert_as_buckets_sum(ours: torch.Tensor, buckets: torch.Tensor) -> None:
    """The per-parameter form's weights against the bucket form's: the same bits at 2 ranks (a sum of
    two has one order); beyond, to float rounding where the per-parameter form fuses the step's
    gradients in model order and DDP's buckets (rebuilt in gradient-ready order) another: gloo's ring
    adds each element in an order set by its place."""
    if dist.get_world_size() == 2:
        assert torch.equal(ours, buckets)
    else:
        torch.testing.assert_close(ours, buckets, rtol=1e-5, atol=1e-6)


def hooked(module: torch.nn.Module, compression: str) -> tuple[torch.nn.Module, ExchangeState]:
    """``module`` in DDP (its default buckets: DDPOptimizer takes none under 1 MB) with hvdsketch's hook."""
    wrapped = torch.nn.parallel.DistributedDataParallel(module)
    state = ExchangeState(wrapped, compression=compression)
    wrapped.register_comm_hook(state, exchange_hook)
    return wrapped, state


def trained(mode: str | None, compression: str) -> tuple[torch.nn.Module, ExchangeState]:
    """A dense model after ``STEPS`` steps of SGD with momentum, eager (``mode=None``) or compiled."""
    with dynamo_mode(mode):
        module = model(sparse=False)
        wrapped, state = hooked(module, compression)
        step = compiled_backward(mode) if mode else backward
        optimizer = sgd(module)
        for batch in batches(STEPS):
            optimizer.zero_grad()
            step(wrapped, batch)
            optimizer.step()
    return module, state


@pytest.mark.parametrize("compression", ["none", "allgather"])
@EVERY_MODE
def test_compiled_steps_equal_eager(mode, compression):
    """The eager hook's weights after 5 steps (the per-parameter form's: :func:`assert_as_buckets_sum`);
    compiled autograd really traced the backward."""
    reference, _ = trained(None, compression)
    module, state = trained(mode, compression)
    if mode == "ddp_optimizer":
        assert torch.equal(flat(module), flat(reference))
    else:
        assert_as_buckets_sum(flat(module), flat(reference))
    assert state.report()["steps"] == STEPS
    if mode == "python_reducer":
        assert torch._dynamo.utils.counters["compiled_autograd"]["captures"] >= 1


@pytest.mark.parametrize("compression", COMPRESSIONS)
@EVERY_MODE
def test_every_method_keeps_replicas_equal(mode, compression):
    module, state = trained(mode, compression)
    assert_replicas_agree(module)
    assert state.report()["steps"] == STEPS


#: auto deciding by the bytes alone: on a link this slow the codec times it measures (which vary from
#: run to run and flip close calls) weigh nothing.
BYTES_DECIDE = "auto:warmup=1,bandwidth=1kbit,latency=100us"


@EVERY_MODE
def test_auto_decides_as_in_eager(mode):
    """``auto`` sees whole steps in either form, and picks for each tensor what it picks in eager mode
    (a mix of compressors here)."""
    tables = [trained(how, BYTES_DECIDE)[1].report()["assignment"] for how in (None, mode)]
    decisions = [[(row["tensor"], row["compressor"], row["bytes"]) for row in table] for table in tables]
    assert decisions[0] == decisions[1]
    assert len({compressor for _, compressor, _ in decisions[0]}) > 1


# DDP's per-parameter form without compiling: DDP takes its mode when made and calls the hook the
# same way from eager backward, so the errors and the device check need no compile.

def per_parameter(module: torch.nn.Module, compression: str = "none") -> tuple[torch.nn.Module, ExchangeState]:
    with dynamo_mode("python_reducer"):
        return hooked(module, compression)


@per_parameter_form
def test_a_parameter_without_gradient_is_a_clear_error_at_the_next_step():
    """Its step never ended (nothing else says so), and the next one names the parameter."""
    module = torch.nn.ModuleDict({"used": torch.nn.Linear(4, 2), "unused": torch.nn.Linear(4, 2)})
    torch.manual_seed(dist.get_rank())
    with dynamo_mode("python_reducer"):
        wrapped = torch.nn.parallel.DistributedDataParallel(module)
    wrapped.register_comm_hook(ExchangeState(wrapped), exchange_hook)
    module["used"](torch.randn(3, 4)).sum().backward()
    with pytest.raises(RuntimeError, match=r"without a gradient for 2 parameter\(s\) \(unused.bias, unused.weight\)"
                                           r".*optimize_ddp='ddp_optimizer' and find_unused_parameters=True"):
        module["used"](torch.randn(3, 4)).sum().backward()


@per_parameter_form
def test_a_sparse_gradient_is_a_clear_error_at_once():
    module = model(sparse=True)
    wrapped, _ = per_parameter(module)
    with pytest.raises(ValueError, match=r"gives '0.weight' a sparse gradient.*optimize_ddp='ddp_optimizer'"):
        loss(wrapped, batches(1)[0]).backward()


@per_parameter_form
@pytest.mark.parametrize("compression", ["none", "sketch", "powersgd", AUTO[1]])
def test_per_parameter_steps_on_the_gradients_device(compression):
    """Torch's default device "meta" while the hook works (:func:`meta_default`): no tensor made off
    the gradient's device."""
    module = model(sparse=False)
    wrapped, state = per_parameter(module, compression)
    optimizer = sgd(module)
    with meta_default((ParameterSteps, "add")):
        for batch in batches(3):
            optimizer.zero_grad()
            loss(wrapped, batch).backward()
            optimizer.step()
    assert_replicas_agree(module)
    assert state.report()["steps"] == 3


@per_parameter_form
def test_no_sync_accumulates_as_in_the_bucket_form():
    """Two micro-batches under ``no_sync()`` (DDP calls no hook), a third synchronized: one exchange of
    the sum a step, as in the bucket form."""
    results = []
    for make in (hooked, per_parameter):
        module = model(sparse=False)
        wrapped, state = make(module, "none")
        optimizer, data = sgd(module), batches(6)
        for first in (0, 3):
            optimizer.zero_grad()
            with wrapped.no_sync():
                loss(wrapped, data[first]).backward()
                loss(wrapped, data[first + 1]).backward()
            loss(wrapped, data[first + 2]).backward()
            optimizer.step()
        results.append(flat(module))
        assert state.session.step == 2
    assert_as_buckets_sum(results[1], results[0])
