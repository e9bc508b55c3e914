"""Host-memory kernels of the PyTorch back-end, done block by block.

On the host, a fresh tensor the size of a gradient costs more than the pass
that fills it: memory above glibc's mmap threshold (32 MiB at most) comes
from the kernel on every allocation and is faulted in page by page, which
for 10^7 float32 takes about six times as long as copying them into memory
that exists. A chain of element-wise torch calls makes one such temporary per
call. The kernels here walk the gradient in blocks of :data:`BLOCK` elements
(one MiB of float32, resident in cache) through one small buffer, so the data
is read from memory once and nothing of its size is made but the result.

On an accelerator the caching allocator reuses memory and the whole-tensor
calls are the fast ones: :mod:`hvdsketch.ops.torch` calls these only for
tensors on the CPU.
"""
from __future__ import annotations

import math

import torch

BLOCK = 1 << 18

#: Below this many elements (or when more than 1/8 are kept) ``torch.topk`` itself is as fast.
SAMPLED_MIN = 1 << 16

#: The sample of :func:`topk_abs` is taken in runs of this many consecutive entries (one cache line of float32).
RUN = 16


def _starts(n: int) -> range:
    return range(0, n, BLOCK)


def reaching(x: torch.Tensor, threshold: float) -> torch.Tensor:
    """int64 indices of the entries of the vector ``x`` with ``|x| >= threshold`` (> 0), NaN included."""
    magnitude = torch.empty(min(BLOCK, x.shape[0]), dtype=x.dtype, device=x.device)
    below = torch.empty(magnitude.shape, dtype=torch.bool, device=x.device)
    found = []
    for start in _starts(x.shape[0]):
        block = x[start:start + BLOCK]
        m, b = magnitude[:block.shape[0]], below[:block.shape[0]]
        torch.lt(torch.abs(block, out=m), threshold, out=b)
        found.append(torch.nonzero(b.logical_not_()).reshape(-1) + start)
    return torch.cat(found)


def _nonzero(x: torch.Tensor) -> torch.Tensor:
    """int64 indices of the non-zero entries of the vector ``x``, NaN included."""
    mask = torch.empty(min(BLOCK, x.shape[0]), dtype=torch.bool, device=x.device)
    return torch.cat([torch.nonzero(torch.ne(x[s:s + BLOCK], 0, out=mask[:min(BLOCK, x.shape[0] - s)])).reshape(-1) + s
                      for s in _starts(x.shape[0])])


def _largest(x: torch.Tensor, idx: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` of the indices ``idx`` of the vector ``x`` whose entries are largest in magnitude."""
    return idx if idx.shape[0] <= k else idx[torch.topk(x[idx].abs(), k, sorted=False).indices]


def topk_abs(x: torch.Tensor, k: int) -> torch.Tensor:
    """int64 indices of ``k`` entries of the vector ``x`` largest in magnitude (ties: any, NaN largest).

    A threshold is read off a sample of ``x`` (``s`` entries in runs of :data:`RUN` at positions
    drawn with a fixed seed, ``s`` chosen so that about 128 of them are above the k-th largest, at
    most ``n / 64``), lowered by three
    standard deviations of that count so that at least ``k`` entries reach it; one pass then finds
    those (about ``1.3 k``), and ``torch.topk`` of them gives the exact top-k. Where the threshold
    is 0 (more than ``n - k`` zeros), or the sample misjudged and fewer than ``k`` reach it, the
    top-k of the non-zeros is taken instead, and zeros fill it up to ``k``.
    """
    n = x.shape[0]
    k = min(k, n)
    if n < SAMPLED_MIN or 8 * k > n:
        return torch.topk(x.abs(), k, sorted=False).indices
    runs = min(n // 64, math.ceil(128 * n / k)) // RUN
    starts = torch.randint(n - RUN + 1, (runs, 1), generator=torch.Generator().manual_seed(0), device=x.device)
    sample = x[(starts + torch.arange(RUN, device=x.device)).reshape(-1)].abs()
    s = sample.shape[0]
    expected = k * s / n
    rank = min(s, math.ceil(expected + 3 * math.sqrt(expected)) + 1)
    threshold = float(torch.topk(sample, rank, sorted=False).values.min())
    if threshold > 0:
        idx = reaching(x, threshold)
        if idx.shape[0] >= k:
            return _largest(x, idx, k)
    idx = _largest(x, _nonzero(x), k)
    return idx if idx.shape[0] == k else torch.cat([idx, _zeros(idx, k - idx.shape[0])])


def _zeros(nonzero: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` indices not among ``nonzero`` (the lowest such)."""
    span = nonzero.shape[0] + count
    free = torch.ones(span, dtype=torch.bool, device=nonzero.device)
    free[nonzero[nonzero < span]] = False
    return torch.nonzero(free).reshape(-1)[:count]
