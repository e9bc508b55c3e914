"""Bad input, misuse and ranks that disagree, with PyTorch: a clear error on every rank or the right
result, never a hang (each test under a timeout; the exchanger polls in Python, so it is interruptible)."""
import itertools
import warnings

import numpy as np
import pytest
import torch

from hvdsketch.exchange.diagnosis import NonfiniteStep
from hvdsketch.spec import SpecError
from hvdsketch.torch import Compression, DistributedOptimizer


def same_on_every_rank(hvd, tensor: torch.Tensor, name: str) -> bool:
    gathered = hvd.allgather(tensor.detach().float().reshape(1, -1), name=f"bad_input.{name}")
    return all(torch.equal(gathered[0], row) for row in gathered)


def linear(dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.nn.Linear:
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 8).to(dtype)
    with torch.no_grad():
        layer.weight.mul_(scale)
    return layer


def backward(layer: torch.nn.Module, rank: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> None:
    x = torch.from_numpy(np.random.default_rng(rank).standard_normal((4, 16))).to(dtype)
    (layer(x).sum() * scale).backward()


# -- flags and arguments ---------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("arguments, message", [
    ({"compression": ""}, "compression='' is empty"),
    ({"compression": "   "}, "is empty"),
    ({"compression": "sketch:error=inf"}, "error: inf is not a finite number"),
    ({"compression": "fp16:dtype=bfloat16"}, "no bfloat16 allreduce"),
    ({"memory": ""}, "residual memory flag must be a non-empty string naming one of .*fp32"),
    ({"memory": 3}, "memory must be a --memory flag"),
    ({"backward_passes_per_step": 1.5}, "backward_passes_per_step must be an int"),
    ({"gradient_predivide_factor": 0.0}, "gradient_predivide_factor must be a finite number > 0"),
    ({"sparse_as_dense": "yes"}, "sparse_as_dense must be True or False"),
], ids=lambda a: str(a) if isinstance(a, str) else ",".join(f"{k}={v!r}"[:40] for k, v in a.items()))
def test_bad_arguments_raise_clear_errors_on_every_rank(hvd, arguments, message):
    layer = linear()
    with pytest.raises((SpecError, TypeError, ValueError), match=message):
        DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), layer.named_parameters(), **arguments)


@pytest.mark.timeout(60)
def test_horovods_own_compression_is_taken_and_unnamed_parameters_say_what_to_pass(hvd):
    layer = linear()
    for compression, flag in ((hvd.Compression.fp16, "fp16"), (Compression.sketch(), "sketch:bitmap=float")):
        optimizer = DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), layer.named_parameters(),
                                         compression=compression)
        assert optimizer.report()["compression"] == flag
    with pytest.raises(ValueError, match=r"named_parameters must be \(name, parameter\) pairs"):
        DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), layer.parameters())


# -- sparse gradients keep their layout --------------------------------------------------------------

ROWS, DIM = 400, 8


class Bag(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding = torch.nn.Embedding(ROWS, DIM, sparse=True)
        self.out = torch.nn.Linear(DIM, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.embedding(tokens).mean(1))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("compression", ["sketch:error=0.5", "topk:ratio=0.1", "none", "powersgd:rank=2"])
@pytest.mark.parametrize("optimizer", ["sgd-momentum", "sparse-adam"])
def test_a_sparse_embedding_keeps_its_layout_when_the_exchange_goes_dense(hvd, compression, optimizer):
    """Each step looks up more rows, until nearly every row is in the union and the sketch sends the
    tensor dense: the optimizer still gets a sparse gradient (SGD momentum and SparseAdam take no
    dense one for a sparse parameter), and every rank ends with the same parameters."""
    model = Bag()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    if optimizer == "sgd-momentum":
        base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:  # SparseAdam takes sparse gradients only: the embedding; the rest a second optimizer
        base = torch.optim.SparseAdam([model.embedding.weight], lr=0.01)
    named = [(n, p) for n, p in model.named_parameters() if any(p is q for g in base.param_groups for q in g["params"])]
    wrapped = DistributedOptimizer(base, named, compression=compression)
    rng = np.random.default_rng(hvd.rank())
    for step in range(6):
        wrapped.zero_grad()
        looked_up = min(ROWS, 20 * 4 ** step)  # 20 rows, then 80, 320, all
        tokens = torch.from_numpy(rng.integers(0, looked_up, (looked_up // 4 + 1, 4)))
        torch.nn.functional.cross_entropy(model(tokens), torch.from_numpy(rng.integers(0, 3, len(tokens)))).backward()
        wrapped.step()
        assert model.embedding.weight.grad.is_sparse, f"step {step}: the embedding's gradient came back dense"
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert torch.isfinite(weights).all()
    assert same_on_every_rank(hvd, weights, f"sparse.{compression}.{optimizer}")


# -- bfloat16 and float16 ----------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("compression", ["none", "topk:ratio=1", "sketch:error=0.5", "powersgd:rank=2"])
def test_a_bfloat16_model_trains_and_its_gradients_stay_bfloat16(hvd, compression):
    """Horovod reduces no bfloat16 tensor; hvdsketch exchanges them as float32: exact compressors
    give the float32 average of the bfloat16 gradients."""
    layer = linear(torch.bfloat16)
    optimizer = DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), layer.named_parameters(),
                                     compression=compression)
    backward(layer, hvd.rank(), torch.bfloat16)
    local = layer.weight.grad.float().clone()
    optimizer.synchronize()
    assert layer.weight.grad.dtype == torch.bfloat16
    if compression in ("none", "topk:ratio=1"):
        expected = hvd.allreduce(local, name=f"bf16.expected.{compression}")
        torch.testing.assert_close(layer.weight.grad.float(), expected.to(torch.bfloat16).float())
    with optimizer.skip_synchronize():
        optimizer.step()
    assert same_on_every_rank(hvd, layer.weight, f"bf16.{compression}")


@pytest.mark.timeout(60)
def test_float16_gradients_with_powersgd_stay_finite(hvd):
    layer = linear(torch.float16)
    optimizer = DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), layer.named_parameters(),
                                     compression="powersgd:rank=2")
    for _ in range(2):
        optimizer.zero_grad()
        backward(layer, hvd.rank(), torch.float16)
        optimizer.step()
    assert layer.weight.dtype == torch.float16 and torch.isfinite(layer.weight).all()
    assert same_on_every_rank(hvd, layer.weight, "fp16.powersgd")


