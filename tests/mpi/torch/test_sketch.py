"""The sparse-sketch through Horovod's PyTorch collectives, drop-in and through hvdsketch's optimizer."""
import numpy as np
import pytest
import torch

from hvdsketch.compress import RowSparse, TensorContext, create
from hvdsketch.compress.state import StateTable
from hvdsketch.collectives.horovod import HorovodCommunicator
from hvdsketch.collectives.stats import ring_allreduce_bytes
from hvdsketch.exchange import AgreementError
from hvdsketch.exchange.agreement import verify
from hvdsketch.ops import torch as torch_ops
from hvdsketch.torch import Compression, DistributedOptimizer
from tests import sketch_cases as cases
from tests.peer_cases import exchange_jobs


def dropin_average(hvd, compression, tensor, name):
    payload, ctx = compression.compress(tensor)
    return compression.decompress(hvd.allreduce(payload, op=hvd.Average, name=name), ctx)


def test_dropin_recovery_equals_dense_allreduce_exactly(hvd):
    g = torch.from_numpy(cases.row_sparse_gradient(hvd.rank(), cases.EXACT_SHAPE, 3, integer=True))
    dense = hvd.allreduce(g, op=hvd.Average, name="exact.dense")
    compression = Compression.from_spec(cases.EXACT_SPEC)
    assert create(cases.EXACT_SPEC).plan(cases.EXACT_SHAPE) is not None  # really sketched
    recovered = dropin_average(hvd, compression, g, "exact.sketch")
    assert torch.equal(recovered, dense)
    np.testing.assert_array_equal(dense.numpy(), cases.dense_average(hvd.size(), cases.EXACT_SHAPE, 3, True))
    report = compression.report()
    assert report["bytes_sent"] < report["bytes_dense"] / 2


def test_dropin_recovery_within_count_sketch_bound(hvd):
    g = torch.from_numpy(cases.row_sparse_gradient(hvd.rank(), cases.LOSSY_SHAPE, 20, integer=False))
    truth = cases.dense_average(hvd.size(), cases.LOSSY_SHAPE, 20, False)
    recovered = dropin_average(hvd, Compression.from_spec(cases.LOSSY_SPEC), g, "lossy.sketch").numpy()
    cols = create(cases.LOSSY_SPEC).plan(cases.LOSSY_SHAPE).cols
    error = cases.relative_error(recovered, truth)
    assert 0 < error < cases.error_bound(cols, truth)
    assert np.all(recovered[~np.any(truth != 0, axis=1)] == 0)  # nothing outside the union support


def test_exchange_row_sparse_matches_dense(hvd):
    """A sparse COO gradient stays row-sparse through the exchange and equals the dense average."""
    g = cases.row_sparse_gradient(hvd.rank(), cases.EXACT_SHAPE, 3, integer=True)
    rows = np.flatnonzero(np.any(g != 0, axis=1))
    sparse = RowSparse(torch.from_numpy(rows), torch.from_numpy(g[rows]), cases.EXACT_SHAPE)
    ctx = TensorContext("emb.weight", cases.EXACT_SHAPE, step=5, world_size=hvd.size())
    (out,) = exchange_jobs(HorovodCommunicator(hvd), [(create(cases.EXACT_SPEC), sparse, ctx)])
    assert isinstance(out, RowSparse)
    np.testing.assert_array_equal(out.to_dense().numpy(),
                                  cases.dense_average(hvd.size(), cases.EXACT_SHAPE, 3, True))


def same_on_every_rank(hvd, tensor: torch.Tensor, name: str) -> bool:
    gathered = hvd.allgather(tensor.reshape(1, -1), name=name)
    return all(torch.equal(gathered[0], row) for row in gathered)


def test_one_round_sizing_sends_dense_gradients_dense_and_sparse_ones_sketched(hvd):
    """Each tensor's first exchange is dense (Horovod's dense average exactly); then a dense gradient
    stays dense and a sparse one travels as bitmap and cells in one round, sized from the union the
    first exchange showed."""
    comm = HorovodCommunicator(hvd)
    dense = torch.from_numpy(np.random.default_rng(hvd.rank()).integers(-5, 6, (300, 40)).astype(np.float32))
    sparse = torch.from_numpy(cases.row_sparse_gradient(hvd.rank(), cases.EXACT_SHAPE, 3, integer=True))
    sketch, states = create("sketch:error=0.05,rows=3"), StateTable()
    for step in range(3):
        comm.stats.reset()
        jobs = [(sketch, t, TensorContext(n, tuple(t.shape), step, hvd.size())) for n, t in (("d", dense), ("s", sparse))]
        out_dense, out_sparse = exchange_jobs(comm, jobs, states=states)
        assert torch.equal(out_dense, hvd.allreduce(dense, op=hvd.Average, name="agreed.dense"))
        np.testing.assert_array_equal(out_sparse.numpy(), cases.dense_average(hvd.size(), cases.EXACT_SHAPE, 3, True))
        dense_bytes = ring_allreduce_bytes(dense.numel() * 4, hvd.size())
        sparse_bytes = ring_allreduce_bytes(sparse.numel() * 4, hvd.size())
        if step == 0:
            assert dense_bytes + sparse_bytes <= comm.stats.bytes_sent < dense_bytes + sparse_bytes + 100  # + step tag
        else:
            assert comm.stats.bytes_sent < dense_bytes + sparse_bytes / 2  # the sparse one was sketched
            assert set(comm.stats.snapshot()) == {"allreduce.average", "bor", "allreduce.max"}


