"""PyTorch back-end of :mod:`hvdsketch.ops` (the contract: :class:`hvdsketch.ops.contract.Ops`).

Host tensors use the block-wise kernels of :mod:`hvdsketch.ops.torch_host` where they save a pass or a temporary.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, ContextManager, Sequence

import numpy as np
import torch

from hvdsketch.ops import torch_host

name = "torch"
writable = True
Tensor = torch.Tensor

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
           "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
           "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}


def dtype_name(x: Tensor) -> str:
    return str(x.dtype).removeprefix("torch.")


def is_floating(x: Tensor) -> bool:
    return x.is_floating_point()


def shape(x: Tensor) -> tuple[int, ...]:
    return tuple(x.shape)


def cast(x: Tensor, dtype: str) -> Tensor:
    return x.to(_DTYPES[dtype])


def reshape(x: Tensor, new_shape: Sequence[int]) -> Tensor:
    return x.reshape(tuple(new_shape))


def flatten(x: Tensor) -> Tensor:
    return x.reshape(-1)


def zeros(n: int | Sequence[int], dtype: str, like: Tensor) -> Tensor:
    return torch.zeros(n, dtype=_DTYPES[dtype], device=like.device)


def arange(n: int, like: Tensor) -> Tensor:
    return torch.arange(n, dtype=torch.int64, device=like.device)


def constant(values: Sequence[float], dtype: str, like: Tensor) -> Tensor:
    host = torch.tensor(list(values), dtype=_DTYPES[dtype], device="cpu")
    if like.device.type == "cpu":
        return host
    if like.device.type == "cuda":  # pinned: the copy is queued, the host does not wait for the device
        return host.pin_memory().to(like.device, non_blocking=True)
    return host.to(like.device)


def host_constant(values: Sequence[float], dtype: str) -> Tensor:
    return torch.tensor(list(values), dtype=_DTYPES[dtype], device="cpu")


def concat(xs: Sequence[Tensor]) -> Tensor:
    return torch.cat(list(xs))


def split(x: Tensor, sizes: Sequence[int]) -> list[Tensor]:
    return list(torch.split(x, list(sizes)))


def pad(x: Tensor, n: int) -> Tensor:
    return x if n == 0 else torch.nn.functional.pad(x, (0, n))


def nonzero_rows(x2d: Tensor) -> Tensor:
    """Rows read as integers: on the host one NumPy OR-reduction, on a device their max and min compared to 0."""
    if x2d.shape[1] == 0:
        return torch.zeros(0, dtype=torch.int64, device=x2d.device)
    bits = x2d.detach().view(_DTYPES[f"int{8 * x2d.element_size()}"])
    if bits.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(np.bitwise_or.reduce(bits.numpy(), axis=1)).astype(np.int64, copy=False))
    return torch.nonzero((bits.amax(dim=1) != 0) | (bits.amin(dim=1) != 0)).reshape(-1)


def positive(x: Tensor) -> Tensor:
    return torch.nonzero(x > 0).reshape(-1)


def indicator(n: int, idx: Tensor, dtype: str) -> Tensor:
    out = torch.zeros(n, dtype=_DTYPES[dtype], device=idx.device)
    out[idx] = 1
    return out


def gather(x: Tensor, idx: Tensor) -> Tensor:
    """``x[idx]`` by ``index_select`` (the rows of ``x`` at the flat ``idx``, shaped as ``idx``)."""
    idx = idx.to(x.device)
    return torch.index_select(x, 0, idx.reshape(-1)).reshape(*idx.shape, *x.shape[1:])


def scatter(n: int, idx: Tensor, values: Tensor, out: Tensor | None = None, clear: bool = True) -> Tensor:
    out = _zeroed(n, values, out) if clear or out is None else out
    out[idx.to(values.device)] = values.to(out.dtype)
    return out


def scatter_add(n: int, idx: Tensor, values: Tensor, out: Tensor | None = None) -> Tensor:
    return _zeroed(n, values, out).scatter_add_(0, idx.to(values.device), values)


def _zeroed(n: int, values: Tensor, out: Tensor | None) -> Tensor:
    """``out`` set to zeros, or new zeros like ``values``."""
    return torch.zeros(n, dtype=values.dtype, device=values.device) if out is None else out.zero_()


def axpy(a: float, x: Tensor, y: Tensor, out: Tensor | None = None) -> Tensor:
    if out is None:
        return torch.add(y, x, alpha=a)
    if out is x:
        return out.mul_(a).add_(y)
    return torch.add(y, x, alpha=a, out=out)


def zero_at(x: Tensor, idx: Tensor, out: Tensor | None = None) -> Tensor:
    out = x.clone() if out is None else into(out, x)
    out.view(-1).index_fill_(0, idx.to(out.device), 0)
    return out


def same_memory(a: Tensor, b: Tensor) -> bool:
    return a.device == b.device and a.data_ptr() == b.data_ptr() and a.dtype == b.dtype


def into(out: Tensor, x: Tensor) -> Tensor:
    if same_memory(out, x):
        return out
    return out.copy_(x.reshape(out.shape))


def add_rows(x: Tensor, indices: Tensor, rows: Tensor) -> Tensor:
    return x.clone().index_add_(0, indices.to(x.device), rows.to(x.dtype))


def stack(xs: Sequence[Tensor]) -> Tensor:
    return torch.stack(list(xs))


def sort0(x: Tensor) -> Tensor:
    return torch.sort(x, dim=0).values


def cumsum(x: Tensor) -> Tensor:
    return torch.cumsum(x, 0, dtype=x.dtype)


def outer_add(a: Tensor, b: Tensor) -> Tensor:
    return (a[:, None] + b[None, :]).reshape(-1)


def where_less(x: Tensor, bound: int) -> Tensor:
    return x[x < bound]


def all_finite_flag(x: Tensor) -> Tensor:
    """From ``x``'s least and largest values, finite exactly when every element is (NaN makes both NaN)."""
    if x.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=x.device)
    return torch.stack(torch.aminmax(x)).isfinite().all()


