"""NumPy back-end of :mod:`hvdsketch.ops` (the contract: :class:`hvdsketch.ops.contract.Ops`); all in host memory."""
from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Sequence

import numpy as np

name = "numpy"
writable = True
Tensor = np.ndarray


def dtype_name(x: Tensor) -> str:
    return str(x.dtype)


def is_floating(x: Tensor) -> bool:
    return np.issubdtype(x.dtype, np.floating)


def shape(x: Tensor) -> tuple[int, ...]:
    return tuple(int(d) for d in x.shape)


def cast(x: Tensor, dtype: str) -> Tensor:
    return x.astype(dtype, copy=False)


def reshape(x: Tensor, new_shape: Sequence[int]) -> Tensor:
    return np.reshape(x, tuple(new_shape))


def flatten(x: Tensor) -> Tensor:
    return np.reshape(x, (-1,))


def zeros(n: int | Sequence[int], dtype: str, like: Tensor) -> Tensor:
    return np.zeros(n, dtype=dtype)


def arange(n: int, like: Tensor) -> Tensor:
    return np.arange(n, dtype=np.int64)


def constant(values: Sequence[float], dtype: str, like: Tensor) -> Tensor:
    return np.asarray(values, dtype=dtype)


def host_constant(values: Sequence[float], dtype: str) -> Tensor:
    return np.asarray(values, dtype=dtype)


def concat(xs: Sequence[Tensor]) -> Tensor:
    return np.concatenate(list(xs))


def split(x: Tensor, sizes: Sequence[int]) -> list[Tensor]:
    return np.split(x, np.cumsum(sizes)[:-1])


def pad(x: Tensor, n: int) -> Tensor:
    return x if n == 0 else np.concatenate([x, np.zeros(n, dtype=x.dtype)])


def nonzero_rows(x2d: Tensor) -> Tensor:
    """One OR-reduction of the rows read as integers of the same size."""
    bits = x2d.view(f"i{x2d.dtype.itemsize}")
    return np.flatnonzero(np.bitwise_or.reduce(bits, axis=1)).astype(np.int64, copy=False)


def positive(x: Tensor) -> Tensor:
    return np.flatnonzero(x > 0).astype(np.int64)


def indicator(n: int, idx: Tensor, dtype: str) -> Tensor:
    out = np.zeros(n, dtype=dtype)
    out[idx] = 1
    return out


def gather(x: Tensor, idx: Tensor) -> Tensor:
    return x[idx]


def scatter(n: int, idx: Tensor, values: Tensor, out: Tensor | None = None, clear: bool = True) -> Tensor:
    out = _zeroed(n, values, out) if clear or out is None else out
    out[idx] = values
    return out


def scatter_add(n: int, idx: Tensor, values: Tensor, out: Tensor | None = None) -> Tensor:
    out = _zeroed(n, values, out)
    np.add.at(out, idx, values)
    return out


def _zeroed(n: int, values: Tensor, out: Tensor | None) -> Tensor:
    """``out`` set to zeros, or new zeros like ``values``."""
    if out is None:
        return np.zeros(n, dtype=values.dtype)
    out.fill(0)
    return out


def axpy(a: float, x: Tensor, y: Tensor, out: Tensor | None = None) -> Tensor:
    if out is None:
        return (a * x + y).astype(np.result_type(x, y), copy=False)
    np.multiply(x, a, out=out, casting="unsafe")
    np.add(out, y, out=out, casting="unsafe")
    return out


def zero_at(x: Tensor, idx: Tensor, out: Tensor | None = None) -> Tensor:
    out = np.array(x, copy=True) if out is None else into(out, x)
    out.reshape(-1)[idx] = 0
    return out


def same_memory(a: Tensor, b: Tensor) -> bool:
    return a.ctypes.data == b.ctypes.data and a.dtype == b.dtype