@pytest.mark.timeout(60)
def test_a_finite_gradient_that_overflows_float16_is_reported_as_overflow_on_every_rank(hvd):
    layer = linear()
    optimizer = DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), layer.named_parameters(),
                                     compression="fp16", error_if_nonfinite=True)
    backward(layer, hvd.rank(), scale=1e5 if hvd.rank() == 0 else 1.0)
    with pytest.raises(FloatingPointError, match=f"overflowed float16 on the wire: it is finite on rank {hvd.rank()}"):
        optimizer.step()


@pytest.mark.timeout(60)
def test_a_nan_under_fp16_names_the_rank_that_has_it(hvd):
    layer = linear()
    optimizer = DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), layer.named_parameters(),
                                     compression="fp16", error_if_nonfinite=True)
    backward(layer, hvd.rank(), scale=float("nan") if hvd.rank() == hvd.size() - 1 else 1.0)
    here = hvd.rank() == hvd.size() - 1
    with pytest.raises(FloatingPointError, match=f"NaN or Inf on rank {hvd.rank()}" if here
                       else "or another rank's gradient is NaN or Inf"):
        optimizer.step()


# -- Horovod's drop-in path (hvdsketch.torch.Compression in Horovod's own optimizer) --------------------

_dropin_steps = itertools.count()


def dropin_step(hvd, layer: torch.nn.Module, compression, dtype=torch.float32, scale=1.0) -> None:
    # Names of their own: a test whose step raised leaves Horovod's other allreduces of that step in
    # flight for a while, and Horovod refuses a name still in flight.
    prefix = f"step{next(_dropin_steps)}"
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1),
                                         named_parameters=[(f"{prefix}.{name}", p) for name, p in layer.named_parameters()],
                                         compression=compression)
    x = torch.ones(1, *next(layer.parameters()).shape[1:], dtype=dtype)
    (layer(x).sum() * scale).backward()
    optimizer.step()


@pytest.mark.timeout(60)
def test_dropin_shapes_of_one_size_that_differ_by_rank_fail_on_every_rank(hvd):
    layer = torch.nn.Linear(6, 4, bias=False) if hvd.rank() == 0 else torch.nn.Linear(4, 6, bias=False)
    with pytest.raises(ValueError, match="ranks disagree on a gradient's shape"):
        dropin_step(hvd, layer, Compression.none)


@pytest.mark.timeout(60)
def test_a_finite_gradient_that_overflows_float16_is_handed_back_as_horovods_and_named_as_overflow(hvd):
    """By default, as Horovod's ``Compression.fp16``: the Inf average goes back (a loss scaler skips
    the step), and rank 0 says that the wire overflowed."""
    layer = linear()
    optimizer = DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), layer.named_parameters(),
                                     compression="fp16")
    backward(layer, hvd.rank(), scale=1e5 if hvd.rank() == 0 else 1.0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", NonfiniteStep)
        optimizer.synchronize()
    assert not torch.isfinite(layer.weight.grad).all()
    assert [str(w.message) for w in seen if "overflowed float16 on the wire" in str(w.message)] == (
        [str(w.message) for w in seen] if hvd.rank() == 0 else [])
    assert len(seen) == (hvd.rank() == 0)


@pytest.mark.timeout(60)
def test_dropin_fp16_overflow_is_handed_back_and_reported_as_overflow(hvd):
    with pytest.warns(NonfiniteStep, match="overflow"):
        dropin_step(hvd, linear(), Compression.fp16, scale=1e5 if hvd.rank() == 0 else 1.0)


@pytest.mark.timeout(60)
def test_dropin_bfloat16_model_works_or_names_the_dtype(hvd):
    try:
        dropin_step(hvd, linear(torch.bfloat16), Compression.none, dtype=torch.bfloat16)
    except Exception as err:  # a clear error is hvdsketch's, naming the dtype
        assert "hvdsketch" in str(err) and "bfloat16" in str(err), str(err)
