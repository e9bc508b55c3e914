"""Per-tensor compression policies: one compressor, explicit rules, or ``auto``.

What ``compression=`` (Python), ``--compression``, ``HVDSKETCH_COMPRESSION`` and ``compression:`` (YAML) accept:

- a compressor flag, ``"sketch:error=0.5"``: that compressor for every tensor
  (:class:`~hvdsketch.policy.base.Fixed`);
- ``"auto"`` or ``"auto:bandwidth=1gbit,warmup=5"``: a cost model picks each tensor's compressor after a few
  dense warm-up steps (:mod:`hvdsketch.policy.auto`);
- rules, as a YAML mapping ``{rules: [...], default: ...}`` or in Python a list of
  :class:`~hvdsketch.policy.rules.Rule` (or of their mappings) or a :class:`~hvdsketch.policy.rules.Rules`;
- a :class:`~hvdsketch.policy.base.Policy` or a compressor object.

Rank 0 prints the assignment table at start and on each re-plan; the optimizer's ``report()`` and
``hvdsketch train``'s JSON record keep it.
"""
from __future__ import annotations

from typing import Any, Mapping

from hvdsketch import spec as _spec
from hvdsketch.compress import Compressor
from hvdsketch.policy.auto import AutoOptions, AutoPolicy
from hvdsketch.policy.base import Fixed, Policy
from hvdsketch.policy.flag import from_flag, unwrapped
from hvdsketch.policy.rules import Rule, Rules
from hvdsketch.policy.table import Assignment, format_table

def create(compression: Any = None) -> Policy:
    """The policy ``compression`` names; ``None`` falls back to ``HVDSKETCH_COMPRESSION``, then
    ``"none"``. Raises :class:`hvdsketch.spec.SpecError` naming the valid choices."""
    compression = unwrapped(compression)  # hvdsketch's drop-in compression, Horovod's none and fp16
    if isinstance(compression, (Policy, Compressor)):
        return from_flag(compression)
    if isinstance(compression, Mapping):
        return Rules.from_mapping(compression)
    if isinstance(compression, (list, tuple)):
        return Rules(compression)
    if compression is not None and not isinstance(compression, str):
        raise _spec.SpecError(f"compression must be a flag, a mapping of rules, a list of rules or a policy, "
                              f"got {type(compression).__name__}")
    return from_flag(str(_spec.resolve(compression)))


def label(compression: Any) -> str:
    """A short name of a compression setting, for file names: the compressor's or policy's name."""
    if isinstance(compression, (Mapping, list, tuple, Rules)):
        return "rules"
    return _spec.Spec.parse(str(compression)).name


__all__ = ["Assignment", "AutoOptions", "AutoPolicy", "Fixed", "Policy", "Rule", "Rules", "create", "format_table",
           "label"]
