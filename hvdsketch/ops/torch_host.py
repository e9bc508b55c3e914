"""Host-memory kernels of the PyTorch back-end, done block by block.

Each kernel walks the gradient in blocks of :data:`BLOCK` elements through one small buffer, so the data is read
once and no temporary of its size is made but the result. :mod:`hvdsketch.ops.torch` calls them for host tensors,
and the quantizers' kernels as one block on a device.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

#: Elements per block of the host kernels (one MiB of float32).
BLOCK = 1 << 18

#: Below this many elements (or when more than 1/8 are kept) :func:`topk_abs` calls ``torch.topk`` itself.
SAMPLED_MIN = 1 << 16

#: The sample of :func:`topk_abs` is taken in runs of this many consecutive entries.
RUN = 16


def _numpy(block: torch.Tensor) -> np.ndarray:
    """A host block as a NumPy array (bfloat16, which NumPy lacks, as float32)."""
    return (block.float() if block.dtype == torch.bfloat16 else block).numpy()


def _indices(x: torch.Tensor, mark: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> torch.Tensor:
    """int64 indices of the entries of the host vector ``x`` that ``mark(block, into)`` marks true, block by
    block (``mark`` writes a block's truths into the bool buffer ``into`` and returns it)."""
    n = x.shape[0]
    into = np.empty(min(BLOCK, n), dtype=bool)
    return torch.from_numpy(np.concatenate([
        np.flatnonzero(mark(_numpy(x[a:a + BLOCK]), into[:min(BLOCK, n - a)])) + a for a in range(0, n, BLOCK)]))


def reaching(x: torch.Tensor, threshold: float) -> torch.Tensor:
    """int64 indices of the entries of the vector ``x`` with ``|x| >= threshold`` (> 0), NaN included."""
    magnitude = np.empty(min(BLOCK, x.shape[0]), dtype=_numpy(x[:1]).dtype)

    def mark(block: np.ndarray, into: np.ndarray) -> np.ndarray:
        below = np.less(np.abs(block, out=magnitude[:block.shape[0]]), threshold, out=into)
        return np.logical_not(below, out=into)

    return _indices(x, mark)


def _nonzero(x: torch.Tensor) -> torch.Tensor:
    """int64 indices of the non-zero entries of the vector ``x``, NaN included."""
    return _indices(x, lambda block, into: np.not_equal(block, 0, out=into))


def _largest(x: torch.Tensor, idx: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` of the indices ``idx`` of the vector ``x`` whose entries are largest in magnitude."""
    return idx if idx.shape[0] <= k else idx[torch.topk(x[idx].abs(), k, sorted=False).indices]


def topk_abs(x: torch.Tensor, k: int) -> torch.Tensor:
    """int64 indices of ``k`` entries of the vector ``x`` largest in magnitude (ties: any, NaN largest).

    A threshold from a seeded sample of ``x`` (about 128 entries above the k-th largest, lowered by three
    standard deviations) selects the candidates in one pass, and ``torch.topk`` of them is the exact top-k. Where
    the threshold is 0 or too few reach it, the top-k of the non-zeros is taken, filled up to ``k`` with zeros.
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


def product(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None,
            minuend: torch.Tensor | None = None) -> torch.Tensor:
    """The matrix product ``a b`` (``minuend - a b`` where given) into ``out`` (or new), a block of rows at a time."""
    n, m = a.shape[0], b.shape[1]
    if out is None:
        out = torch.empty((n, m), dtype=a.dtype, device=a.device)
    rows = max(1, BLOCK // 4 // max(m, 1))
    for start in range(0, n, rows):
        part = slice(start, start + rows)
        if minuend is None:
            torch.mm(a[part], b, out=out[part])
        else:
            torch.addmm(minuend[part], a[part], b, alpha=-1, out=out[part])
    return out


# -- stochastic rounding ----------------------------------------------------------------------

def _block(x: torch.Tensor) -> int:
    """Entries per block: :data:`BLOCK` on the host, all of them on a device."""
    return BLOCK if x.device.type == "cpu" else max(1, x.shape[-1])


def _spans(n: int, size: int, block: int) -> list[tuple[int, int, int, int]]:
    """Blocks ``(start, stop, rows, width)`` of at most ``block`` entries: ``rows`` whole buckets of ``width = size``,
    or part of one bucket (``rows = 1``), so a block is ``x[start:stop].view(rows, width)``."""
    if size > block:
        return [(a, min(a + block, start + size, n), 1, min(a + block, start + size, n) - a)
                for start in range(0, n, size) for a in range(start, min(start + size, n), block)]
    step, whole = block // size * size, n - n % size
    spans = [(a, min(a + step, whole), (min(a + step, whole) - a) // size, size) for a in range(0, whole, step)]
    return spans + ([(whole, n, 1, n - whole)] if whole < n else [])


def _scales(scales: torch.Tensor, size: int, start: int, rows: int) -> torch.Tensor:
    """The scales of the ``rows`` buckets from the one holding entry ``start``, as a column."""
    return scales[..., start // size:start // size + rows, None]


def stochastic_round(x: torch.Tensor, scales: torch.Tensor, size: int, limit: int, seed: int,
                     dtype: torch.dtype) -> torch.Tensor:
    """``floor(x_i * scales[i // size] + u_i)`` clipped to ``[-limit, limit]``, as ``dtype``.

    Each ``u_i`` is 16 random bits, ``(r + 0.5) / 2^16``, four of them from each random 64-bit word (:func:`_words`).
    """
    n = x.shape[0]
    block = _block(x)
    most = -(-min(block, n) // 4)
    words = _words(seed, most, x.device)
    # float32 at least: in float16, (r + 32768.5) / 2^16 would round to multiples of 2^-11, and up to 1
    y = torch.empty(4 * most, dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
    out = torch.empty(n, dtype=dtype, device=x.device)
    for a, b, rows, width in _spans(n, size, block):
        m = -(-(b - a) // 4)
        bits = words(m).view(torch.int16)
        u = y[:4 * m].copy_(bits)[:b - a].view(rows, width)
        u.add_(32768.5).mul_(1 / 65536)
        u.addcmul_(x[a:b].view(rows, width), _scales(scales, size, a, rows)).floor_().clamp_(-limit, limit)
        out[a:b].view(rows, width).copy_(u)
    return out


def _words(seed: int, most: int, device: torch.device) -> Callable[[int], torch.Tensor]:
    """``words(m)``: the next ``m <= most`` random int64 words seeded by ``seed`` (host: NumPy's SFC64)."""
    if device.type == "cpu":
        source = np.random.SFC64(seed)
        return lambda m: torch.from_numpy(source.random_raw(m).view(np.int64))
    generator = torch.Generator(device=device).manual_seed(seed)
    buffer = torch.empty(most, dtype=torch.int64, device=device)
    return lambda m: buffer[:m].random_(-2**63, 2**63 - 1, generator=generator)


def l1_norms(x: torch.Tensor, size: int) -> torch.Tensor:
    """The L1 norm of each bucket of ``size`` entries (the last may be shorter) of the float32 or float64 ``x``."""
    n = x.shape[0]
    block = _block(x)
    norms = torch.zeros(-(-n // size), dtype=x.dtype, device=x.device)
    magnitude = torch.empty(min(block, n), dtype=x.dtype, device=x.device)
    for a, b, rows, width in _spans(n, size, block):
        norms[a // size:a // size + rows] += torch.abs(x[a:b], out=magnitude[:b - a]).view(rows, width).sum(dim=1)
    return norms


def sign_bits(x: torch.Tensor) -> torch.Tensor:
    """``x >= 0`` of the host vector ``x``, packed 8 to a byte, highest bit first."""
    n = x.shape[0]
    packed = np.empty(-(-n // 8), dtype=np.uint8)
    into = np.empty(min(BLOCK, n), dtype=bool)
    for a in range(0, n, BLOCK):  # BLOCK is a multiple of 8: each block fills whole bytes
        block = _numpy(x[a:a + BLOCK])
        packed[a // 8:(a + block.shape[0] + 7) // 8] = np.packbits(np.greater_equal(block, 0, out=into[:block.shape[0]]))
    return torch.from_numpy(packed)


#: Each byte's eight bits as -1 / +1, highest bit first (row ``b`` for the byte ``b``).
_SIGNS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).astype(np.float32) * 2 - 1


def sign_sum(bits: torch.Tensor, scales: torch.Tensor, n: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """``sum_r scales[r] * (2 b_ri - 1)`` for the first ``n`` bits of each row of the packed ``bits`` (one row
    a rank), each byte's eight signed scales looked up in a table of the 256 bytes."""
    world = bits.shape[0]
    if out is None:
        out = torch.empty(n, dtype=scales.dtype, device=bits.device)
    signs = torch.from_numpy(_SIGNS).to(device=bits.device, dtype=scales.dtype)
    tables = [signs * scales[r] for r in range(world)]
    whole = n // 8  # bytes all of whose bits are among the first n
    step = max(1, min(BLOCK // 8, whole))
    index = torch.empty(step, dtype=torch.int64, device=bits.device)
    added = torch.empty((step, 8), dtype=scales.dtype, device=bits.device)
    octets = out[:8 * whole].view(whole, 8)
    for a in range(0, whole, step):
        rows = octets[a:a + step]
        count = rows.shape[0]
        for r in range(world):
            i = index[:count].copy_(bits[r, a:a + count])
            if r == 0:
                torch.index_select(tables[r], 0, i, out=rows)
            else:
                rows.add_(torch.index_select(tables[r], 0, i, out=added[:count]))
    if 8 * whole < n:
        out[8 * whole:] = sum(tables[r][int(bits[r, whole])] for r in range(world))[:n - 8 * whole]
    return out


def scaled_sum(codes: torch.Tensor, scales: torch.Tensor, size: int, out: torch.Tensor | None) -> torch.Tensor:
    """``sum_r codes[r, i] * scales[r, i // size]``, added block by block into ``out`` (or new)."""
    n = codes.shape[1]
    if out is None:
        out = torch.empty(n, dtype=scales.dtype, device=codes.device)
    for a, b, rows, width in _spans(n, size, _block(codes)):
        total, column = out[a:b].view(rows, width), _scales(scales, size, a, rows)
        torch.mul(codes[0, a:b].view(rows, width), column[0], out=total)
        for r in range(1, codes.shape[0]):
            total.addcmul_(codes[r, a:b].view(rows, width), column[r])
    return out
