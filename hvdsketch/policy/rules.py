"""Explicit rules: match tensors by name, shape or size and give each a compressor; first match wins.

In a YAML config::

    compression:
      rules:
        - {name: "embedding.*", compression: "sketch:density=0.1"}
        - {ndim: 2, min_size: 100000, compression: "powersgd:rank=4"}
      default: none            # or auto:bandwidth=1gbit, which decides the unmatched tensors

or in Python ``Rules([Rule("embedding.*", "topk:ratio=0.05"), ...], default="auto")``. Names match as
:mod:`fnmatch` patterns; a rule with several conditions needs them all. Compressor flags are validated when the
rules are made, so a typo fails at start.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from hvdsketch.collectives import Communicator
from hvdsketch.compress import Compressor, TensorContext, create
from hvdsketch.compress.support import is_passthrough
from hvdsketch.policy.base import Policy, announce
from hvdsketch.policy.flag import from_flag
from hvdsketch.policy.cost import BLOCK, densities, measure
from hvdsketch.policy.table import Assignment
from hvdsketch.spec import SpecError, known_keys


@dataclass(frozen=True)
class Rule:
    """Tensors matching every condition given get ``compression``.

      compression  the compressor flag, e.g. ``sketch:density=0.05`` (required)
      name         fnmatch pattern on the tensor's name (default ``*``: any)
      ndim         number of dimensions
      shape        the exact shape, e.g. ``[10000, 256]``
      min_size     at least this many elements
      max_size     at most this many elements
    """

    compression: str
    name: str = "*"
    ndim: int | None = None
    shape: tuple[int, ...] | None = None
    min_size: int | None = None
    max_size: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SpecError(f"rule name must be a non-empty fnmatch pattern, got {self.name!r}")
        for option in ("ndim", "min_size", "max_size"):
            value = getattr(self, option)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise SpecError(f"rule {option} must be a non-negative integer, got {value!r}")
        if self.shape is not None:
            if isinstance(self.shape, str) or not all(isinstance(d, int) and d >= 0 for d in self.shape):
                raise SpecError(f"rule shape must be a list of non-negative integers, got {self.shape!r}")
            object.__setattr__(self, "shape", tuple(self.shape))
        if not isinstance(self.compression, str):
            raise SpecError(f"rule compression must be a compressor flag, got {self.compression!r}")
        create(self.compression)  # fail now, naming the valid choices

    @classmethod
    def from_mapping(cls, raw: Any) -> "Rule":
        """A rule from a YAML mapping; :class:`SpecError` for unknown or missing keys."""
        known_keys(raw, [f.name for f in dataclasses.fields(cls)], "a rule")
        if "compression" not in raw:
            raise SpecError(f"rule {dict(raw)} needs a compression, e.g. compression: sketch")
        return cls(**raw)

    def matches(self, name: str, shape: Sequence[int]) -> bool:
        numel = math.prod(shape)
        return (fnmatch.fnmatchcase(name, self.name)
                and (self.ndim is None or len(shape) == self.ndim)
                and (self.shape is None or tuple(shape) == self.shape)
                and (self.min_size is None or numel >= self.min_size)
                and (self.max_size is None or numel <= self.max_size))

    def __str__(self) -> str:
        conditions = ",".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                              if f.name != "compression" and getattr(self, f.name) != f.default)
        return f"{conditions or 'name=*'}->{self.compression}"


class Rules(Policy):
    """Each tensor gets the compressor of the first rule it matches, else ``default`` (a compressor
    flag, or a policy such as ``auto``, which then decides the unmatched tensors)."""

    def __init__(self, rules: Sequence["Rule | Mapping[str, Any]"], default: "str | Compressor | Policy" = "none"):
        if isinstance(rules, (str, Mapping)) or not isinstance(rules, Sequence):
            raise SpecError(f"rules must be a list of rules, got {rules!r}")
        self.rules = [r if isinstance(r, Rule) else Rule.from_mapping(r) for r in rules]
        self.default = from_flag(default)
        self._compressors = [create(rule.compression) for rule in self.rules]
        self._matched: dict[str, int | None] = {}  # name -> index of its rule, None: the default's
        self._order: dict[str, int] = {}  # name -> row of the table
        self._table: list[Assignment] | None = None

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> "Rules":
        """From ``{rules: [...], default: ...}``; :class:`SpecError` for unknown keys."""
        known_keys(raw, ["default", "rules"], "a compression mapping")
        if "rules" not in raw:
            raise SpecError("a compression mapping needs rules: [...] (and optionally default:)")
        return cls(raw["rules"] or [], raw.get("default", "none"))

    def compressors(self) -> dict[str, Compressor]:
        return {**self.default.compressors(), **{str(c): c for c in self._compressors}}

    def state_dict(self) -> dict[str, Any]:
        return {"default": self.default.state_dict()}  # the matches are made again from names and shapes

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.default.load_state_dict(state.get("default", {}))

    def __str__(self) -> str:
        return f"rules[{'; '.join(map(str, self.rules))}; default={self.default}]"

    @property
    def pending(self) -> bool:
        return self._table is None or self.default.pending

    @property
    def assignment(self) -> list[Assignment] | None:
        if self._table is None:
            return None
        return sorted(self._table + (self.default.assignment or []), key=lambda row: self._order[row.tensor])

    def rule_for(self, name: str, shape: Sequence[int]) -> Rule | None:
        """The first rule matching a tensor, or ``None`` (the default applies)."""
        return next((r for r in self.rules if r.matches(name, shape)), None)

    def compressor(self, ctx: TensorContext) -> Compressor:
        if ctx.name not in self._matched:
            rule = self.rule_for(ctx.name, ctx.shape)
            self._matched[ctx.name] = None if rule is None else self.rules.index(rule)
        index = self._matched[ctx.name]
        return self.default.compressor(ctx) if index is None else self._compressors[index]

    @property
    def wants_inputs(self) -> bool:
        return self._table is None or self.default.wants_inputs

    def end_step(self, inputs: Sequence[tuple[Any, TensorContext]], communicator: Communicator,
                 traced: bool = False) -> None:
        for _, ctx in inputs:
            self.compressor(ctx)  # match every tensor, also those a traced graph has not exchanged yet
        self.default.end_step([(t, ctx) for t, ctx in inputs if self._matched[ctx.name] is None], communicator,
                              traced)
        if self._table is None:
            self._tabulate(inputs, communicator)

    def _tabulate(self, inputs: Sequence[tuple[Any, TensorContext]], communicator: Communicator) -> None:
        """The rows of the rule-matched tensors, measured on rank 0 (the rank that prints and records)."""
        self._order = {ctx.name: i for i, (_, ctx) in enumerate(inputs)}
        self._table = []
        if communicator.rank != 0:
            return
        dense = create("none")
        for tensor, ctx in inputs:
            if self._matched[ctx.name] is None or is_passthrough(tensor):
                continue
            compressor = self.compressor(ctx)
            self._table.append(Assignment(ctx.name, tuple(ctx.shape), densities(tensor, ctx.shape, BLOCK)[0],
                                          str(compressor), measure(compressor, tensor, ctx, repeats=1).wire,
                                          measure(dense, tensor, ctx, repeats=1).wire))
        announce(self._table, f"hvdsketch rules: {communicator.size} ranks, default {self.default}", communicator)
