"""What a compression policy is: a compressor for every tensor of a step.

The adapters (PyTorch optimizer, TensorFlow tape) call, every step::

    compressors = policy.select(tensors, contexts, communicator)
    exchange_all(zip(compressors, tensors, contexts), communicator, memory)

``tensors`` are the step's gradients as the exchange takes them (dense, or
:class:`~hvdsketch.compress.RowSparse`), ``contexts`` their names and shapes.
Every rank calls ``select`` with the same names and shapes in the same order
(the adapters verify it), so a policy may run collectives of its own inside it
to agree on a decision. ``pending`` says whether ``select`` still needs to see
real values: inside ``tf.function`` the tape then passes eager stand-ins with
``traced=True``; the policy decides at once, choosing only compressors that
work in a graph (no per-step state kept in Python), and the traced graph keeps
that decision.
"""
from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from typing import Any, Sequence

from hvdsketch.collectives import Communicator
from hvdsketch.collectives.stats import CommStats
from hvdsketch.compress import Compressor, TensorContext
from hvdsketch.policy.table import Assignment, format_table


class Policy(ABC):
    """Chooses a compressor per tensor."""

    @abstractmethod
    def select(self, tensors: Sequence[Any], contexts: Sequence[TensorContext], communicator: Communicator,
               traced: bool = False) -> list[Compressor]:
        """The compressor of each tensor for this step; ``traced``: for a graph being traced, decide
        now, from these (stand-in) values."""

    @property
    def pending(self) -> bool:
        """True while :meth:`select` still needs to look at gradient values."""
        return False

    @property
    def assignment(self) -> list[Assignment] | None:
        """The latest assignment table, or ``None`` before there is one (or for a single compressor)."""
        return None

    def compressors(self) -> dict[str, Compressor]:
        """The compressor objects this policy hands out, by flag (their per-tensor state goes into
        checkpoints)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep so a resumed run makes the same choices."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class Fixed(Policy):
    """One compressor for every tensor: what a plain flag such as ``sketch:error=0.5`` means."""

    def __init__(self, compressor: Compressor) -> None:
        self.compressor = compressor

    def select(self, tensors: Sequence[Any], contexts: Sequence[TensorContext], communicator: Communicator,
               traced: bool = False) -> list[Compressor]:
        return [self.compressor] * len(tensors)

    def compressors(self) -> dict[str, Compressor]:
        return {str(self.compressor): self.compressor}

    def __str__(self) -> str:
        return str(self.compressor)


def side_channel(communicator: Communicator) -> Communicator:
    """The communicator with counters of its own, so a policy's collectives (probe, agreement)
    are not counted as gradient bytes."""
    side = copy.copy(communicator)
    side.stats = CommStats()
    return side


def announce(rows: Sequence[Assignment], title: str, communicator: Communicator) -> None:
    """Print the assignment table on rank 0."""
    if communicator.rank == 0:
        print(format_table(rows, title), flush=True)
