"""Conversions between PyTorch's gradients and hvdsketch's, shared by the PyTorch front ends."""
from __future__ import annotations

from typing import Any

import torch

from hvdsketch.compress import RowSparse


def as_hvdsketch(grad: torch.Tensor) -> Any:
    """``grad`` as hvdsketch exchanges it: a sparse COO gradient as :class:`~hvdsketch.compress.RowSparse` rows."""
    if not grad.is_sparse:
        return grad
    grad = grad.coalesce()
    return RowSparse(grad.indices()[0], grad.values(), tuple(grad.shape))


def as_torch(averaged: Any) -> torch.Tensor:
    """An average as a torch tensor: rows as a sparse COO tensor on their device."""
    if isinstance(averaged, RowSparse):
        return torch.sparse_coo_tensor(averaged.indices[None, :], averaged.values, averaged.dense_shape,
                                       device=averaged.values.device, check_invariants=False)  # rows made here
    return averaged


def named(named_parameters: Any) -> list[tuple[str, torch.Tensor]] | None:
    """``named_parameters`` as a list of (name, parameter) pairs, or a clear error."""
    if named_parameters is None:
        return None
    pairs = list(named_parameters)
    if not all(isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
               and isinstance(item[1], torch.Tensor) for item in pairs):
        raise ValueError("hvdsketch: named_parameters must be (name, parameter) pairs, as model.named_parameters() "
                         "gives (not model.parameters())")
    return pairs


def sparse_layout(dense: torch.Tensor, sparse_dim: int) -> torch.Tensor:
    """``dense`` as a coalesced sparse tensor of ``sparse_dim`` sparse dimensions, its non-zero
    slices as values (what ``Tensor.to_sparse(1)`` gives, in one pass over the rows)."""
    if sparse_dim != 1:
        return dense.to_sparse(sparse_dim)
    rows = dense.reshape(dense.shape[0], -1).ne(0).any(1).nonzero().squeeze(1)
    return torch.sparse_coo_tensor(rows.unsqueeze(0), dense.index_select(0, rows), dense.shape,
                                   device=dense.device, is_coalesced=True, check_invariants=False)
