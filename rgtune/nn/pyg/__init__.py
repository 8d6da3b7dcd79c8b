"""PyG's conv modules on rgtune's generated kernels: change ``from torch_geometric.nn import RGCNConv`` (or
``HGTConv``) to ``from rgtune.nn.pyg import RGCNConv`` and the script runs as it did, faster.
:class:`HGTConv` is described in its own docstring; the rest of this one is :class:`RGCNConv`'s.

:class:`RGCNConv` takes PyG's constructor arguments and call (``conv(x, edge_index, edge_type)``), holds
PyG's parameters under PyG's names and shapes (``weight``, ``comp`` with ``num_bases``, ``root``, ``bias``;
initialized as PyG does), so ``conv.load_state_dict(pyg_conv.state_dict())`` works in both directions
and gives PyG's outputs. The relations are the caller's integers: relation ``r`` of the graph the kernels
run on is ``edge_type == r`` (:func:`~rgtune.data.interop.from_pyg_homogeneous`), never re-sorted.

Which schedule runs is looked up in the trial database on the first call, as
:func:`~rgtune.runtime.load_tuned` does (the graph by content, the sizes, this device): a graph nobody
tuned runs the default schedule, with one :class:`~rgtune.runtime._lookup.TunedScheduleWarning`. The
graph of an ``(edge_index, edge_type)`` pair is built once and kept while the same tensors come back
(full-graph training passes the same ones every epoch); another pair (a sampled subgraph) gets its own.

Example:
    >>> import torch, warnings
    >>> conv = RGCNConv(8, 16, num_relations=3, db=None)
    >>> sorted(conv.state_dict()), tuple(conv.weight.shape)
    (['bias', 'root', 'weight'], (3, 8, 16))
    >>> x, edge_index = torch.randn(10, 8), torch.randint(0, 10, (2, 40))
    >>> edge_type = torch.randint(0, 3, (40,))
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")   # no database: the default schedule, said once
    ...     out = conv(x, edge_index, edge_type)
    >>> out.shape
    torch.Size([10, 16])
"""

from rgtune.nn.pyg._film import FiLMConv
from rgtune.nn.pyg._hgt import HGTConv
from rgtune.nn.pyg._rgat import RGATConv
from rgtune.nn.pyg._rgcn import RGCNConv

__all__ = ["RGCNConv", "HGTConv", "FiLMConv", "RGATConv"]
