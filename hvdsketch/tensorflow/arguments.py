"""Horovod's gradient arguments in TensorFlow, checked as Horovod checks them, for hvdsketch's tape and
its tf-keras optimizer: the reduction (``op``), ``groups`` and how they map onto a list of gradients,
and the names the ranks exchange each gradient under."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from hvdsketch.exchange.session import create_policy


def reduction_of(hvd: Any, op: Any, gradient_predivide_factor: float) -> str:
    """``"average"``, ``"sum"`` or ``"adasum"`` for Horovod's ``op``, checked as Horovod checks it."""
    op = hvd.Average if op is None else op
    names = {hvd.Average: "average", hvd.Sum: "sum", hvd.Adasum: "adasum"}
    if op not in names:
        raise ValueError(f"hvdsketch: op must be hvd.Average, hvd.Sum or hvd.Adasum, got {op!r}")
    if gradient_predivide_factor != 1.0 and op != hvd.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    return names[op]


def groups_of(num_groups: int, groups: Any) -> Any:
    """Horovod's ``groups`` (``num_groups`` is its deprecated name), checked as Horovod checks it."""
    if num_groups:
        import warnings

        warnings.warn("Parameter `num_groups` has been replaced by `groups`.", DeprecationWarning)
        groups = num_groups if groups is None else groups
    if groups is not None and not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of tf.Variable.")
    if isinstance(groups, list) and not all(isinstance(g, (list, tuple)) and all(isinstance(v, tf.Variable) for v in g)
                                            for g in groups):
        raise ValueError("groups should be a non-negative integer or a list of list of tf.Variable.")
    return groups


def adasum_refusal(compression: Any, memory: Any) -> str | None:
    """Why Adasum cannot run with this compression (``None``: it can, as Horovod's own)."""
    policy = create_policy(compression)
    if str(policy) == "none" and memory is None:
        return None
    return (f"hvdsketch: op=hvd.Adasum combines the ranks' updates non-linearly, so it cannot combine compressed "
            f"messages ({policy}{', memory ' + str(memory) if memory is not None else ''}); use compression='none' "
            f"without memory for Adasum, or op=hvd.Average")


def names_of(sources: Sequence[Any], generic: bool) -> list[str]:
    """Each source's name (``grad_{i}`` with Horovod's ``use_generic_names``), made unique."""
    names: list[str] = []
    taken: set[str] = set()  # the names given so far
    for i, source in enumerate(sources):
        name = f"grad_{i}" if generic else getattr(source, "name", f"source.{i}").removesuffix(":0")
        names.append(name if name not in taken else f"{name}.{i}")
        taken.add(names[-1])
    return names


def index_groups(groups: Any, sources: Sequence[Any], present: list[int]) -> list[list[int]]:
    """Horovod's groups as lists of positions in ``sources``: an int splits the present gradients,
    in order, into that many parts; lists of variables group those (matched by name, as Horovod)."""
    if groups is None:
        return []
    if isinstance(groups, int):
        from horovod.common.util import split_list

        return [list(part) for part in split_list(present, groups) if part]
    by_name = {sources[i].name: i for i in present}
    return [[by_name[v.name] for v in group if v.name in by_name] for group in groups]


def start_together(grads: list[Any], group: list[int]) -> None:
    """Inside ``tf.function``: every gradient of the group passes on only once all are computed
    (eagerly they all exist already)."""
    if len(group) < 2 or tf.executing_eagerly():
        return
    ready = [grads[i].values if isinstance(grads[i], tf.IndexedSlices) else grads[i] for i in group]
    with tf.control_dependencies(ready):
        for i in group:
            grads[i] = _mapped(grads[i], tf.identity)


def _mapped(grad: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(fn(grad.values), fn(grad.indices), grad.dense_shape)
    return fn(grad)
