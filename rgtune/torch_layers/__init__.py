"""RGCN, RGAT and HGT as plain, readable torch modules, written apart from the IR; PyG/DGL weight maps.

A second implementation of each built-in model, in the libraries' terms (segment matmuls, an edge
softmax): the tests pin each IR model (:mod:`rgtune.ir.models`) to it, and through it to PyG's and
DGL's layers (:mod:`.pyg`, :mod:`.dgl` map the weights), in float64. They are test fixtures and the
bench's "torch" row, not the oracle: the tuner checks every kernel against the IR interpreter
(:mod:`rgtune.ir.interpret`). Their parameter layout (documented in each class) is the tuned
layers', so a ``state_dict`` moves between the two unchanged.

Each layer is bound to one :class:`~rgtune.data.HeteroGraph` and takes node features either
as one ``(num_nodes, in_dim)`` tensor in the graph's global node order or as a dict
``{ntype: tensor}``, returning the same form.

Example:
    >>> import torch
    >>> from rgtune.data import HeteroGraph
    >>> from rgtune.torch_layers import HGT
    >>> g = HeteroGraph({"a": 2, "b": 3}, {("a", "r", "b"): ([0, 1, 1], [0, 0, 2])})
    >>> layer = HGT(g, in_dim=4, out_dim=4).double()
    >>> layer(torch.randn(g.num_nodes(), 4, dtype=torch.float64)).shape
    torch.Size([5, 4])
"""

from rgtune.torch_layers._base import RelationalLayer
from rgtune.torch_layers.hgt import HGT
from rgtune.torch_layers.rgat import RGAT
from rgtune.torch_layers.rgcn import RGCN

__all__ = ["HGT", "RGAT", "RGCN", "RelationalLayer"]