def into(out: Tensor, x: Tensor) -> Tensor:
    if not same_memory(out, x):
        np.copyto(out, np.reshape(x, out.shape), casting="unsafe")
    return out


def add_rows(x: Tensor, indices: Tensor, rows: Tensor) -> Tensor:
    out = np.array(x, copy=True)
    np.add.at(out, indices, rows.astype(x.dtype, copy=False))
    return out


def stack(xs: Sequence[Tensor]) -> Tensor:
    return np.stack(list(xs))


def sort0(x: Tensor) -> Tensor:
    return np.sort(x, axis=0)


def cumsum(x: Tensor) -> Tensor:
    return np.cumsum(x, dtype=x.dtype)


def outer_add(a: Tensor, b: Tensor) -> Tensor:
    return (a[:, None] + b[None, :]).reshape(-1)


def where_less(x: Tensor, bound: int) -> Tensor:
    return x[x < bound]


def all_finite_flag(x: Tensor) -> Tensor:
    return np.isfinite(x).all()


def all_true(flags: Sequence[Tensor]) -> bool:
    return bool(np.all([bool(f) for f in flags]))


def check_true(flag: Tensor, message: str) -> None:
    if not bool(flag):
        raise ValueError(message)


def call_if(flag: Tensor | bool, fn: Callable[..., None], values: Sequence[Tensor | int]) -> None:
    if bool(flag):
        fn(*(np.asarray(v) for v in values))


def check_finite(x: Tensor, message: str) -> Tensor:
    if not np.isfinite(x).all():
        raise FloatingPointError(message)
    return x


def to_numpy(x: Tensor) -> np.ndarray:
    return np.asarray(x)


def nbytes(x: Tensor) -> int:
    return int(x.nbytes)


