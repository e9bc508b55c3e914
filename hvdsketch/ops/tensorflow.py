"""TensorFlow back-end of :mod:`hvdsketch.ops` (the contract: :class:`hvdsketch.ops.contract.Ops`).

Every function also works inside ``tf.function``. Eager TensorFlow runs an op on its default device whatever its
inputs' device, so creating functions place their result on ``like``'s device (in a graph the enclosing one holds).
"""
from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Sequence

import numpy as np
import tensorflow as tf

name = "tensorflow"
writable = False
Tensor = tf.Tensor


def dtype_name(x: Tensor) -> str:
    return x.dtype.name


def is_floating(x: Tensor) -> bool:
    return x.dtype.is_floating


def shape(x: Tensor) -> tuple[int, ...]:
    if not x.shape.is_fully_defined():
        raise ValueError(f"hvdsketch: tensor {getattr(x, 'name', '')} has a partly unknown shape "
                         f"{x.shape}; compression needs static shapes")
    return tuple(int(d) for d in x.shape)


def cast(x: Tensor, dtype: str) -> Tensor:
    return tf.cast(x, dtype)


def reshape(x: Tensor, new_shape: Sequence[int]) -> Tensor:
    return tf.reshape(x, list(new_shape))


def flatten(x: Tensor) -> Tensor:
    return tf.reshape(x, [-1])


def _on(like: Tensor | None) -> ContextManager:
    """Placement on ``like``'s device, when it has one (eager tensors do, traced ones not yet)."""
    device = getattr(like, "device", "")
    return tf.device(device) if device else contextlib.nullcontext()


def zeros(n: int | Sequence[int], dtype: str, like: Tensor) -> Tensor:
    with _on(like):
        return tf.zeros(n, dtype=dtype)


def arange(n: int, like: Tensor) -> Tensor:
    with _on(like):
        return tf.range(n, dtype=tf.int64)


def constant(values: Sequence[float], dtype: str, like: Tensor) -> Tensor:
    with _on(like):
        return tf.constant(list(values), dtype=dtype)


def host_constant(values: Sequence[float], dtype: str) -> Tensor:
    with tf.device("/CPU:0"):
        return tf.constant(list(values), dtype=dtype)


def concat(xs: Sequence[Tensor]) -> Tensor:
    return tf.concat(list(xs), axis=0)


def split(x: Tensor, sizes: Sequence[int]) -> list[Tensor]:
    return tf.split(x, list(sizes))


def pad(x: Tensor, n: int) -> Tensor:
    return x if n == 0 else tf.pad(x, [[0, n]])


def nonzero_rows(x2d: Tensor) -> Tensor:
    """Rows read as integers, as the other back-ends read them."""
    bits = tf.bitcast(x2d, tf.as_dtype(f"int{8 * x2d.dtype.size}"))
    return tf.reshape(tf.where(tf.reduce_any(tf.not_equal(bits, 0), axis=1)), [-1])


def positive(x: Tensor) -> Tensor:
    return tf.reshape(tf.where(x > 0), [-1])


def indicator(n: int, idx: Tensor, dtype: str) -> Tensor:
    with _on(idx):
        return tf.scatter_nd(idx[:, None], tf.ones_like(idx, dtype=dtype), [n])


def gather(x: Tensor, idx: Tensor) -> Tensor:
    return tf.gather(x, idx)


def scatter(n: int, idx: Tensor, values: Tensor, out: Tensor | None = None, clear: bool = True) -> Tensor:
    _immutable(out)
    with _on(values):
        return tf.scatter_nd(idx[:, None], values, [n])


def scatter_add(n: int, idx: Tensor, values: Tensor, out: Tensor | None = None) -> Tensor:
    _immutable(out)
    with _on(values):
        return tf.tensor_scatter_nd_add(tf.zeros([n], values.dtype), idx[:, None], values)


