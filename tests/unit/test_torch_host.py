"""The host kernels of the PyTorch back-end (:mod:`hvdsketch.ops.torch_host`) give what the whole-tensor
torch calls give, in every regime their shortcuts take: a threshold from the sample, a threshold of 0
(mostly zeros), a sample that misjudged, ties, NaN, and inputs made while torch's default device is "meta"."""
import pytest
import torch

from hvdsketch.ops import torch_host

N = 3 * torch_host.BLOCK + 12345  # several blocks and a ragged last one


def inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    dense = torch.randn(N, generator=g)
    rows = torch.zeros(N // 50 + 1, 50)
    rows[torch.randperm(rows.shape[0], generator=g)[:rows.shape[0] // 100]] = 1 + torch.rand(rows.shape[0] // 100, 50, generator=g)
    ties = torch.randint(-3, 4, (N,), generator=g).float()
    heavy = dense.clone()
    heavy[:1000] = 100.0  # the largest all in one place: a sample of runs easily misses them
    return {"dense": dense, "row-sparse": rows.reshape(-1)[:N], "ties": ties, "clustered": heavy,
            "zeros": torch.zeros(N)}


@pytest.mark.parametrize("k", [1, 10, 1000, N // 100, N // 9, N // 4, N])
@pytest.mark.parametrize("name", list(inputs()))
def test_topk_abs_keeps_k_distinct_entries_of_the_largest_magnitudes(name, k):
    x = inputs()[name]
    idx = torch_host.topk_abs(x, k)
    assert idx.dtype == torch.int64 and idx.shape == (k,)
    assert torch.unique(idx).shape == (k,)
    expected = torch.topk(x.abs(), k).values
    assert torch.equal(x[idx].abs().sort().values, expected.sort().values)


def test_topk_abs_ranks_nan_and_inf_largest():
    x = inputs()["row-sparse"].clone()
    x[[5, N - 3]] = float("nan")
    x[77] = -float("inf")
    assert {5, N - 3, 77} <= set(torch_host.topk_abs(x, 1000).tolist())
    assert {5, N - 3, 77} <= set(torch_host.topk_abs(x, 3).tolist())


@pytest.mark.parametrize("threshold", [0.5, 1.5, 2.9])
def test_reaching_finds_every_entry_at_or_above_the_threshold(threshold):
    x = inputs()["dense"].clone()
    x[9] = float("nan")
    expected = torch.nonzero(~(x.abs() < threshold)).reshape(-1)
    assert torch.equal(torch_host.reaching(x, threshold), expected)


def test_nothing_is_made_on_torchs_default_device():
    x = inputs()["row-sparse"]
    with torch.device("meta"):
        for idx in (torch_host.topk_abs(x, 1000), torch_host.topk_abs(x, N // 10), torch_host.reaching(x, 1.2)):
            assert idx.device.type == "cpu"


@pytest.mark.parametrize("shape", [(3000, 2, 300), (10000, 4, 256), (999, 32, 1000)])
def test_the_product_in_blocks_is_the_product(shape):
    n, r, m = shape
    g = torch.Generator().manual_seed(3)
    a, b, c = torch.randn(n, r, generator=g), torch.randn(r, m, generator=g), torch.randn(n, m, generator=g)
    out = torch.empty(n, m)
    assert torch_host.product(a, b, out) is out
    torch.testing.assert_close(out, a @ b)
    torch.testing.assert_close(torch_host.product(a.T.contiguous().T, b, minuend=c), c - a @ b)
    with torch.device("meta"):
        assert torch_host.product(a, b).device.type == "cpu"


@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize("n", [5, 8, 8 * torch_host.BLOCK + 13])
def test_the_sign_sum_by_table_is_the_sum_of_the_scaled_signs(world, n):
    from hvdsketch.ops import torch as ops

    g = torch.Generator().manual_seed(world)
    signs = torch.randint(0, 2, (world, n), generator=g, dtype=torch.uint8)
    bits = torch.stack([ops.pack_bits(row.bool()) for row in signs])
    scales = torch.rand(world, generator=g) + 0.5
    expected = torch_host.scaled_sum(2 * signs.to(torch.int8) - 1, scales[:, None], n, None)
    out = torch.empty(n)
    assert torch_host.sign_sum(bits, scales, n, out) is out
    assert torch.equal(out, expected)
    with torch.device("meta"):
        assert torch_host.sign_sum(bits, scales, n).device.type == "cpu"


@pytest.mark.parametrize("n", [3, 8, 2 * torch_host.BLOCK + 13])
def test_the_sign_bits_in_blocks_are_the_packed_comparison(n):
    from hvdsketch.ops import torch as ops

    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    x[0], x[-1] = -0.0, float("nan")
    assert torch.equal(torch_host.sign_bits(x), ops.pack_bits(x >= 0))
    with torch.device("meta"):
        assert torch_host.sign_bits(x).device.type == "cpu"
    half = x.to(torch.bfloat16)
    assert torch.equal(torch_host.sign_bits(half), ops.pack_bits(half >= 0))
