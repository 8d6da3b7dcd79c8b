"""The fixtures of :mod:`rgtune.bench`: PyG and DGL layers with an rgtune layer's weights copied in.

Each builder takes a :class:`rgtune.runtime.Layer` (its model, options and weights) and returns a
:class:`Baseline`: the library's module, a ``run(x)`` taking features in rgtune's global node
order, and ``expected(x)``: what the library computes with these weights, in float64. Where the
library's math equals rgtune's, ``expected`` *is* the model's program (:func:`oracle`); where it
differs, it is rgtune's layer with exactly that difference, so the weight copy is still checked.
A model (or option) a library has no layer for raises :class:`Unavailable`. This module and
:mod:`rgtune.torch_layers` are where models are named: they pin rgtune's semantics to the libraries'.
The differences:

* PyG ``RGCNConv(aggr="mean")``, DGL ``RelGraphConv`` (norm = 1/|N_r(i)|), also with bases or blocks
  (``num_bases``/``num_blocks``; DGL's ``basis``/``bdd``), PyG ``HGTConv``, PyG ``FiLMConv``: same math.
* PyG ``RGATConv`` (across-relation softmax, additive attention): its attention kernels ``q``,
  ``k`` are shared by all relations, rgtune's ``attn_src``/``attn_dst`` are per relation. The
  same math when the attention vectors are equal across relations: :func:`tie_rgat_attention`
  makes them so (the bench does, for every implementation; it does not change the cost).
* DGL ``HGTConv``: no GELU before the output linear, no biases in its typed linears, and when
  ``in_dim != out_dim`` a projected skip instead of none (the bench zeroes the projection and
  saturates the gate). Biases are zero at rgtune's init, so the bench's weights fit.
* DGL RGAT (``HeteroGraphConv`` of one ``GATConv`` per relation, summed): the softmax runs
  over each destination's in-edges *of one relation*: the same math as ``rgat`` with
  ``softmax="relation"``, not as the default ``rgat``.

Example:
    >>> import torch
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.runtime import Layer
    >>> g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    >>> layer = Layer("rgcn", g, 4, 8, backend="reference")
    >>> b = pyg_rgcn(layer)
    >>> x = torch.randn(30, 4)
    >>> bool(torch.allclose(b.run(x), b.expected(x.double()).float(), atol=1e-5))
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from rgtune.data.interop import to_dgl, to_pyg_homogeneous
from rgtune.torch_layers import HGT, RGAT, RGCN, RelationalLayer
from rgtune.torch_layers._base import edge_softmax, segment_matmul
from rgtune.torch_layers.pyg import to_pyg_film, to_pyg_hgt, to_pyg_rgcn_state

__all__ = ["Baseline", "BUILDERS", "Unavailable", "oracle", "prepare_weights", "torch_layer", "tie_rgat_attention",
           "pyg_rgcn", "pyg_rgat", "pyg_hgt", "pyg_film", "dgl_rgcn", "dgl_rgat", "dgl_hgt", "dgl_rgcn_conv",
           "dgl_hgt_conv"]

#: sigmoid(30) = 1 - 9e-14: DGL's skip gate fully open, so its (zeroed) projected skip has no weight
_OPEN_GATE = 30.0


@dataclass
class Baseline:
    """A library's layer with rgtune's weights: ``run(x) -> out[rows]``, ``expected(x64) -> out[rows]``."""

    name: str
    module: torch.nn.Module
    run: Callable[[Tensor], Tensor]
    expected: Callable[[Tensor], Tensor]
    same_math: bool
    note: str
    rows: Tensor | None = None  # global node ids of run's output rows (None: every node, in order)


class Unavailable(LookupError):
    """A library (or rgtune's plain torch layers) has no layer for this model or these options."""


#: the plain torch layers of :mod:`rgtune.torch_layers`, by model (the same math and parameters as the programs)
_TORCH_LAYERS: dict[str, type[RelationalLayer]] = {"rgcn": RGCN, "rgat": RGAT, "hgt": HGT}


def oracle(layer: torch.nn.Module) -> Callable[[Tensor], Tensor]:
    """``x64 -> out64``: ``layer``'s program interpreted op by op in float64 with its weights (the
    unoptimized program: what the model means)."""
    from rgtune.ir.interpret import Interpreter

    run = Interpreter(layer.program, layer.graph)  # type: ignore[attr-defined]
    params = {k: v.detach().double().cpu() for k, v in layer.state_dict().items()}
    return lambda x: run.run(x, params).output


def _options(layer: torch.nn.Module, what: str, supported: tuple[str, ...] = ()) -> dict[str, object]:
    """``layer``'s model options that differ from the defaults; :class:`Unavailable` if one is not in
    ``supported`` (the library layer ``what`` has no such variant)."""
    from rgtune.ir.registry import model_spec

    defaults = {o.name: o.default for o in model_spec(layer.model).options}  # type: ignore[attr-defined]
    changed = {k: v for k, v in getattr(layer, "options", {}).items() if defaults.get(k) != v}
    unsupported = {k: v for k, v in changed.items() if k not in supported}
    if unsupported:
        raise Unavailable(f"{what} has no variant with {unsupported}")
    return changed


def torch_layer(layer: torch.nn.Module, dtype: torch.dtype | None = None) -> RelationalLayer:
    """The plain torch layer of ``layer``'s model (:mod:`rgtune.torch_layers`) with its weights, on its device
    (``dtype``: default the layer's); :class:`Unavailable` for a model or options it does not have."""
    cls = _TORCH_LAYERS.get(layer.model)  # type: ignore[attr-defined]
    if cls is None:
        raise Unavailable(f"rgtune.torch_layers has no plain torch layer of model {layer.model!r}")  # type: ignore[attr-defined]
    _options(layer, f"rgtune.torch_layers.{cls.__name__}")
    kwargs = {} if cls is RGCN else {"heads": layer.heads}  # type: ignore[attr-defined]
    p = next(layer.parameters())
    plain = cls(layer.graph, layer.in_dim, layer.out_dim, **kwargs).to(device=p.device, dtype=dtype or p.dtype)  # type: ignore[attr-defined]
    plain.load_state_dict({k: v.detach() for k, v in layer.state_dict().items()})
    return plain


def _f64(layer: torch.nn.Module) -> RelationalLayer:
    """A float64 plain torch copy of ``layer`` on the CPU, for a ``expected`` that differs from the program."""
    return torch_layer(layer, torch.float64).cpu()


def prepare_weights(layer: torch.nn.Module) -> None:
    """Make ``layer``'s weights fit every library's layer of its model (the bench does this for all
    implementations: it changes no cost): RGAT's attention vectors equal across relations, as PyG's
    ``RGATConv`` shares them."""
    if getattr(layer, "model", None) == "rgat":
        tie_rgat_attention(layer)  # type: ignore[arg-type]


def _dtype(layer: RelationalLayer) -> torch.dtype:
    return next(layer.parameters()).dtype


def _device(layer: RelationalLayer) -> torch.device:
    return next(layer.parameters()).device


def tie_rgat_attention(layer: torch.nn.Module) -> None:
    """Make ``attn_src``/``attn_dst`` equal across relations (PyG's RGATConv shares them)."""
    with torch.no_grad():
        layer.attn_src.copy_(layer.attn_src[:1].expand_as(layer.attn_src))
        layer.attn_dst.copy_(layer.attn_dst[:1].expand_as(layer.attn_dst))


def _rows_of(graph, ntypes: list[str]) -> Tensor:
    offs = graph.node_offsets
    return torch.cat([torch.arange(int(offs[graph.ntype_id(t)]), int(offs[graph.ntype_id(t) + 1])) for t in ntypes])


# ---------------------------------------------------------------------------- PyG
def _pyg():
    import torch_geometric

    # With pyg_lib, RGCNConv may take a segment-matmul path that averages over *all* in-edges
    # instead of per relation (its own TODO); pin the per-relation path, the R-GCN math.
    torch_geometric.backend.use_segment_matmul = False
    return torch_geometric


def pyg_rgcn(layer: torch.nn.Module) -> Baseline:
    """PyG's ``RGCNConv(aggr="mean")``, with ``num_bases``/``num_blocks`` as rgtune's options."""
    _pyg()
    opts = _options(layer, "PyG RGCNConv", supported=("num_bases", "num_blocks"))
    state = {k: v.detach() for k, v in layer.state_dict().items()}
    conv = to_pyg_rgcn_state(layer.graph, state, layer.in_dim, layer.out_dim, **opts)  # type: ignore[arg-type]
    edge_index, edge_type, _ = to_pyg_homogeneous(layer.graph)  # type: ignore[attr-defined]
    edge_index, edge_type = edge_index.to(_device(layer)), edge_type.to(_device(layer))
    return Baseline("PyG RGCNConv", conv, lambda x: conv(x, edge_index, edge_type), oracle(layer), True, "same math")


def pyg_rgat(layer: torch.nn.Module) -> Baseline:
    """PyG's ``RGATConv`` (additive self-attention): ``across-relation`` is rgtune's default RGAT,
    ``within-relation`` its ``softmax="relation"``; PyG shares the attention vectors across relations."""
    _pyg()
    from torch_geometric.nn import RGATConv

    opts = _options(layer, "PyG RGATConv", supported=("softmax",))
    mechanism = "within-relation" if opts.get("softmax") == "relation" else "across-relation"
    H, D = layer.heads, layer.head_dim
    conv = RGATConv(layer.in_dim, D, layer.num_rels, heads=H, concat=True, bias=False,
                    attention_mechanism=mechanism, attention_mode="additive-self-attention", dim=1)
    with torch.no_grad():
        conv.weight.copy_(layer.weight)  # (R, in, H*D), column h*D + d: the same layout
        conv.q.zero_()
        conv.k.zero_()
        for h in range(H):  # q, k: (H*D, H), block-diagonal; relation 0's vectors (shared by all)
            conv.q[h * D:(h + 1) * D, h] = layer.attn_dst[0, h]
            conv.k[h * D:(h + 1) * D, h] = layer.attn_src[0, h]
    conv = conv.to(device=_device(layer), dtype=_dtype(layer))
    edge_index, edge_type, _ = to_pyg_homogeneous(layer.graph)
    edge_index, edge_type = edge_index.to(_device(layer)), edge_type.to(_device(layer))
    tied = bool((layer.attn_src == layer.attn_src[:1]).all() and (layer.attn_dst == layer.attn_dst[:1]).all())
    ref = _reference(layer, {})
    if not tied:
        tie_rgat_attention(ref)
    note = f"same math ({mechanism} softmax; attention vectors tied across relations: RGATConv shares them)"
    return Baseline("PyG RGATConv", conv, lambda x: conv(x, edge_index, edge_type), oracle(ref), tied, note)


def pyg_hgt(layer: torch.nn.Module) -> Baseline:
    _pyg()
    _options(layer, "PyG HGTConv")
    g = layer.graph
    conv = to_pyg_hgt(layer)  # the mapping documented in rgtune.torch_layers.HGT
    edge_index = {c: torch.stack(g.edges(c)).to(_device(layer)) for c in g.canonical_etypes}
    dst_types = [t for t in g.ntypes if any(c[2] == t for c in g.canonical_etypes)]
    rows = _rows_of(g, dst_types)  # PyG leaves node types that no relation points to out

    def run(x: Tensor) -> Tensor:
        out = conv(g.split_nodes(x), edge_index)
        return torch.cat([out[t] for t in dst_types])

    ref = oracle(layer)
    return Baseline("PyG HGTConv", conv, run, lambda x: ref(x)[rows], True, "same math", rows)


# ---------------------------------------------------------------------------- DGL
def _dgl_homogeneous(layer: RelationalLayer):
    import dgl

    g = layer.graph
    h = dgl.to_homogeneous(to_dgl(g))
    src, dst = h.edges()
    # DGL sorts node and edge types as rgtune does; check the numbering rather than assume it.
    if not (torch.equal(src, g.src) and torch.equal(dst, g.dst) and torch.equal(h.edata[dgl.ETYPE], g.etype)):
        raise RuntimeError("dgl.to_homogeneous numbers nodes or edges differently from rgtune")
    return h.to(_device(layer))


def dgl_rgcn(layer: torch.nn.Module) -> Baseline:
    """DGL's ``RelGraphConv`` (:func:`dgl_rgcn_conv`) on the layer's graph."""
    conv = dgl_rgcn_conv(layer)
    dev, dt = _device(layer), _dtype(layer)
    hg = _dgl_homogeneous(layer)
    etype = layer.graph.etype.to(dev)
    pairs = layer.graph.unique_pairs("dst")
    in_degree = pairs.pair_count[pairs.edge_to_pair]  # |N_r(dst)| of every edge
    norm = (1.0 / in_degree.to(device=dev, dtype=dt)).unsqueeze(1)  # mean within (dst, relation)
    return Baseline("DGL RelGraphConv", conv, lambda x: conv(hg, x, etype, norm, presorted=True), oracle(layer), True,
                    "same math (norm = 1/|N_r(i)|)")


def dgl_rgcn_conv(layer: torch.nn.Module) -> torch.nn.Module:
    """DGL's ``RelGraphConv`` with the layer's weights (call it with ``norm = 1/|N_r(i)|`` per edge); with
    ``num_bases``/``num_blocks`` its ``basis``/``bdd`` regularizer, whose weights are laid out as PyG's and
    rgtune's (bases ``(B, in, out)`` and coefficients ``(R, B)``; blocks ``(R, B * in/B * out/B)``, row-major
    the same as ``(R, B, in/B, out/B)``)."""
    from dgl.nn.pytorch import RelGraphConv

    opts = _options(layer, "DGL RelGraphConv", supported=("num_bases", "num_blocks"))
    regularizer = "basis" if "num_bases" in opts else "bdd" if "num_blocks" in opts else None
    conv = RelGraphConv(layer.in_dim, layer.out_dim, layer.num_rels, regularizer=regularizer,
                        num_bases=opts.get("num_bases", opts.get("num_blocks")), bias=True, self_loop=True)
    with torch.no_grad():
        conv.linear_r.W.copy_(layer.weight.reshape(conv.linear_r.W.shape))
        if regularizer == "basis":
            conv.linear_r.coeff.copy_(layer.comp)
        conv.loop_weight.copy_(layer.root)
        conv.h_bias.copy_(layer.bias)
    return conv.to(device=_device(layer), dtype=_dtype(layer))


def dgl_hgt(layer: torch.nn.Module) -> Baseline:
    """DGL's ``HGTConv`` (:func:`dgl_hgt_conv`) on the layer's graph."""
    conv = dgl_hgt_conv(layer)
    dev, g = _device(layer), layer.graph
    hg = _dgl_homogeneous(layer)
    ntype, etype = g.node_type.to(dev), g.etype.to(dev)
    ref = _f64(layer)
    note = "differs: no GELU before the output linear, no biases (checked: = rgtune's HGT without them)"
    return Baseline("DGL HGTConv", conv, lambda x: conv(hg, x, ntype, etype, presorted=True),
                    lambda x: _hgt_dgl_math(ref, x), False, note)  # type: ignore[arg-type]


def dgl_hgt_conv(layer: torch.nn.Module) -> torch.nn.Module:
    """DGL's ``HGTConv`` with the layer's weights (see the module docstring for how its math differs)."""
    from dgl.nn.pytorch import HGTConv

    _options(layer, "DGL HGTConv")
    H, D = layer.heads, layer.head_dim
    conv = HGTConv(layer.in_dim, D, H, layer.num_ntypes, layer.num_rels, dropout=0.0, use_norm=False)
    with torch.no_grad():
        for ours, theirs in ((layer.k_weight, conv.linear_k), (layer.q_weight, conv.linear_q),
                             (layer.v_weight, conv.linear_v), (layer.a_weight, conv.linear_a)):
            theirs.W.copy_(ours)
        for h in range(H):
            conv.relation_pri[h].copy_(layer.mu[:, h])
            conv.relation_att[h].W.copy_(layer.w_att[:, h])
            conv.relation_msg[h].W.copy_(layer.w_msg[:, h])
        if layer.in_dim == layer.out_dim:  # rgtune's gated skip
            conv.skip.copy_(layer.skip)
        else:  # rgtune has no skip when in != out: zero DGL's projection, open its gate
            conv.residual_w.zero_()
            conv.skip.fill_(_OPEN_GATE)
    return conv.to(device=_device(layer), dtype=_dtype(layer))


def _hgt_dgl_math(layer: HGT, x: Tensor) -> Tensor:
    """rgtune's HGT as DGL computes it: no biases, no GELU (see the module docstring)."""
    N, H, D = x.size(0), layer.heads, layer.head_dim
    k = segment_matmul(x, layer.node_offsets, layer.k_weight).view(N, H, D)
    q = segment_matmul(x, layer.node_offsets, layer.q_weight).view(N, H, D)
    v = segment_matmul(x, layer.node_offsets, layer.v_weight).view(N, H, D)
    k_e = segment_matmul(k.index_select(0, layer.src), layer.rel_offsets, layer.w_att)
    m_e = segment_matmul(v.index_select(0, layer.src), layer.rel_offsets, layer.w_msg)
    score = (q.index_select(0, layer.dst) * k_e).sum(-1) * layer.mu.index_select(0, layer.etype) / math.sqrt(D)
    alpha = edge_softmax(score, layer.dst, N)
    agg = x.new_zeros(N, H, D).index_add_(0, layer.dst, alpha.unsqueeze(-1) * m_e).view(N, H * D)
    out = segment_matmul(agg, layer.node_offsets, layer.a_weight)
    if layer.gated_skip:
        gate = torch.sigmoid(layer.skip).index_select(0, layer.node_type).unsqueeze(1)
        out = gate * out + (1 - gate) * x
    return out


def dgl_rgat(layer: torch.nn.Module) -> Baseline:
    """DGL's usual RGAT (:func:`rgtune.torch_layers.dgl.to_dgl_rgat`): ``rgat(softmax="relation")``'s math; for
    rgtune's default RGAT (one softmax over all in-edges) the row says the math differs and checks the
    library against the per-relation program with the same weights."""
    from rgtune.torch_layers.dgl import to_dgl_rgat

    opts = _options(layer, "DGL HeteroGraphConv(GATConv)", supported=("softmax",))
    state = {k: v.detach() for k, v in layer.state_dict().items()}
    conv = to_dgl_rgat(layer.graph, state, layer.in_dim, layer.out_dim, layer.heads)  # type: ignore[arg-type]
    if opts.get("softmax") == "relation":
        return Baseline("DGL HeteroGraphConv(GATConv)", conv, conv, oracle(layer), True, "same math")
    per_relation = _reference(layer, {"softmax": "relation"})
    note = "differs: softmax per (destination, relation), summed (checked: = rgtune's RGAT with that softmax)"
    return Baseline("DGL HeteroGraphConv(GATConv)", conv, conv, oracle(per_relation), False, note)


def _reference(layer: torch.nn.Module, options: dict[str, object]) -> torch.nn.Module:
    """A reference-backend layer of ``layer``'s model with other ``options`` and the same weights (on the CPU)."""
    from rgtune.codegen.base import ReferenceBackend
    from rgtune.runtime import Layer

    other = Layer(layer.model, layer.graph, layer.in_dim, layer.out_dim, layer.heads,  # type: ignore[attr-defined]
                  options={**layer.options, **options}, dtype=torch.float64,
                  backend=ReferenceBackend.name)  # type: ignore[attr-defined]
    other.load_state_dict({k: v.detach().double().cpu() for k, v in layer.state_dict().items()})
    return other


def pyg_film(layer: torch.nn.Module) -> Baseline:
    """PyG's ``FiLMConv`` (ReLU, mean per relation): :func:`rgtune.ir.models.film`'s math."""
    _pyg()
    _options(layer, "PyG FiLMConv")
    state = {k: v.detach() for k, v in layer.state_dict().items()}
    conv = to_pyg_film(layer.graph, state, layer.in_dim, layer.out_dim)  # type: ignore[arg-type]
    edge_index, edge_type, _ = to_pyg_homogeneous(layer.graph)  # type: ignore[attr-defined]
    edge_index, edge_type = edge_index.to(_device(layer)), edge_type.to(_device(layer))
    return Baseline("PyG FiLMConv", conv, lambda x: conv(x, edge_index, edge_type), oracle(layer), True, "same math")


BUILDERS: dict[str, dict[str, Callable[..., Baseline]]] = {
    "pyg": {"rgcn": pyg_rgcn, "rgat": pyg_rgat, "hgt": pyg_hgt, "film": pyg_film},
    "dgl": {"rgcn": dgl_rgcn, "rgat": dgl_rgat, "hgt": dgl_hgt},
}