def axpy(a: float, x: Tensor, y: Tensor, out: Tensor | None = None) -> Tensor:
    _immutable(out)
    return a * x + y


def zero_at(x: Tensor, idx: Tensor, out: Tensor | None = None) -> Tensor:
    _immutable(out)
    flat = tf.reshape(x, [-1])
    return tf.reshape(tf.tensor_scatter_nd_update(flat, idx[:, None], tf.zeros(tf.shape(idx), x.dtype)), tf.shape(x))


def same_memory(a: Tensor, b: Tensor) -> bool:
    return False


def into(out: Tensor, x: Tensor) -> Tensor:
    raise TypeError(_IMMUTABLE)


_IMMUTABLE = "hvdsketch: a TensorFlow tensor cannot be written into (out= is for PyTorch and numpy)"


def _immutable(out: Tensor | None) -> None:
    if out is not None:
        raise TypeError(_IMMUTABLE)


def add_rows(x: Tensor, indices: Tensor, rows: Tensor) -> Tensor:
    return tf.tensor_scatter_nd_add(x, tf.cast(indices, tf.int64)[:, None], tf.cast(rows, x.dtype))


def stack(xs: Sequence[Tensor]) -> Tensor:
    return tf.stack(list(xs))


def sort0(x: Tensor) -> Tensor:
    return tf.sort(x, axis=0)


def cumsum(x: Tensor) -> Tensor:
    return tf.math.cumsum(x)


def outer_add(a: Tensor, b: Tensor) -> Tensor:
    return tf.reshape(a[:, None] + b[None, :], [-1])


def where_less(x: Tensor, bound: int) -> Tensor:
    return tf.boolean_mask(x, x < bound)


def all_finite_flag(x: Tensor) -> Tensor:
    return tf.reduce_all(tf.math.is_finite(x))


def all_true(flags: Sequence[Tensor]) -> bool:
    return bool(tf.reduce_all(tf.stack(flags))) if flags else True


def check_true(flag: Tensor, message: str) -> None:
    if tf.executing_eagerly():
        if not bool(flag):
            raise ValueError(message)
    else:
        tf.debugging.Assert(flag, [message])


def call_if(flag: Tensor | bool, fn: Callable[..., None], values: Sequence[Tensor | int]) -> None:
    if tf.executing_eagerly():
        if bool(flag):
            fn(*(np.asarray(v) for v in values))
        return

    def call() -> Tensor:
        tf.numpy_function(lambda *xs: fn(*xs) or np.int8(0), list(values), tf.int8, stateful=True)
        return tf.constant(0, tf.int8)

    tf.cond(tf.convert_to_tensor(flag), call, lambda: tf.constant(0, tf.int8))


def check_finite(x: Tensor, message: str) -> Tensor:
    return tf.debugging.assert_all_finite(x, message)


def to_numpy(x: Tensor) -> np.ndarray:
    """``x``'s value; a held ``tf.Variable``'s current value even while a graph is traced."""
    with tf.init_scope():
        return x.numpy()


def nbytes(x: Tensor) -> int | None:
    if not x.shape.is_fully_defined():
        return None
    return x.shape.num_elements() * x.dtype.size