def test_a_union_overflowing_its_plan_is_seen_alike_on_every_rank(hvd):
    """Step 2 holds far more rows than the plan (sized from step 1's union) expects, more on higher
    ranks: every rank recovers the same bits and plans the same next size, which holds the union."""
    shape = (20_000, 8)
    comm = HorovodCommunicator(hvd)
    sketch, states = create("sketch:error=0.5,rows=3"), StateTable()
    sizes = []
    for step, rows in enumerate([5, 5, 100 * (hvd.rank() + 1), 100 * (hvd.rank() + 1)]):
        g = torch.from_numpy(cases.row_sparse_gradient(hvd.rank() + 10 * step, shape, rows, integer=False))
        comm.stats.reset()
        (out,) = exchange_jobs(comm, [(sketch, g, TensorContext("w", shape, step, hvd.size()))], states=states)
        sizes.append(comm.stats.snapshot()["allreduce.average"]["bytes_sent"])
        assert same_on_every_rank(hvd, out, f"overflow.out.{step}")
        assert same_on_every_rank(hvd, torch.tensor([states.get("w", sketch).level]), f"overflow.level.{step}")
        truth = torch.from_numpy(np.mean([cases.row_sparse_gradient(r + 10 * step, shape, rows_of, False)
                                          for r, rows_of in enumerate([rows if step < 2 else 100 * (q + 1)
                                                                       for q in range(hvd.size())])], axis=0))
        error = float((out - truth).norm() / truth.norm())
        if step == 2:
            assert error > 0.5  # the union overflowed the plan
        if step == 3:
            assert error < 0.5
    assert sizes[2] == sizes[1] < sizes[3] / 10  # same plan as before the overflow, then resized


@pytest.mark.parametrize("flag", ["union", "allgather", "allgather:wire=float16"])
def test_exact_sparse_methods_keep_row_sparse_gradients_sparse_and_exact(hvd, flag):
    g = cases.row_sparse_gradient(hvd.rank(), cases.EXACT_SHAPE, 3, integer=True)
    rows = np.flatnonzero(np.any(g != 0, axis=1))
    sparse = RowSparse(torch.from_numpy(rows), torch.from_numpy(g[rows]), cases.EXACT_SHAPE)
    ctx = TensorContext("emb.weight", cases.EXACT_SHAPE, step=1, world_size=hvd.size())
    (out,) = exchange_jobs(HorovodCommunicator(hvd), [(create(flag), sparse, ctx)])
    assert isinstance(out, RowSparse)
    np.testing.assert_array_equal(out.to_dense().numpy(), cases.dense_average(hvd.size(), cases.EXACT_SHAPE, 3, True))


def test_training_keeps_replicas_bit_identical(hvd):
    """50 steps of an embedding model with sparse gradients: every rank ends bit-identical."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(5000, 16, sparse=True), torch.nn.Flatten(),
                                torch.nn.Linear(16 * 8, 5))
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                     compression="sketch:error=0.5,density=0.05,rows=3")
    rng = np.random.default_rng(hvd.rank())
    for _ in range(50):
        tokens = torch.from_numpy(rng.integers(0, 5000, size=(32, 8)))
        labels = torch.from_numpy(rng.integers(0, 5, size=32))
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(tokens), labels).backward()
        optimizer.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat[None, :], name="replicas")
    assert all(torch.equal(gathered[0], row) for row in gathered)
    report = optimizer.report()
    assert report["steps"] == 50 and report["bytes_sent"] < report["bytes_dense_allreduce"]


def test_mismatched_specs_fail_on_every_rank(hvd):
    comm = HorovodCommunicator(hvd)
    with pytest.raises(AgreementError, match="different compression setups.*compression is sketch:rows=1 on rank 0 "
                                             "but sketch:rows=2 on rank 1"):
        verify(comm, {"compression": f"sketch:rows={1 + hvd.rank()}"}, torch_ops)


def test_nan_on_one_rank_comes_back_on_every_rank_and_leaves_the_plan_as_it_was(hvd):
    """As Horovod's compressions hand it back (a loss scaler skips the step); the sketch's record of
    the tensor (its planned size) is the one before the step."""
    g = torch.from_numpy(cases.row_sparse_gradient(hvd.rank(), cases.LOSSY_SHAPE, 4, integer=False))
    compression = Compression.sketch(error=0.5, density=0.05)
    dropin_average(hvd, compression, g * 50, "nan.sketch.before")  # a record, planned from a wide union
    before = compression.session.states.state_dict()
    if hvd.rank() == hvd.size() - 1:
        g[0, 0] = float("nan")
    result = dropin_average(hvd, compression, g, "nan.sketch")
    assert not torch.isfinite(result).all()
    assert before and compression.session.states.state_dict() == before


def test_shapes_differing_across_ranks_raise_on_every_rank(hvd):
    shape = (64, 50) if hvd.rank() == 0 else (50, 64)  # same element count: Horovod alone would not notice
    with pytest.raises(ValueError, match="disagree on a gradient's shape"):
        dropin_average(hvd, Compression.none, torch.ones(shape), "shape.mismatch")


def test_integer_and_empty_tensors_pass_through(hvd):
    compression = Compression.sketch()
    ints = torch.arange(6)
    empty = torch.zeros(0, 3)
    for tensor in (ints, empty):
        payload, ctx = compression.compress(tensor)
        assert payload is tensor and ctx is None
        assert compression.decompress(payload, ctx) is tensor