def coalesce_rows(indices: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    rows, inverse = np.unique(indices.astype(np.int64), return_inverse=True)
    summed = np.zeros((len(rows),) + values.shape[1:], dtype=values.dtype)
    np.add.at(summed, inverse, values)
    return rows, summed


def bitwise_or_rows(x2d: Tensor) -> Tensor:
    out = x2d[0]
    for row in x2d[1:]:
        out = out | row
    return out


# -- residual memory (hvdsketch.memory) ------------------------------------

try:  # registers numpy's "bfloat16" dtype, so cast(x, "bfloat16") works here as in torch and TF
    import ml_dtypes  # noqa: F401
except ImportError:  # pragma: no cover - ml_dtypes ships with TensorFlow
    pass


def bucket_norms(x: Tensor, size: int, order: float) -> Tensor:
    starts = np.arange(0, x.shape[0], size)
    if order == 2:
        return np.sqrt(np.add.reduceat(x * x, starts))
    return (np.add if order == 1 else np.maximum).reduceat(np.abs(x), starts)


def stochastic_round(x: Tensor, scales: Tensor, size: int, limit: int, seed: int, dtype: str) -> Tensor:
    y = x * np.repeat(scales, size)[:x.shape[0]]
    y += uniform(y.shape, seed, y)
    with np.errstate(invalid="ignore"):  # NaN has no integer: its bucket's scale carries it to the check
        return np.clip(np.floor(y, out=y), -limit, limit, out=y).astype(dtype)


def scaled_sum(codes: Tensor, scales: Tensor, size: int, out: Tensor | None = None) -> Tensor:
    return np.sum(codes * np.repeat(scales, size, axis=1)[:, :codes.shape[1]], axis=0, out=out)


def sign_sum(bits: Tensor, scales: Tensor, n: int, out: Tensor | None = None) -> Tensor:
    signs = 2 * np.unpackbits(bits, axis=1)[:, :n].astype(np.int8) - 1
    return scaled_sum(signs, scales[:, None], n, out)


def sqnorm(x: Tensor) -> Tensor:
    return np.asarray(np.sum(np.square(x, dtype=np.float64)))


def topk_abs(x: Tensor, k: int) -> Tensor:
    if k >= x.shape[0]:
        return np.arange(x.shape[0], dtype=np.int64)
    return np.argpartition(np.abs(x), x.shape[0] - k)[x.shape[0] - k:].astype(np.int64)


def device_name(x: Tensor) -> str:
    return "cpu"


def to_host(x: Tensor) -> Tensor:
    return np.array(x, copy=True)


def to_device(x: Tensor, like: Tensor) -> Tensor:
    return x


def synchronize(x: Tensor) -> None:
    """NumPy computes eagerly: nothing to wait for."""


def from_numpy(a: np.ndarray, like: Tensor) -> Tensor:
    return np.array(a, copy=True)


def adopt(a: np.ndarray, like: Tensor) -> Tensor:
    return a


# -- peer compressors (hvdsketch.compress: topk, randomk, dgc, qsgd, terngrad, efsignsgd, powersgd) --

def uniform(shape: int | Sequence[int], seed: int, like: Tensor) -> Tensor:
    """Drawn by NumPy's PCG64 seeded with ``seed``."""
    dtype = like.dtype if like.dtype in (np.float32, np.float64) else np.float32
    return np.random.default_rng(seed).random(shape, dtype=dtype).astype(like.dtype, copy=False)


def select_abs_at_least(x: Tensor, threshold: Tensor, limit: int) -> Tensor:
    """NaN qualifies (``~(|x| < threshold)``), so a non-finite input always reaches the collective."""
    idx = np.flatnonzero(~(np.abs(x) < threshold)).astype(np.int64)
    if idx.shape[0] > limit:
        idx = idx[np.argpartition(np.abs(x[idx]), idx.shape[0] - limit)[idx.shape[0] - limit:]]
    return idx


def reduce_sum(x: Tensor, axis: int | None = None) -> Tensor:
    return np.sum(x, axis=axis)


def reduce_max(x: Tensor, axis: int | None = None) -> Tensor:
    return np.max(x, axis=axis)


def reduce_min(x: Tensor, axis: int | None = None) -> Tensor:
    return np.min(x, axis=axis)


def sign(x: Tensor) -> Tensor:
    return np.sign(x)


def floor(x: Tensor) -> Tensor:
    return np.floor(x)


def log2(x: Tensor) -> Tensor:
    with np.errstate(divide="ignore", invalid="ignore"):  # -inf at 0, NaN below, as torch and TF
        return np.log2(x)


def where(condition: Tensor, x: Tensor | float, y: Tensor | float) -> Tensor:
    return np.where(condition, x, y)


def clip(x: Tensor, low: float | None = None, high: float | None = None) -> Tensor:
    return np.clip(x, low, high)


def matmul(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    return np.matmul(a, b, out=out)


def sub_matmul(c: Tensor, a: Tensor, b: Tensor) -> Tensor:
    return c - a @ b


def transpose(x2d: Tensor) -> Tensor:
    return x2d.T


def orthonormalize(x2d: Tensor) -> Tensor:
    """Householder QR, so rank-deficient inputs still give an orthonormal Q."""
    return np.linalg.qr(x2d, mode="reduced")[0]


def pack_bits(mask: Tensor) -> Tensor:
    return np.packbits(mask.astype(bool))


def sign_bits(x: Tensor) -> Tensor:
    return pack_bits(x >= 0)


def unpack_bits(bits: Tensor) -> Tensor:
    return np.unpackbits(bits)


def is_symbolic(x: Tensor) -> bool:
    return False


def outside_trace() -> ContextManager:
    return contextlib.nullcontext()


def hold(x: Tensor) -> Tensor:
    return x


def is_held(x: Tensor) -> bool:
    return False


def assign(held: Tensor, x: Tensor) -> None:
    held[...] = x


def held_value(held: Tensor) -> Tensor:
    return held.copy()


def unless(flag: Tensor, action: Callable[[], None]) -> None:
    if not bool(flag):
        action()
