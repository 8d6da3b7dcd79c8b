"""The input forms the drop-in modules read as PyG and DGL read them: a sparse adjacency is an edge list.

PyG's convs take ``edge_index`` as a ``(2, E)`` tensor of ``[source; destination]`` ids, or as a
*transposed* adjacency ``adj_t`` (rows: destinations, columns: sources): a ``torch.sparse`` tensor
(COO, CSR or CSC) or a ``torch_sparse.SparseTensor`` where torch-sparse is installed. The edges of an
adjacency are read in its storage order (CSR: by destination row; COO: coalesced), and a tensor given
per edge beside it (``edge_type``, ``edge_attr``) is aligned with that order, as PyG aligns it. A
``SparseTensor``'s values are its edge types (PyG's ``RGCNConv`` reads them so).

Example:
    >>> import torch
    >>> edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    >>> adj_t = torch.sparse_coo_tensor(edge_index.flip(0), torch.tensor([5, 6, 7]), (3, 3)).to_sparse_csr()
    >>> edges = edge_list(adj_t, "edge_index")
    >>> edges.edge_index.tolist(), edges.values.tolist(), edges.size
    ([[2, 0, 1], [0, 1, 2]], [7, 5, 6], (3, 3))
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

__all__ = ["EdgeList", "edge_list", "is_sparse_adjacency"]


class EdgeList(NamedTuple):
    """An edge list read from a call's ``edge_index`` argument."""

    edge_index: Tensor
    """``(2, E)`` int64, ``[source; destination]``"""
    values: Tensor | None
    """the adjacency's values per edge (in ``edge_index``'s order), None for a dense ``edge_index``"""
    size: tuple[int, int] | None
    """``(num_sources, num_destinations)`` of an adjacency; None for a dense ``edge_index``"""


def is_sparse_adjacency(value: Any) -> bool:
    """Whether ``value`` is an adjacency (a ``torch.sparse`` tensor or a ``torch_sparse.SparseTensor``)."""
    if isinstance(value, Tensor):
        return value.layout != torch.strided
    return type(value).__name__ == "SparseTensor" and hasattr(value, "storage")


def edge_list(value: Any, name: str) -> EdgeList:
    """The edges of ``value`` (a call's argument called ``name``): a ``(2, E)`` integer tensor as it is, or
    a transposed adjacency read as PyG reads it (see the module docstring). Anything else is an error
    naming ``name`` and the forms that work."""
    if isinstance(value, Tensor) and value.layout == torch.strided:
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise ValueError(f"{name} must hold integer node ids (torch.long), got dtype {value.dtype}")
        if value.dim() != 2 or value.size(0) != 2:
            raise ValueError(f"{name} must be a (2, num_edges) tensor of [source; destination] ids, got shape "
                             f"{tuple(value.shape)}")
        # a subclass (PyG's EdgeIndex) as a plain tensor; torch.compile cannot trace as_subclass, and a traced
        # call never meets the subclass's own ops anyway
        plain = value if torch.compiler.is_compiling() else value.as_subclass(Tensor)
        return EdgeList(plain.long(), None, None)
    if isinstance(value, Tensor):
        return _torch_sparse(value, name)
    if is_sparse_adjacency(value):  # torch_sparse.SparseTensor: row = destination, col = source
        row, col, values = value.coo()
        num_dst, num_src = value.sparse_sizes()
        return EdgeList(torch.stack([col, row]).long(), values, (int(num_src), int(num_dst)))
    raise ValueError(f"{name} must be a (2, num_edges) tensor of node ids or a transposed sparse adjacency "
                     f"(torch.sparse COO/CSR/CSC, or torch_sparse.SparseTensor), got {type(value).__name__}")


def _torch_sparse(adj_t: Tensor, name: str) -> EdgeList:
    """The edges of a ``torch.sparse`` transposed adjacency ``(num_dst, num_src)``, in its storage order."""
    if adj_t.sparse_dim() != 2:  # dense dimensions after the two hold per-edge values (edge_attr)
        raise ValueError(f"{name}: a sparse adjacency must have 2 sparse dimensions (destinations x sources), "
                         f"got shape {tuple(adj_t.shape)} with {adj_t.sparse_dim()}")
    num_dst, num_src = int(adj_t.size(0)), int(adj_t.size(1))
    if adj_t.layout == torch.sparse_coo:
        adj_t = adj_t.coalesce()
        row, col = adj_t.indices()
        values = adj_t.values()
    elif adj_t.layout == torch.sparse_csr:
        crow, col = adj_t.crow_indices(), adj_t.col_indices()
        row = torch.repeat_interleave(torch.arange(num_dst, device=crow.device), crow.diff())
        values = adj_t.values()
    elif adj_t.layout == torch.sparse_csc:
        ccol, row = adj_t.ccol_indices(), adj_t.row_indices()
        col = torch.repeat_interleave(torch.arange(num_src, device=ccol.device), ccol.diff())
        values = adj_t.values()
    else:
        raise ValueError(f"{name}: sparse layout {adj_t.layout} is not read; use COO, CSR or CSC")
    return EdgeList(torch.stack([col, row]).long(), values, (num_src, num_dst))