def coalesce_rows(indices: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    rows = tf.sort(tf.unique(tf.cast(indices, tf.int64)).y)
    position = tf.searchsorted(rows, tf.cast(indices, tf.int64))
    return rows, tf.math.unsorted_segment_sum(values, position, tf.shape(rows)[0])


def bitwise_or_rows(x2d: Tensor) -> Tensor:
    return tf.foldl(tf.bitwise.bitwise_or, x2d[1:], initializer=x2d[0])


# -- residual memory (hvdsketch.memory) ------------------------------------

def bucket_norms(x: Tensor, size: int, order: float) -> Tensor:
    buckets = tf.reshape(pad(x, -int(x.shape[0]) % size), [-1, size])  # zeros change no norm
    return tf.norm(buckets, ord={1: 1, 2: "euclidean"}.get(order, np.inf), axis=1)


def stochastic_round(x: Tensor, scales: Tensor, size: int, limit: int, seed: int, dtype: str) -> Tensor:
    y = x * tf.repeat(scales, size)[:int(x.shape[0])]
    return tf.cast(tf.clip_by_value(tf.floor(y + uniform(int(x.shape[0]), seed, y)), -limit, limit), dtype)


def scaled_sum(codes: Tensor, scales: Tensor, size: int, out: Tensor | None = None) -> Tensor:
    _immutable(out)
    per_entry = tf.repeat(scales, size, axis=1)[:, :tf.shape(codes)[1]]  # allgathered: known at run time
    return tf.reduce_sum(tf.cast(codes, scales.dtype) * per_entry, axis=0)


def sign_sum(bits: Tensor, scales: Tensor, n: int, out: Tensor | None = None) -> Tensor:
    signs = 2 * tf.cast(tf.reshape(unpack_bits(tf.reshape(bits, [-1])), [tf.shape(bits)[0], -1])[:, :n], tf.int8) - 1
    return scaled_sum(signs, scales[:, None], n, out)


def sqnorm(x: Tensor) -> Tensor:
    return tf.reduce_sum(tf.square(tf.cast(x, tf.float64)))


def topk_abs(x: Tensor, k: int) -> Tensor:
    k = min(k, int(x.shape[0]))
    return tf.cast(tf.math.top_k(_nan_largest(tf.abs(x)), k, sorted=False).indices, tf.int64)


def device_name(x: Tensor) -> str:
    device = tf.DeviceSpec.from_string(x.device or "/device:CPU:0")
    return "cpu" if device.device_type in (None, "CPU") else f"{device.device_type.lower()}:{device.device_index}"


def to_host(x: Tensor) -> Tensor:
    with tf.device("/device:CPU:0"):
        return tf.identity(x)


def to_device(x: Tensor, like: Tensor) -> Tensor:
    with _on(like):
        return tf.identity(x)


def synchronize(x: Tensor) -> None:
    """Block until ``x`` is computed (eager ops may run asynchronously on a GPU)."""
    if not is_symbolic(x):
        tf.reshape(x, [-1])[:1].numpy()


def from_numpy(a: np.ndarray, like: Tensor) -> Tensor:
    with _on(like):
        return tf.constant(a)


def adopt(a: np.ndarray, like: Tensor) -> Tensor:
    """TensorFlow copies ``a``: :func:`from_numpy`."""
    return from_numpy(a, like)


# -- peer compressors (hvdsketch.compress: topk, randomk, dgc, qsgd, terngrad, efsignsgd, powersgd) --

def uniform(shape: int | Sequence[int], seed: int, like: Tensor) -> Tensor:
    """``tf.random.stateless_uniform``, so the same inside ``tf.function``."""
    shape = [shape] if isinstance(shape, int) else list(shape)
    with _on(like):
        return tf.random.stateless_uniform(shape, seed=tf.constant([seed >> 32, seed & 0xFFFFFFFF], tf.int64),
                                           dtype=like.dtype)


def select_abs_at_least(x: Tensor, threshold: Tensor, limit: int) -> Tensor:
    """NaN qualifies and ranks largest, so a non-finite input always reaches the collective."""
    magnitude = _nan_largest(tf.abs(x))
    idx = tf.reshape(tf.where(tf.logical_not(magnitude < threshold)), [-1])
    kept = tf.math.top_k(tf.gather(magnitude, idx), tf.minimum(tf.size(idx), limit), sorted=False).indices
    return tf.gather(idx, kept)


def _nan_largest(magnitude: Tensor) -> Tensor:
    """``magnitude`` with NaN as +inf: ``tf.math.top_k`` may pass over NaN, NumPy and PyTorch rank it largest."""
    return tf.where(tf.math.is_nan(magnitude), tf.constant(np.inf, magnitude.dtype), magnitude)


def reduce_sum(x: Tensor, axis: int | None = None) -> Tensor:
    return tf.reduce_sum(x, axis=axis)


def reduce_max(x: Tensor, axis: int | None = None) -> Tensor:
    return tf.reduce_max(x, axis=axis)


def reduce_min(x: Tensor, axis: int | None = None) -> Tensor:
    return tf.reduce_min(x, axis=axis)


def sign(x: Tensor) -> Tensor:
    return tf.sign(x)


def floor(x: Tensor) -> Tensor:
    return tf.floor(x)


def log2(x: Tensor) -> Tensor:
    """Exact at powers of two, as torch's and numpy's (``ln x / ln 2`` alone may miss by an ulp)."""
    approx = tf.math.log(x) / tf.math.log(tf.constant(2.0, x.dtype))
    nearest = tf.round(approx)
    return tf.where(tf.pow(tf.constant(2.0, x.dtype), nearest) == x, nearest, approx)


def where(condition: Tensor, x: Tensor | float, y: Tensor | float) -> Tensor:
    dtype = (x if isinstance(x, (tf.Tensor, tf.Variable)) else y).dtype
    return tf.where(condition, tf.cast(x, dtype), tf.cast(y, dtype))


def clip(x: Tensor, low: float | None = None, high: float | None = None) -> Tensor:
    if low is not None:
        x = tf.maximum(x, tf.cast(low, x.dtype))
    if high is not None:
        x = tf.minimum(x, tf.cast(high, x.dtype))
    return x


def matmul(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    _immutable(out)
    return tf.linalg.matmul(a, b)


def sub_matmul(c: Tensor, a: Tensor, b: Tensor) -> Tensor:
    return c - tf.linalg.matmul(a, b)


def transpose(x2d: Tensor) -> Tensor:
    return tf.transpose(x2d)


def orthonormalize(x2d: Tensor) -> Tensor:
    """Householder QR, so rank-deficient inputs still give an orthonormal Q."""
    return tf.linalg.qr(x2d, full_matrices=False).q


def pack_bits(mask: Tensor) -> Tensor:
    bits = tf.cast(mask, tf.int32)
    bits = tf.reshape(tf.pad(bits, [[0, -tf.size(bits) % 8]]), [-1, 8])
    return tf.cast(tf.reduce_sum(tf.bitwise.left_shift(bits, tf.range(7, -1, -1)), axis=1), tf.uint8)


def sign_bits(x: Tensor) -> Tensor:
    return pack_bits(x >= 0)


def unpack_bits(bits: Tensor) -> Tensor:
    shifted = tf.bitwise.right_shift(tf.cast(bits, tf.int32)[:, None], tf.range(7, -1, -1))
    return tf.cast(tf.reshape(tf.bitwise.bitwise_and(shifted, 1), [-1]), tf.uint8)


def is_symbolic(x: Tensor) -> bool:
    return not tf.executing_eagerly()


def outside_trace() -> ContextManager:
    return tf.init_scope()


def hold(x: Tensor) -> Tensor:
    """A ``tf.Variable`` of ``x``, made outside any graph being traced (its first run reads ``x``)."""
    with tf.init_scope():
        return tf.Variable(x, trainable=False)


def is_held(x: Tensor) -> bool:
    return isinstance(x, tf.Variable)


def assign(held: Tensor, x: Tensor) -> None:
    held.assign(x)


def held_value(held: Tensor) -> Tensor:
    return tf.identity(held)


def unless(flag: Tensor, action: Callable[[], None]) -> None:
    if tf.executing_eagerly():
        if not bool(flag):
            action()
        return

    def act() -> Tensor:
        action()
        return tf.constant(True)

    tf.cond(tf.convert_to_tensor(flag), lambda: tf.constant(False), act)
