"""The DDP hook in DDP's per-parameter form: ``torch.compile`` with compiled autograd.

With ``torch._dynamo.config.optimize_ddp = "python_reducer"`` DDP has no buckets: it calls the hook from each
parameter's post-accumulate-grad hook as ``hook(state, (param.grad, param))`` and expects ``param.grad``
averaged in place. Nothing marks a step's last gradient, so a step ends when every parameter DDP reduces has
given one: then its exchanges start, finish and overwrite every gradient, with the bucket form's results but
no overlap with backward.

So every reduced parameter needs a gradient in every synchronized step (else the next step raises
``RuntimeError`` naming it), and a sparse gradient raises ``ValueError``; for either, use
``optimize_ddp="ddp_optimizer"`` (the default, with ``find_unused_parameters=True`` for unused parameters).
The hook runs eagerly (``torch.compiler.disable``), so not under ``fullgraph=True``.
"""
from __future__ import annotations

from typing import Any

import torch

from hvdsketch.ops import torch as torch_ops
from hvdsketch.torch.convert import as_torch

#: What this form is, in errors.
FORM = "DDP's per-parameter hook form (torch.compile with optimize_ddp='python_reducer')"


class ParameterSteps:
    """One step's gradients in DDP's per-parameter form, for ``state`` (the
    :class:`~hvdsketch.torch.ddp.ExchangeState` whose session it drives)."""

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
        """Start the step's exchanges (last parameter first, alike on every rank), finish them, write back."""
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

