"""What a compression policy is: a compressor for every tensor, decided at step boundaries.

The exchanger (:mod:`hvdsketch.exchange`) asks ``policy.compressor(ctx)`` for each gradient as it becomes ready
and calls ``policy.end_step(inputs, communicator)`` at each step boundary, with the step's gradients (dense or
:class:`~hvdsketch.compress.RowSparse`) while :attr:`Policy.wants_inputs`. Every rank ends the same steps with
the same tensors, so ``end_step`` may run collectives to agree on a decision. Inside ``tf.function`` a
:attr:`Policy.pending` policy gets eager stand-ins with ``traced=True`` and decides at once, among compressors
that work in a graph.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

from hvdsketch.collectives import Communicator
from hvdsketch.compress import Compressor, TensorContext
from hvdsketch.policy.table import Assignment, format_table


class Policy(ABC):
    """Chooses a compressor per tensor."""

    @abstractmethod
    def compressor(self, ctx: TensorContext) -> Compressor:
        """The compressor of the tensor ``ctx`` describes, for this step."""

    @property
    def wants_inputs(self) -> bool:
        """True when :meth:`end_step` of this step needs the step's gradients."""
        return False

    def end_step(self, inputs: Sequence[tuple[Any, TensorContext]], communicator: Communicator,
                 traced: bool = False) -> None:
        """A step has ended (or, ``traced``, a graph is being built from these stand-ins: decide now)."""

    @property
    def pending(self) -> bool:
        """True while the policy still needs to look at gradient values."""
        return False

    @property
    def assignment(self) -> list[Assignment] | None:
        """The latest assignment table, or ``None`` before there is one (or for a single compressor)."""
        return None

    def compressors(self) -> dict[str, Compressor]:
        """The compressors this policy may hand out as it stands, by flag: what a graph traced now would run."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep so a resumed run makes the same choices."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class Fixed(Policy):
    """One compressor for every tensor: what a plain flag such as ``sketch:error=0.5`` means."""

    def __init__(self, compressor: Compressor) -> None:
        self._compressor = compressor

    def compressor(self, ctx: TensorContext) -> Compressor:
        return self._compressor

    def compressors(self) -> dict[str, Compressor]:
        return {str(self._compressor): self._compressor}

    def __str__(self) -> str:
        return str(self._compressor)


def announce(rows: Sequence[Assignment], title: str, communicator: Communicator) -> None:
    """Print the assignment table on rank 0."""
    if communicator.rank == 0:
        print(format_table(rows, title), flush=True)