def all_true(flags: Sequence[Tensor]) -> bool:
    return bool(torch.stack([f.reshape(()) for f in flags]).all()) if flags else True


def check_true(flag: Tensor, message: str) -> None:
    if not bool(flag):
        raise ValueError(message)


def call_if(flag: Tensor | bool, fn: Callable[..., None], values: Sequence[Tensor | int]) -> None:
    if bool(flag):
        fn(*(v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for v in values))


def check_finite(x: Tensor, message: str) -> Tensor:
    if not all_finite_flag(x):
        raise FloatingPointError(message)
    return x


def to_numpy(x: Tensor) -> np.ndarray:
    return x.detach().cpu().numpy()


def nbytes(x: Tensor) -> int:
    return x.numel() * x.element_size()


def coalesce_rows(indices: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    rows, inverse = torch.unique(indices.to(torch.int64), return_inverse=True)
    summed = torch.zeros((len(rows),) + tuple(values.shape[1:]), dtype=values.dtype, device=values.device)
    return rows, summed.index_add_(0, inverse, values)


def bitwise_or_rows(x2d: Tensor) -> Tensor:
    out = x2d[0]
    for row in x2d[1:]:
        out = out | row
    return out


# -- residual memory (hvdsketch.memory) ------------------------------------

def sqnorm(x: Tensor) -> Tensor:
    return torch.sum(torch.square(x.detach().to(torch.float64)))


def topk_abs(x: Tensor, k: int) -> Tensor:
    """On the host by a sampled threshold (:func:`hvdsketch.ops.torch_host.topk_abs`)."""
    if x.device.type == "cpu":
        return torch_host.topk_abs(x, k)
    return torch.topk(x.abs(), min(k, x.shape[0]), sorted=False).indices


def device_name(x: Tensor) -> str:
    return str(x.device)


def to_host(x: Tensor) -> Tensor:
    return x.detach().to("cpu", copy=True)


def to_device(x: Tensor, like: Tensor) -> Tensor:
    return x.to(like.device)


def synchronize(x: Tensor) -> None:
    if x.device.type == "cuda":
        torch.cuda.synchronize(x.device)


def from_numpy(a: np.ndarray, like: Tensor) -> Tensor:
    return torch.from_numpy(np.array(a, copy=True)).to(like.device)


def adopt(a: np.ndarray, like: Tensor) -> Tensor:
    return torch.from_numpy(a).to(like.device)


# -- peer compressors (hvdsketch.compress: topk, randomk, dgc, qsgd, terngrad, efsignsgd, powersgd) --

def uniform(shape: int | Sequence[int], seed: int, like: Tensor) -> Tensor:
    """Drawn by a ``torch.Generator`` on ``like``'s device, seeded with ``seed``."""
    generator = torch.Generator(device=like.device).manual_seed(seed)
    return torch.rand(shape, generator=generator, dtype=like.dtype, device=like.device)


def select_abs_at_least(x: Tensor, threshold: Tensor, limit: int) -> Tensor:
    """NaN qualifies (``~(|x| < threshold)``), so a non-finite input always reaches the collective."""
    if x.device.type != "cpu":
        idx = torch.nonzero(~(x.abs() < threshold)).reshape(-1)
    elif float(threshold) > 0:
        idx = torch_host.reaching(x, float(threshold))
    else:  # every entry qualifies
        return topk_abs(x, limit)
    return idx if idx.shape[0] <= limit else idx[topk_abs(x[idx], limit)]


def bucket_norms(x: Tensor, size: int, order: float) -> Tensor:
    """Whole buckets as a matrix, the last apart; on the host L1 by :func:`hvdsketch.ops.torch_host.l1_norms`."""
    if order == 1 and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        return torch_host.l1_norms(x, size)
    whole = x.shape[0] - x.shape[0] % size
    parts = [x[:whole].reshape(-1, size), x[whole:].reshape(1, -1)] if whole < x.shape[0] else [x.reshape(-1, size)]
    if order != math.inf:
        return torch.cat([torch.linalg.vector_norm(p, ord=order, dim=1) for p in parts])
    return torch.cat([torch.maximum(p.amax(dim=1), p.amin(dim=1).neg()) for p in parts])


def stochastic_round(x: Tensor, scales: Tensor, size: int, limit: int, seed: int, dtype: str) -> Tensor:
    """:func:`hvdsketch.ops.torch_host.stochastic_round`, in blocks on the host, as one on a device."""
    return torch_host.stochastic_round(x, scales, size, limit, seed, _DTYPES[dtype])


def scaled_sum(codes: Tensor, scales: Tensor, size: int, out: Tensor | None = None) -> Tensor:
    """:func:`hvdsketch.ops.torch_host.scaled_sum`, in blocks on the host, as one on a device."""
    return torch_host.scaled_sum(codes, scales, size, out)


def sign_sum(bits: Tensor, scales: Tensor, n: int, out: Tensor | None = None) -> Tensor:
    """On the host :func:`hvdsketch.ops.torch_host.sign_sum`; on a device the bits as -1 / +1 and :func:`scaled_sum`."""
    if bits.device.type == "cpu":
        return torch_host.sign_sum(bits, scales, n, out)
    signs = 2 * unpack_bits(bits.reshape(-1)).to(torch.int8).reshape(bits.shape[0], -1)[:, :n] - 1
    return scaled_sum(signs, scales[:, None], n, out)


def reduce_sum(x: Tensor, axis: int | None = None) -> Tensor:
    return x.sum() if axis is None else x.sum(dim=axis)


def reduce_max(x: Tensor, axis: int | None = None) -> Tensor:
    return x.max() if axis is None else x.amax(dim=axis)


def reduce_min(x: Tensor, axis: int | None = None) -> Tensor:
    return x.min() if axis is None else x.amin(dim=axis)


def sign(x: Tensor) -> Tensor:
    return torch.sign(x)


def floor(x: Tensor) -> Tensor:
    return torch.floor(x)


def log2(x: Tensor) -> Tensor:
    return torch.log2(x)


def where(condition: Tensor, x: Tensor | float, y: Tensor | float) -> Tensor:
    return torch.where(condition, x, y)


def clip(x: Tensor, low: float | None = None, high: float | None = None) -> Tensor:
    return torch.clamp(x, low, high)


def matmul(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """On the host, large products in blocks of rows (:func:`hvdsketch.ops.torch_host.product`)."""
    if _host_product(a, b):
        return torch_host.product(a, b, out)
    return torch.matmul(a, b, out=out)


def sub_matmul(c: Tensor, a: Tensor, b: Tensor) -> Tensor:
    if _host_product(a, b):
        return torch_host.product(a, b, torch.empty_like(c), c)
    return torch.addmm(c, a, b, alpha=-1)


def _host_product(a: Tensor, b: Tensor) -> bool:
    """A host product worth doing in blocks: a result over a block, an inner dimension of 2 or more."""
    return (a.device.type == "cpu" and a.dim() == b.dim() == 2 and a.shape[1] > 1
            and a.shape[0] * b.shape[1] > torch_host.BLOCK)


def transpose(x2d: Tensor) -> Tensor:
    return x2d.T


def orthonormalize(x2d: Tensor) -> Tensor:
    """Householder QR, so rank-deficient inputs still give an orthonormal Q."""
    return torch.linalg.qr(x2d, mode="reduced").Q


def _bit_shifts(like: Tensor) -> Tensor:
    """``7, 6, ..., 0`` as uint8 on ``like``'s device."""
    return torch.arange(7, -1, -1, dtype=torch.uint8, device=like.device)


def pack_bits(mask: Tensor) -> Tensor:
    if mask.device.type == "cpu":
        return torch.from_numpy(np.packbits(mask.numpy()))
    bits = pad(mask.to(torch.uint8), -mask.shape[0] % 8).reshape(-1, 8)
    return (bits << _bit_shifts(mask)).sum(dim=1, dtype=torch.uint8)


def sign_bits(x: Tensor) -> Tensor:
    """On the host in blocks (:func:`hvdsketch.ops.torch_host.sign_bits`)."""
    if x.device.type == "cpu":
        return torch_host.sign_bits(x)
    return pack_bits(x >= 0)


def unpack_bits(bits: Tensor) -> Tensor:
    if bits.device.type == "cpu":
        return torch.from_numpy(np.unpackbits(bits.numpy()))
    return ((bits[:, None] >> _bit_shifts(bits)) & 1).reshape(-1)


def is_symbolic(x: Tensor) -> bool:
    return False


def outside_trace() -> ContextManager:
    return contextlib.nullcontext()


def hold(x: Tensor) -> Tensor:
    return x


def is_held(x: Tensor) -> bool:
    return False


def assign(held: Tensor, x: Tensor) -> None:
    held.copy_(x)


def held_value(held: Tensor) -> Tensor:
    return held.clone()


def unless(flag: Tensor, action: Callable[[], None]) -> None:
    if not bool(flag):
        action()
