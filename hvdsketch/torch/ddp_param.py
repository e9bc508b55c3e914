"""The DDP hook in DDP's per-parameter form: ``torch.compile`` with compiled autograd.

With ``torch._dynamo.config.optimize_ddp = "python_reducer"`` (compiled autograd)
DDP has no buckets: it calls a registered hook from each parameter's
post-accumulate-grad hook as ``hook(state, (param.grad, param))``, ignores what it
returns, and expects ``param.grad`` averaged in place. Nothing tells the hook
that a step's last gradient has come (compiled autograd runs no callback queued
from a hook), so a step ends when every parameter DDP reduces has given its
gradient: then the step's exchanges start, together (one collective per (op,
dtype) of a round, in one order on every rank), are finished, and every gradient
is overwritten with its average. Every method and every ``ExchangeState`` option
works this way, with the bucket form's results (``none`` is DDP's average bit for
bit) and ``auto``'s decisions from the same whole steps; what is lost is overlap
with backward, as the exchanges start after the step's last gradient.

So every parameter DDP reduces needs a gradient in every synchronized step (as
DDP's own per-parameter allreduce needs, on every rank); a parameter that
gets none leaves its step unfinished, and the next step's first repeated gradient
raises ``RuntimeError`` naming it (use ``optimize_ddp="ddp_optimizer"``, the
default, and ``find_unused_parameters=True`` for such a model). A sparse gradient
(``nn.Embedding(sparse=True)``) raises ``ValueError`` at once: its average is a new
tensor where this form can only overwrite ``param.grad``; the bucket form of
``optimize_ddp="ddp_optimizer"`` exchanges it sparse. ``no_sync()`` works as in
eager DDP (no call; the next synchronized step exchanges the sum).

The hook is hidden from dynamo (``torch.compiler.disable``): compiled autograd's
graph breaks around each call and runs hvdsketch eagerly on the real gradients,
so it cannot run under ``fullgraph=True`` (``compiled_autograd_kwargs_override``).
"""
from __future__ import annotations

from typing import Any

import torch

from hvdsketch.ops import torch as torch_ops
from hvdsketch.torch.convert import as_torch

#: What this form is, in errors.
FORM = "DDP's per-parameter hook form (torch.compile with optimize_ddp='python_reducer')"


class ParameterSteps:
    """The gradients of one step in DDP's per-parameter form, for ``state`` (the
    :class:`~hvdsketch.torch.ddp.ExchangeState` that makes this, whose session and steps it drives),
    until the step's last."""

    def __init__(self, state: Any) -> None:
        self.state = state
        #: The parameters DDP reduces (those requiring a gradient, less ``parameters_to_ignore``).
        self.expected = frozenset(state._reduced)
        self.gradients: dict[str, torch.Tensor] = {}

    def add(self, grad: torch.Tensor, param: torch.Tensor) -> None:
        """Take ``param``'s gradient ``grad``; at the step's last, average every gradient in place."""
        name = self.state._name(param)
        if grad.is_sparse:
            raise ValueError(f"hvdsketch: {FORM} gives {name!r} a sparse gradient, which hvdsketch hands back as a "
                             f"new sparse tensor, and this form takes none back; use optimize_ddp='ddp_optimizer' "
                             f"(torch.compile's default), whose buckets take it, or a dense embedding")
        if name in self.gradients:
            missing = sorted(self.expected - set(self.gradients))
            self.gradients.clear()
            raise RuntimeError(f"hvdsketch: {FORM}: the last step ended without a gradient for {len(missing)} "
                               f"parameter(s) ({', '.join(missing[:3])}), so its gradients were not averaged; "
                               f"a step ends when every parameter DDP reduces has one. For a model with unused "
                               f"parameters use optimize_ddp='ddp_optimizer' and find_unused_parameters=True")
        self.gradients[name] = grad
        if len(self.gradients) == len(self.expected):
            self._end_step()

    def _end_step(self) -> None:
        """Start every exchange of the step (backward's usual order: the model's last parameter first,
        alike on every rank), finish them, write each average into its gradient."""
        state, gradients, self.gradients = self.state, self.gradients, {}
        order = tuple(sorted(gradients, key=state._place.__getitem__, reverse=True))
        try:
            state._begin([order])
            state._ready.append((order, gradients))
            state._start()
            averaged = state.session.finish()
        except BaseException as error:
            state._abandon(error)
            raise
        for name, gradient in gradients.items():
            result = as_torch(averaged[name])
            torch_ops.into(gradient, result.to_dense() if result.is_sparse else result)
        state._bytes_dense += sum(torch_ops.nbytes(g) for g in gradients.values())

