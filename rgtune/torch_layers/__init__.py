"""Reference RGNN layers: RGCN, RGAT and HGT as plain, readable torch modules.

They define what each model computes. Run in float64, they are the oracle every generated
kernel is checked against; their parameter layout (documented in each class) is shared with
the tuned layers, so a ``state_dict`` moves between the two unchanged.

Each layer is bound to one :class:`~rgtune.data.HeteroGraph` and takes node features either
as one ``(num_nodes, in_dim)`` tensor in the graph's global node order or as a dict
``{ntype: tensor}``, returning the same form.

Example:
    >>> import torch
    >>> from rgtune.data import HeteroGraph
    >>> from rgtune.models import HGT
    >>> g = HeteroGraph({"a": 2, "b": 3}, {("a", "r", "b"): ([0, 1, 1], [0, 0, 2])})
    >>> layer = HGT(g, in_dim=4, out_dim=4).double()
    >>> layer(torch.randn(g.num_nodes(), 4, dtype=torch.float64)).shape
    torch.Size([5, 4])
"""

from rgtune.models._base import GraphLayer, NodeInput, RelationalLayer
from rgtune.models.hgt import HGT
from rgtune.models.rgat import RGAT
from rgtune.models.rgcn import RGCN

__all__ = ["HGT", "RGAT", "RGCN", "GraphLayer", "NodeInput", "RelationalLayer"]
