"""``rgtune.nn``: the generic layer, as a user imports it (``from rgtune.nn import Layer``).

:class:`Layer` runs any registered model's program (or a :class:`~rgtune.ir.program.Program`) on
a graph with generated kernels and trains through the generated backward, on the best backend here by
default (``backend="auto"``: ``cuda`` for a layer on a CUDA device, else ``cpu``; ``"reference"`` is the plain
torch executor); its graph may be a rgtune ``HeteroGraph``, a PyG ``HeteroData`` or a DGL graph; see
:mod:`rgtune.runtime.module`. :func:`rgtune.runtime.load_tuned` returns one with the best
recorded schedule. :mod:`rgtune.nn.pyg` has PyG's conv modules on the same kernels (``RGCNConv``,
``HGTConv``, ``FiLMConv``, ``RGATConv``: PyG's constructors, calls and state dicts) and
:mod:`rgtune.nn.dgl` DGL's (``RelGraphConv``, ``HGTConv``, ``HeteroGraphConv`` of ``GATConv``), so a PyG or
DGL script changes its import line only; ``rgtune.tune(model, *inputs, trials=...)`` tunes the workloads of the
modules of such a script's model, which then find their schedules.

Example:
    >>> import torch
    >>> from rgtune.data.synthetic import random_graph
    >>> g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    >>> layer = Layer("hgt", g, 8, 8, heads=2)
    >>> sorted(layer.state_dict())[:3], layer(torch.randn(30, 8)).shape
    (['a_bias', 'a_weight', 'k_bias'], torch.Size([30, 8]))
"""

from rgtune.runtime.module import GraphMismatchError, Layer

__all__ = ["Layer", "GraphMismatchError"]
