"""Conversions between :class:`HeteroGraph` and DGL / PyTorch Geometric graphs.

Both libraries are optional (``pip install 'rgtune[dgl]'``, ``pip install 'rgtune[pyg]'``) and
imported only when a conversion needs them. Round trips keep the graph exactly: node types,
counts, canonical edge types and every relation's edges in order, so ``content_hash`` is equal.

Where the target has a place for them, node features and the node-classification task travel too:

* DGL: features as ``g.nodes[t].data["feat"]``; the task as ``train_mask``, ``test_mask`` and
  ``label`` (-1 where unlabeled) on the category's nodes, as DGL's own RDF datasets store it.
  Masks carry no order, so task indices come back sorted; ``num_classes`` is not stored
  (pass it to :func:`from_dgl`, else it is ``max(label) + 1``).
* PyG: features as ``data[t].x``; the task as ``train_idx``, ``train_y``, ``test_idx``, ``test_y``
  on the category's node store (the names PyG's ``Entities`` uses) and ``data.num_classes``.

Example:
    >>> import torch
    >>> g = HeteroGraph({"a": 2, "b": 3}, {("a", "r", "b"): (torch.tensor([0, 1]), torch.tensor([2, 2]))})
    >>> edge_index, edge_type, n = to_pyg_homogeneous(g)
    >>> edge_index.tolist(), edge_type.tolist(), n
    ([[0, 1], [4, 4]], [0, 0], 5)
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any, Sequence

import torch

from rgtune.data.batch import Batch
from rgtune.data.graph import CanonicalEType, HeteroGraph, NodeTask

if TYPE_CHECKING:  # only for annotations; both are optional dependencies
    import dgl
    from torch_geometric.data import HeteroData

__all__ = ["as_hetero_graph", "batch_from_dgl", "batch_from_homogeneous", "check_dgl_block", "from_dgl", "from_pyg", "from_pyg_homogeneous",
           "from_typed_homogeneous", "relation_names", "to_dgl", "to_pyg", "to_pyg_homogeneous"]

_DGL_FEATURE, _PYG_FEATURE = "feat", "x"


def _require(module: str, extra: str, what: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except (ImportError, OSError) as e:  # OSError: a DGL wheel built for another torch fails to load its library
        raise ImportError(
            f"{what} needs the optional package {module!r}, which could not be imported ({e}); "
            f"install it with: pip install 'rgtune[{extra}]'"
        ) from e


# ------------------------------------------------------------------------------------ DGL
def to_dgl(graph: HeteroGraph) -> "dgl.DGLGraph":
    """A DGL heterograph with the same node types, counts and edges (edge ids in our order).

    Raises:
        ValueError: the graph has no edge types (DGL cannot hold such a heterograph).
        ImportError: DGL is not installed.
    """
    dgl = _require("dgl", "dgl", "to_dgl")
    if graph.num_rels == 0:
        raise ValueError(f"{graph.name!r} has no edge types; DGL does not allow a heterograph without any")
    g = dgl.heterograph(
        {c: graph.edges(c) for c in graph.canonical_etypes},
        num_nodes_dict={t: graph.num_nodes(t) for t in graph.ntypes},
        idtype=torch.int64,
    )
    for t, x in graph.features.items():
        g.nodes[t].data[_DGL_FEATURE] = x
    if graph.task is not None:
        _task_to_dgl(g, graph.task, graph.num_nodes(graph.task.category))
    return g


def from_dgl(dgl_graph: "dgl.DGLGraph", name: str = "graph", *, num_classes: int | None = None) -> HeteroGraph:
    """A :class:`HeteroGraph` from a DGL graph (edges of each type in DGL's edge-id order).

    Node features are read from ``ndata["feat"]``; a task from the one node type that has
    ``train_mask``, ``test_mask`` and ``label`` (or DGL's older ``labels``).
    """
    g = dgl_graph.cpu()
    num_nodes = {t: int(g.num_nodes(t)) for t in g.ntypes}
    edges = {tuple(c): g.edges(etype=c, order="eid") for c in g.canonical_etypes}
    features = {t: g.nodes[t].data[_DGL_FEATURE] for t in g.ntypes if _DGL_FEATURE in g.nodes[t].data}
    return HeteroGraph(num_nodes, edges, name=name, features=features, task=_task_from_dgl(g, num_classes))


def _task_to_dgl(g: Any, task: NodeTask, n: int) -> None:
    label = torch.full((n,), -1, dtype=torch.int64)
    label[task.train_idx] = task.train_labels.to(torch.int64)
    label[task.test_idx] = task.test_labels.to(torch.int64)
    data = g.nodes[task.category].data
    data["train_mask"] = _mask(task.train_idx, n)
    data["test_mask"] = _mask(task.test_idx, n)
    data["label"] = label


def _mask(idx: torch.Tensor, n: int) -> torch.Tensor:
    m = torch.zeros(n, dtype=torch.bool)
    m[idx] = True
    return m


def _task_from_dgl(g: Any, num_classes: int | None) -> NodeTask | None:
    found = []
    for t in g.ntypes:
        data = g.nodes[t].data
        key = "label" if "label" in data else "labels"
        if "train_mask" in data and "test_mask" in data and key in data:
            found.append((t, data["train_mask"].bool(), data["test_mask"].bool(), data[key].long()))
    if len(found) != 1:  # none, or ambiguous: leave the task to the caller
        return None
    t, train, test, label = found[0]
    train_idx, test_idx = train.nonzero().flatten(), test.nonzero().flatten()
    classes = num_classes if num_classes is not None else int(label.max()) + 1 if label.numel() else 0
    return NodeTask(t, classes, train_idx, label[train_idx], test_idx, label[test_idx])


# ------------------------------------------------------------------------------------ PyG
def to_pyg(graph: HeteroGraph) -> "HeteroData":
    """A PyG ``HeteroData``: ``data[t].num_nodes``, ``data[(s, r, d)].edge_index`` (2, E), features, task."""
    HeteroData = _require("torch_geometric.data", "pyg", "to_pyg").HeteroData
    data = HeteroData()
    for t in graph.ntypes:
        data[t].num_nodes = graph.num_nodes(t)
        if t in graph.features:
            data[t][_PYG_FEATURE] = graph.features[t]
    for c in graph.canonical_etypes:
        data[c].edge_index = torch.stack(graph.edges(c))
    task = graph.task
    if task is not None:
        store = data[task.category]
        store.train_idx, store.train_y = task.train_idx, task.train_labels
        store.test_idx, store.test_y = task.test_idx, task.test_labels
        data.num_classes = task.num_classes
    return data


def from_pyg(hetero_data: "HeteroData", name: str = "graph") -> HeteroGraph:
    """A :class:`HeteroGraph` from a PyG ``HeteroData`` (edge types keyed by canonical tuples).

    A node type without ``num_nodes`` (nor ``x``) is sized by the largest id that refers to it,
    as PyG itself would infer it.
    """
    data = hetero_data.cpu()
    edges: dict[CanonicalEType, tuple[torch.Tensor, torch.Tensor]] = {}
    for c in data.edge_types:
        # EdgeIndex (a Tensor subclass in recent PyG) is unwrapped so that only plain tensors are kept.
        ei = data[c].edge_index.as_subclass(torch.Tensor).to(torch.int64)
        edges[tuple(c)] = (ei[0].contiguous(), ei[1].contiguous())  # type: ignore[index]
    num_nodes = {t: _pyg_num_nodes(data, t, edges) for t in _pyg_node_types(data)}
    features = {t: data[t][_PYG_FEATURE] for t in data.node_types if _PYG_FEATURE in data[t]}
    return HeteroGraph(num_nodes, edges, name=name, features=features, task=_task_from_pyg(data))


def _pyg_node_types(data: Any) -> list[str]:
    types = list(data.node_types)
    for s, _, d in data.edge_types:
        types += [t for t in (s, d) if t not in types]
    return types


def _pyg_num_nodes(data: Any, t: str, edges: dict[CanonicalEType, tuple[torch.Tensor, torch.Tensor]]) -> int:
    if t in data.node_types and data[t].num_nodes is not None:
        return int(data[t].num_nodes)
    ids = [e[i] for c, e in edges.items() for i in (0, 1) if c[2 * i] == t and e[i].numel()]
    return max((int(x.max()) + 1 for x in ids), default=0)


def _task_from_pyg(data: Any) -> NodeTask | None:
    keys = ("train_idx", "train_y", "test_idx", "test_y")
    found = [t for t in data.node_types if all(k in data[t] for k in keys)]
    if len(found) != 1:
        return None
    s = data[found[0]]
    train_y, test_y = s.train_y.long(), s.test_y.long()
    if "num_classes" in data:
        classes = int(data.num_classes)
    else:
        classes = int(torch.cat([train_y, test_y]).max()) + 1 if train_y.numel() + test_y.numel() else 0
    return NodeTask(found[0], classes, s.train_idx.long(), train_y, s.test_idx.long(), test_y)


def to_pyg_homogeneous(graph: HeteroGraph) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(edge_index, edge_type, num_nodes)`` in our global numbering, for ``RGCNConv``/``RGATConv``.

    ``edge_index[0]`` / ``[1]`` are :attr:`HeteroGraph.src` / ``dst``; ``edge_type`` is our relation
    id (:attr:`HeteroGraph.etype`), so ``num_relations=graph.num_rels``. Needs no PyG import.
    ``edge_type`` is the graph's own tensor (graphs are immutable): do not modify it in place.
    """
    return torch.stack([graph.src, graph.dst]), graph.etype, graph.num_nodes()


#: the node type of a graph made from one homogeneous ``edge_index`` (:func:`from_pyg_homogeneous`)
HOMOGENEOUS_NTYPE = "node"


def relation_names(num_relations: int) -> list[str]:
    """Names of relations ``0 .. num_relations - 1`` whose sorted order is their number's (zero-padded), so
    that a :class:`HeteroGraph`, which orders relations by name, keeps the caller's integer order.

    Example:
        >>> relation_names(11)[:3], sorted(relation_names(11)) == relation_names(11)
        (['00', '01', '02'], True)
    """
    width = len(str(max(num_relations - 1, 0)))
    return [f"{i:0{width}d}" for i in range(num_relations)]


def from_pyg_homogeneous(edge_index: torch.Tensor, edge_type: torch.Tensor | None, num_nodes: int,
                         num_relations: int, name: str = "graph") -> HeteroGraph:
    """A :class:`HeteroGraph` of one node type from PyG's homogeneous form (``RGCNConv``'s ``edge_index``,
    ``edge_type``): relation ``r`` is the edges of type ``r``, named so that the graph's relation ``r`` is
    the caller's ``r`` (:func:`relation_names`; every relation exists, with or without edges), each
    relation's edges in the caller's order. ``edge_type=None``: every edge is of relation 0.

    Example:
        >>> g = from_pyg_homogeneous(torch.tensor([[0, 1, 2], [1, 2, 0]]), torch.tensor([1, 0, 1]), 3, 12)
        >>> g.num_rels, g.canonical_etypes[1], g.edges(g.canonical_etypes[1])[0].tolist()
        (12, ('node', '01', 'node'), [0, 2])
        >>> from_pyg_homogeneous(torch.tensor([[0], [1]]), torch.tensor([5]), 3, 2)
        Traceback (most recent call last):
        ...
        ValueError: edge_type has values up to 5, but num_relations is 2 (edge types 0 .. 1)
    """
    ei = edge_index.as_subclass(torch.Tensor) if isinstance(edge_index, torch.Tensor) else None
    if ei is None or ei.dim() != 2 or ei.size(0) != 2:
        raise ValueError(f"edge_index must be a (2, num_edges) tensor, got "
                         f"{tuple(ei.shape) if ei is not None else type(edge_index).__name__}")
    ei = ei.to("cpu", torch.int64)
    return HeteroGraph({HOMOGENEOUS_NTYPE: num_nodes}, _by_relation(ei[0], ei[1], edge_type, num_relations), name=name)


def check_dgl_block(block: "dgl.DGLGraph", name: str = "dgl block") -> None:
    """Per node type, a DGL block's destinations are its first source nodes, in order (``dgl.to_block`` makes
    them so): checked where DGL records node ids, since a destination reads its own row of the input."""
    dgl = _require("dgl", "dgl", "check_dgl_block")
    for t in block.dsttypes:
        src_ids, dst_ids = block.srcnodes[t].data.get(dgl.NID), block.dstnodes[t].data.get(dgl.NID)
        if isinstance(src_ids, torch.Tensor) and isinstance(dst_ids, torch.Tensor) and \
                not torch.equal(src_ids[:block.num_dst_nodes(t)], dst_ids):
            raise ValueError(f"block {name!r}: node type {t!r}'s destinations are not its first source nodes (in "
                             "order), as dgl.to_block makes them")


def batch_from_dgl(block: "dgl.DGLGraph", name: str = "dgl block") -> Batch:
    """A :class:`~rgtune.data.batch.Batch` from a DGL heterogeneous block (``dgl.to_block``: per node type, its
    destinations are its first source nodes), node and edge types by name in a :class:`HeteroGraph`'s order
    (sorted), each relation's edges in DGL's order. A block whose destinations are not its first sources
    (where DGL records node ids) is an error.

    Example:
        >>> import dgl
        >>> g = dgl.heterograph({("a", "r", "b"): (torch.tensor([0, 1]), torch.tensor([1, 0]))})
        >>> seeds = {"b": torch.tensor([0])}
        >>> b = batch_from_dgl(dgl.to_block(dgl.in_subgraph(g, seeds), seeds))   # the seeds' in-edges
        >>> b.num_dst, b.num_src, b.num_edges()
        ({'a': 0, 'b': 1}, {'a': 1, 'b': 1}, 1)
    """
    check_dgl_block(block, name)
    ntypes = sorted(set(block.srctypes) | set(block.dsttypes))
    num_src = {t: int(block.num_src_nodes(t)) if t in block.srctypes else 0 for t in ntypes}
    num_dst = {t: int(block.num_dst_nodes(t)) if t in block.dsttypes else 0 for t in ntypes}
    cets = sorted(tuple(c) for c in block.canonical_etypes)
    edges = {c: tuple(e.to("cpu", torch.int64) for e in block.edges(etype=c, order="eid")) for c in cets}
    return Batch(ntypes, cets, num_src=num_src, num_dst=num_dst, edges=edges, name=name)


def batch_from_homogeneous(src: torch.Tensor, dst: torch.Tensor, edge_type: torch.Tensor | None, num_src: int,
                           num_dst: int, num_relations: int, name: str = "block") -> Batch:
    """A :class:`~rgtune.data.batch.Batch` of one node type from a block in the homogeneous form (DGL's
    block with integer edge types): ``src`` ids below ``num_src``, ``dst`` ids below ``num_dst``, the
    destinations the first ``num_dst`` source nodes (as ``dgl.to_block`` makes them); relations named as
    :func:`from_pyg_homogeneous` names them, so a layer made on such a graph runs on the batch.

    Example:
        >>> b = batch_from_homogeneous(torch.tensor([2, 3, 0]), torch.tensor([0, 1, 1]), torch.tensor([1, 0, 1]),
        ...                            4, 2, 2)
        >>> b.num_dst_nodes, b.num_nodes(), b.src.tolist(), b.dst.tolist()   # relation 0's edge first
        (2, 4, [3, 2, 0], [1, 0, 1])
    """
    n = HOMOGENEOUS_NTYPE
    src = src.as_subclass(torch.Tensor).to("cpu", torch.int64).reshape(-1)
    dst = dst.as_subclass(torch.Tensor).to("cpu", torch.int64).reshape(-1)
    edges = _by_relation(src, dst, edge_type, num_relations)
    return Batch([n], list(edges), num_src={n: num_src}, num_dst={n: num_dst}, edges=edges, name=name)


def from_typed_homogeneous(src: torch.Tensor, dst: torch.Tensor, ntype: torch.Tensor, etype: torch.Tensor,
                           num_ntypes: int, num_etypes: int, relations: Sequence[tuple[int, int, int]] | None = None, *,
                           num_dst: int | None = None, name: str = "graph"
                           ) -> tuple[HeteroGraph | Batch, list[torch.Tensor], list[torch.Tensor]]:
    """A graph from the typed homogeneous form (DGL's ``HGTConv``'s: one node numbering, an integer type per
    node and per edge). Node type ``t`` is named ``relation_names(num_ntypes)[t]``, edge type ``e``
    ``relation_names(num_etypes)[e]``; a relation is a ``(source type, edge type, destination type)`` triple
    (``relations``: which ones the graph has, with or without edges; default those the edges have; an edge of
    another is an error naming it). Each node type's nodes keep the caller's order.

    ``num_dst``: ``src``/``dst``/``ntype`` are a block's (``dgl.to_block``: ``ntype`` of the source nodes,
    the first ``num_dst`` of them the destinations, ``dst`` ids below ``num_dst``): a :class:`Batch`.

    Returns the graph (or batch), and per node type the positions in the caller's numbering of its nodes
    (the sources') and of its destinations (a graph's: the same).

    Example:
        >>> g, nodes, _ = from_typed_homogeneous(torch.tensor([0, 1, 2]), torch.tensor([2, 2, 0]),
        ...                                     torch.tensor([1, 0, 1]), torch.tensor([0, 1, 0]), 2, 2)
        >>> g.ntypes, g.canonical_etypes, [p.tolist() for p in nodes]
        (['0', '1'], [('0', '1', '1'), ('1', '0', '1')], [[1], [0, 2]])
    """
    ntype = ntype.as_subclass(torch.Tensor).to("cpu", torch.int64).reshape(-1)
    src = src.as_subclass(torch.Tensor).to("cpu", torch.int64).reshape(-1)
    dst = dst.as_subclass(torch.Tensor).to("cpu", torch.int64).reshape(-1)
    et = etype.as_subclass(torch.Tensor).to("cpu", torch.int64).reshape(-1)
    if et.numel() != src.numel():
        raise ValueError(f"etype has {et.numel()} entries for {src.numel()} edges")
    for what, t, count in (("ntype", ntype, num_ntypes), ("etype", et, num_etypes)):
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= count):
            raise ValueError(f"{what} has values in {int(t.min())} .. {int(t.max())}, but there are {count} types "
                             f"(0 .. {count - 1})")
    src_type, dst_type = ntype[src], ntype[dst]
    code = (et * num_ntypes + src_type) * num_ntypes + dst_type
    if relations is None:
        relations = [(int(c) // num_ntypes % num_ntypes, int(c) // num_ntypes ** 2, int(c) % num_ntypes)
                     for c in torch.unique(code)]
    relations = sorted((int(s_), int(e), int(d)) for s_, e, d in relations)  # a HeteroGraph's order of relations
    table = torch.full((num_etypes * num_ntypes * num_ntypes,), -1, dtype=torch.int64)
    for i, (s_, e, d) in enumerate(relations):
        table[(e * num_ntypes + s_) * num_ntypes + d] = i
    rel = table[code]
    if rel.numel() and int(rel.min()) < 0:
        c = int(code[rel < 0][0])
        raise ValueError(f"an edge of type {c // num_ntypes ** 2} goes from node type {c // num_ntypes % num_ntypes} "
                         f"to {c % num_ntypes}, a relation this graph's layer was not made with ({relations}); "
                         "relations are fixed by the first graph")
    nodes, local = _typed_positions(ntype, num_ntypes)
    order = torch.sort(rel, stable=True).indices
    counts = torch.bincount(rel, minlength=len(relations)).tolist()
    nn, en = relation_names(num_ntypes), relation_names(num_etypes)
    edges = {(nn[s_], en[e], nn[d]): (local[a], local[b])
             for (s_, e, d), a, b in zip(relations, src[order].split(counts), dst[order].split(counts))}
    if num_dst is None:
        return HeteroGraph({nn[t]: int(p.numel()) for t, p in enumerate(nodes)}, edges, name=name), nodes, nodes
    dst_nodes, _ = _typed_positions(ntype[:num_dst], num_ntypes)
    batch = Batch(nn, list(edges), num_src={nn[t]: int(p.numel()) for t, p in enumerate(nodes)},
                  num_dst={nn[t]: int(p.numel()) for t, p in enumerate(dst_nodes)}, edges=edges, name=name)
    return batch, nodes, dst_nodes


def _typed_positions(ntype: torch.Tensor, num_ntypes: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per node type the positions of its nodes (in order), and each node's id within its type."""
    order = torch.sort(ntype, stable=True).indices
    counts = torch.bincount(ntype, minlength=num_ntypes)
    starts = torch.cumsum(counts, 0) - counts
    local = torch.empty_like(ntype)
    local[order] = torch.arange(ntype.numel()) - starts[ntype[order]]
    return list(order.split(counts.tolist())), local


def _by_relation(src: torch.Tensor, dst: torch.Tensor, edge_type: torch.Tensor | None,
                 num_relations: int) -> dict[CanonicalEType, tuple[torch.Tensor, torch.Tensor]]:
    """The edges of each relation ``r`` (``edge_type == r``; None: all of relation 0), each relation's in
    the caller's order, every relation present, named by :func:`relation_names`."""
    if edge_type is None:
        et = torch.zeros(src.numel(), dtype=torch.int64)
    else:
        et = edge_type.as_subclass(torch.Tensor).to("cpu", torch.int64).reshape(-1)
        if et.numel() != src.numel():
            raise ValueError(f"edge_type has {et.numel()} entries for {src.numel()} edges")
    if et.numel() and (int(et.min()) < 0 or int(et.max()) >= num_relations):
        low, high = int(et.min()), int(et.max())
        what = f"a negative value ({low})" if low < 0 else f"values up to {high}"
        raise ValueError(f"edge_type has {what}, but num_relations is {num_relations} (edge types 0 .. "
                         f"{num_relations - 1})")
    order = torch.sort(et, stable=True).indices  # by relation, each relation's edges in the caller's order
    counts = torch.bincount(et, minlength=num_relations).tolist()
    n = HOMOGENEOUS_NTYPE
    return {(n, r, n): (s, d) for r, s, d in zip(relation_names(num_relations), src[order].split(counts),
                                                  dst[order].split(counts))}


def as_hetero_graph(graph: Any, name: str = "graph") -> HeteroGraph:
    """``graph`` as a :class:`HeteroGraph`: itself, or a PyG ``HeteroData`` (:func:`from_pyg`) or a DGL graph
    (:func:`from_dgl`) converted, named ``name``.

    Example:
        >>> g = HeteroGraph({"a": 2}, {("a", "r", "a"): (torch.tensor([0]), torch.tensor([1]))})
        >>> as_hetero_graph(g) is g
        True
        >>> as_hetero_graph("aifb")
        Traceback (most recent call last):
        ...
        TypeError: expected a rgtune HeteroGraph, a PyG HeteroData or a DGL graph, got str
    """
    if isinstance(graph, HeteroGraph):
        return graph
    module = type(graph).__module__.split(".")[0]
    if module == "torch_geometric" and type(graph).__name__ == "HeteroData":
        return from_pyg(graph, name=name)
    if module == "dgl":
        return from_dgl(graph, name=name)
    raise TypeError(f"expected a rgtune HeteroGraph, a PyG HeteroData or a DGL graph, got {type(graph).__name__}")
