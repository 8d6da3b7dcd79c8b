"""The built-in models (RGCN, RGAT, HGT, FiLM), written in the inter-operator IR and registered
(:mod:`rgtune.ir.registry`).

Each function reads like the model's equations (its docstring writes them out); its keyword-only
parameters are the model's options. A program declares its parameters (names, slice shapes,
initialization): the generic layer (:class:`rgtune.runtime.Layer`) creates them from it, and the
names and shapes are those of the library layers the fixtures map to (PyG, DGL), so a
state_dict moves between them. The passes, not these functions, decide how each value is
materialized and computed.

Example:
    >>> print(build_model("rgcn", in_dim=4, out_dim=3).ops[-1])
    %6 = add(%4, %5) : node[1x3]
"""

from __future__ import annotations

import math
import numbers
from typing import Literal

from rgtune.ir.program import (EDGE, NODE, IRError, ParamInit, Program, ProgramBuilder, ReduceSum, Value,
                               inv_sqrt)
from rgtune.ir.registry import build_model, register_model

__all__ = ["rgcn", "rgat", "hgt", "film", "build_model"]


def rgcn(in_dim: int, out_dim: int, heads: int = 1, *, num_bases: int | None = None,
         num_blocks: int | None = None, aggr: Literal["mean", "sum", "weighted"] = "mean", root_weight: bool = True,
         bias: bool = True, featureless: bool = False, num_relations: int | None = None) -> Program:
    """``h'_i = h_i W_0 + b + sum_r mean_{j in N_r(i)} h_j W_r`` (PyG ``RGCNConv``, aggr mean); with
    ``aggr="sum"``, ``sum_{j in N_r(i)}`` instead of the mean (DGL's ``RelGraphConv`` without ``norm``); with
    ``aggr="weighted"``, ``sum_{j in N_r(i)} w_e h_j W_r`` with ``w_e`` the caller's per-edge weight given with each
    call (``layer(x, edge_weight=w)``: DGL's ``RelGraphConv(g, feat, etypes, norm)``; no gradient to ``w``).

    ``W_r`` is ``weight[r]`` ``(R, in, out)``, or, as PyG's regularized ``RGCNConv``:

    * ``num_bases=B`` (basis decomposition): ``W_r = sum_b comp[r, b] V_b`` with the bases
      ``weight`` ``(B, in, out)`` and the coefficients ``comp`` ``(R, B)``;
    * ``num_blocks=B`` (block-diagonal decomposition): ``W_r = diag(weight[r, 0], ..., weight[r, B-1])``
      with ``weight`` ``(R, B, in/B, out/B)``: the features split into ``B`` blocks, block ``b`` of
      ``h_j`` times ``weight[r, b]`` gives block ``b`` of the message.

    ``root`` ``(in, out)`` and ``bias`` ``(out,)`` in every form (PyG's ``root_weight=False`` and ``bias=False``
    leave the term out, and its param). At most one of the two options; ``B`` a positive integer that, for
    blocks, divides ``in_dim`` and ``out_dim``.

    ``featureless=True`` (PyG's ``x=None`` or node-index ``x``: ``in_dim`` is the number of nodes and
    ``W_r`` a table, the message of edge ``j -> i`` of relation ``r`` is the row ``W_r[j]``): the input ``x``
    is, per node, the node's rows of the tables as ``K (+1)`` heads of ``out`` features: ``V_b[j]`` for the
    ``K = B`` bases (``K = R`` relations without bases: ``W_r[j]``) and, with the root, ``root[j]`` last. The
    message is ``sum_k comp[r, k] x_j[k]`` (``comp`` ``(K+1,)`` per relation, its last entry 0; the identity
    without bases), the root term ``sum_k root_select[k] x_i[k]`` (``root_select`` ``(K+1,)``, the last unit
    vector) plus ``bias`` ``(1, out)``. So the table rows are gathered and combined inside the kernels
    (compact per (source, relation) pair), and the gradient of the tables is the input's gradient: each
    row gets the sum of its messages' gradients. No block decomposition (a table has no feature blocks);
    without bases, ``num_relations=R`` is needed (the input's width is ``(R + 1) * out``).
    """
    if heads != 1:
        raise IRError(f"rgcn has no attention heads; expected heads=1, got {heads}")
    _check_decomposition(in_dim, out_dim, num_bases, num_blocks)
    if featureless:
        return _rgcn_featureless(out_dim, num_bases, num_blocks, aggr, root_weight, bias, num_relations)
    p = ProgramBuilder("rgcn", in_dim, heads)
    x = p.x
    if num_blocks is not None:  # per-head linear: the B blocks of the features are its heads
        blocks = p.view(x, heads=num_blocks)
        linear = p.typed_linear(p.src(blocks), "weight", out=(num_blocks, out_dim // num_blocks), by="rel",
                                per_head=True)
    else:
        weight = "weight" if num_bases is None else \
            p.basis_weight("weight__comp", "weight", "comp", num_bases, (in_dim, out_dim))
        linear = p.typed_linear(p.src(x), weight, out=(1, out_dim), by="rel")
    message = _rgcn_norm(p, linear, aggr)
    root = p.linear(x, "root", out=(1, out_dim), bias="bias" if bias else None) if root_weight else None
    neighbours = p.aggregate(message)
    if num_blocks is not None:
        neighbours = p.view(neighbours, heads=1)
    if root is not None:
        return p.finish(p.add(root, neighbours))
    if bias:
        return p.finish(p.add(neighbours, p.param("bias", like=neighbours, dim=out_dim, by="none", init="zeros")))
    return p.finish(neighbours)


def _rgcn_norm(p: ProgramBuilder, message: Value, aggr: str) -> Value:
    """RGCN's message for ``aggr``: times ``1 / |N_r(i)|`` (``mean``), times the caller's edge weight (``weighted``),
    or as it is (``sum``)."""
    if aggr == "mean":
        return p.mul(message, p.inv_dst_rel_degree())
    return p.mul(message, p.edge_weight()) if aggr == "weighted" else message


def _rgcn_featureless(out_dim: int, num_bases: int | None, num_blocks: int | None, aggr: str, root_weight: bool,
                      bias: bool, num_relations: int | None) -> Program:
    """:func:`rgcn` with ``featureless=True`` (see its docstring)."""
    if num_blocks is not None:
        raise IRError("rgcn: featureless=True (node-index or x=None input) does not support num_blocks (the "
                      "block-diagonal decomposition splits features, and a table row has none); use num_bases "
                      "or neither")
    if num_bases is None and (isinstance(num_relations, bool) or not isinstance(num_relations, numbers.Integral)
                              or num_relations < 1):
        raise IRError(f"rgcn: featureless=True without num_bases needs num_relations (a positive integer, the "
                      f"number of relation tables), got {num_relations!r}")
    tables = num_bases if num_bases is not None else int(num_relations)  # type: ignore[arg-type]
    heads = tables + int(root_weight)
    p = ProgramBuilder("rgcn", heads * out_dim, 1)
    x = p.view(p.x, heads=heads)  # per node: its row of every table, one head each
    rows = p.src(x)
    message = p.op(ReduceSum, EDGE, 1, out_dim, x=p.mul(rows, p.param("comp", like=rows, by="rel")), over="heads")
    out = p.aggregate(_rgcn_norm(p, message, aggr))
    if root_weight:
        root = p.op(ReduceSum, NODE, 1, out_dim, x=p.mul(x, p.param("root_select", like=x, by="none", init="ones")),
                    over="heads")
        out = p.add(root, out)
    if bias:
        out = p.add(out, p.param("bias", like=out, dim=out_dim, by="none", init="zeros"))
    return p.finish(out)


def _check_decomposition(in_dim: int, out_dim: int, num_bases: int | None, num_blocks: int | None) -> None:
    """One-line errors for RGCN's weight decomposition options (see :func:`rgcn`)."""
    if num_bases is not None and num_blocks is not None:
        raise IRError(f"rgcn: num_bases={num_bases!r} and num_blocks={num_blocks!r} exclude each other; "
                      "set one of them, or neither")
    for name, value in (("num_bases", num_bases), ("num_blocks", num_blocks)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
            raise IRError(f"rgcn: {name}={value!r} is not valid; it must be a positive integer, or None")
    if num_blocks is not None and (in_dim % num_blocks or out_dim % num_blocks):
        valid = [b for b in range(1, math.gcd(in_dim, out_dim) + 1) if in_dim % b == 0 and out_dim % b == 0]
        raise IRError(f"rgcn: num_blocks={num_blocks} must divide in_dim={in_dim} and out_dim={out_dim}; "
                      f"valid: {valid}")


#: ``rgat``'s ``softmax`` option: over all of a destination's in-edges, or over its in-edges of each relation
RGAT_SOFTMAX = ("destination", "relation")
#: ``rgat``'s ``score``: the LeakyReLU of the sum of the two attention terms, or their product
RGAT_SCORE = ("additive", "multiplicative")
#: ``rgat``'s ``mod``: PyG ``RGATConv``'s cardinality-preserving variants (None: none)
RGAT_MOD = (None, "additive", "scaled", "f-additive", "f-scaled")


def rgat(in_dim: int, out_dim: int, heads: int = 1, *,
         softmax: Literal["destination", "relation"] = "destination",
         attention: Literal["per_head", "mixed"] = "per_head", num_bases: int | None = None,
         num_blocks: int | None = None, score: Literal["additive", "multiplicative"] = "additive",
         mod: Literal["additive", "scaled", "f-additive", "f-scaled"] | None = None) -> Program:
    """Per edge ``j -> i`` of relation ``r`` and head ``h``:
    ``z_j = h_j W_r``, ``e_ij = LeakyReLU(a_dst_r . h_i W_r + a_src_r . z_j)``, ``h'_i = sum_j alpha_ij z_j``.

    ``softmax="destination"`` (Hector's RGAT): ``alpha_ij = exp(e_ij) / sum_{k in N(i)} exp(e_ik)``, over all
    of ``i``'s in-edges. ``softmax="relation"`` (DGL's ``HeteroGraphConv`` of one ``GATConv`` per relation,
    summed): ``alpha_ij = exp(e_ij) / sum_{k in N_r(i)} exp(e_ik)``, over ``i``'s in-edges of ``j``'s
    relation ``r``, so ``h'_i = sum_r sum_{j in N_r(i)} alpha_ij z_j``: each relation's attention sums
    to 1 at every destination it reaches.

    ``attention="per_head"``: head ``h``'s score reads head ``h``'s features, with vectors ``a_dst_r``,
    ``a_src_r`` per relation and head. ``attention="mixed"`` (PyG's ``RGATConv``): one matrix each for all
    relations, ``attn_dst`` and ``attn_src`` ``(heads * D, heads)``, so every head's score reads every head's
    features: ``e_ij = LeakyReLU(z_i attn_dst + z_j attn_src)`` (PyG's ``q`` and ``k``).

    The options of PyG's ``RGATConv``:

    * ``num_bases=B``: ``W_r = sum_b att[r, b] basis[b]`` (``basis`` ``(B, in, out)``, ``att`` ``(R, B)``);
      ``num_blocks=B``: ``W_r`` block-diagonal, ``weight`` ``(R, B, in/B, out/B)`` (as :func:`rgcn`'s).
    * ``score="multiplicative"`` (PyG's ``attention_mode="multiplicative-self-attention"``): the product of
      the two terms, ``e_ij = (z_i attn_dst) * (z_j attn_src)``, no LeakyReLU.
    * ``mod`` (PyG's cardinality-preserving variants), with ``D = out_dim / heads`` and ``deg_i = |N(i)|``
      (all relations): ``"additive"``: the message is ``alpha_ij z_j + w * z_j`` (``w`` ``(1, D)``, ones);
      ``"scaled"``: ``alpha_ij z_j * s_i`` with ``s_i = relu(deg_i l1 + b1) l2 + b2`` (``l1`` ``(1, D)``, ``l2``
      ``(D, D)``); ``"f-additive"``: ``alpha_ij`` becomes ``alpha_ij + 1`` where ``alpha_ij > 0``;
      ``"f-scaled"``: ``alpha_ij deg_i``.
    """
    _check_rgat_options(in_dim, out_dim, softmax, score, mod, num_bases, num_blocks)
    p = ProgramBuilder("rgat", in_dim, heads)
    d = _head_dim(out_dim, heads)
    z, z_dst = _rgat_projections(p, in_dim, out_dim, heads, num_bases, num_blocks)
    if attention == "mixed":
        terms = p.linear(z_dst, "attn_dst", out=(heads, 1)), p.linear(z, "attn_src", out=(heads, 1))
    else:
        terms = (p.inner(z_dst, p.param("attn_dst", like=z_dst, dim=d)),
                 p.inner(z, p.param("attn_src", like=z, dim=d)))
    e = p.leaky_relu(p.add(*terms), slope=0.2) if score == "additive" else p.mul(*terms)
    alpha = p.edge_softmax(e, per_relation=softmax == "relation")
    if mod == "f-additive":
        alpha = p.inc_positive(alpha)
    elif mod == "f-scaled":
        alpha = p.mul(alpha, p.dst_degree())
    message = p.mul(alpha, z)
    if mod == "additive":
        message = p.add(message, p.mul(p.shared_row("w", d, like=z, init="ones"), z))
    elif mod == "scaled":
        hidden = p.relu(p.linear(p.dst_degree(), "l1", out=(1, d), bias="b1", init="ones"))
        message = p.mul(message, p.linear(hidden, "l2", out=(1, d), bias="b2"))
    return p.finish(p.aggregate(message))


def _check_rgat_options(in_dim: int, out_dim: int, softmax: str, score: str, mod: str | None,
                        num_bases: int | None, num_blocks: int | None) -> None:
    """One-line errors for :func:`rgat`'s options."""
    for what, value, choices in (("softmax", softmax, RGAT_SOFTMAX), ("score", score, RGAT_SCORE),
                                 ("mod", mod, RGAT_MOD)):
        if value not in choices:
            raise IRError(f"rgat: unknown {what} {value!r}; choose one of {list(choices)}")
    try:
        _check_decomposition(in_dim, out_dim, num_bases, num_blocks)
    except IRError as e:
        raise IRError(str(e).replace("rgcn:", "rgat:", 1)) from None


def _rgat_projections(p: ProgramBuilder, in_dim: int, out_dim: int, heads: int, num_bases: int | None,
                      num_blocks: int | None) -> tuple[Value, Value]:
    """``z = h_src W_r`` and ``z_dst = h_dst W_r`` with ``W_r`` whole, of bases, or block-diagonal (:func:`rgat`)."""
    if num_blocks is not None:  # the B blocks of the features are the heads of a per-head linear
        blocks, out = p.view(p.x, heads=num_blocks), (num_blocks, out_dim // num_blocks)
        return tuple(p.view(p.typed_linear(end(blocks), "weight", out=out, by="rel", per_head=True), heads=heads)
                     for end in (p.src, p.dst))  # type: ignore[return-value]
    weight = "weight" if num_bases is None else \
        p.basis_weight("weight__bases", "basis", "att", num_bases, (in_dim, out_dim))
    d = _head_dim(out_dim, heads)
    return (p.typed_linear(p.src(p.x), weight, out=(heads, d), by="rel"),
            p.typed_linear(p.dst(p.x), weight, out=(heads, d), by="rel"))

def hgt(in_dim: int, out_dim: int, heads: int = 1, *, bias: bool = True,
        activation: Literal["gelu", "none"] = "gelu", skip: Literal["same_size", "none"] = "same_size") -> Program:
    """PyG ``HGTConv``: typed K/Q/V; per relation and head ``k_e = K_src W_att``,
    ``m_e = V_src W_msg``, ``s = <k_e, Q_dst> mu_r / sqrt(D)``, ``a = softmax_dst(s)``,
    ``h = sum a m_e``; ``out = gelu(h) A_t + b_t``, gated skip when ``in == out``. The skip gate ``skip`` (one
    per node type) exists at every size, as in PyG (its state dict is the same whatever the sizes); when
    ``in != out`` nothing reads it.

    DGL's ``HGTConv`` is ``bias=False`` (no bias in K/Q/V/A), ``activation="none"`` (``h A_t``) and
    ``skip="none"`` (the program ends at ``h A_t``): DGL applies dropout before its gated skip, which it
    has at every size (through a projection when ``in != out``), so :class:`rgtune.nn.dgl.HGTConv` adds
    the skip in torch."""
    p = ProgramBuilder("hgt", in_dim, heads)
    d = _head_dim(out_dim, heads)
    x = p.x
    k = p.typed_linear(x, "k_weight", out=(heads, d), by="ntype", bias="k_bias" if bias else None)
    q = p.typed_linear(x, "q_weight", out=(heads, d), by="ntype", bias="q_bias" if bias else None)
    v = p.typed_linear(x, "v_weight", out=(heads, d), by="ntype", bias="v_bias" if bias else None)
    k_e = p.typed_linear(p.src(k), "w_att", out=(heads, d), by="rel", per_head=True)
    m_e = p.typed_linear(p.src(v), "w_msg", out=(heads, d), by="rel", per_head=True)
    s = p.scale(p.mul(p.inner(k_e, p.dst(q)), p.param("mu", like=k_e, init="ones")), inv_sqrt(d))
    h = p.aggregate(p.mul(p.edge_softmax(s), m_e))
    out = p.typed_linear(p.gelu(h) if activation == "gelu" else h, "a_weight", out=(1, out_dim), by="ntype",
                         bias="a_bias" if bias else None)
    if skip == "none":
        return p.finish(out)
    if in_dim == out_dim:
        return p.finish(p.gated_residual(out, x, "skip"))
    p.declare("skip", "ntype", (), init="ones")
    return p.finish(out)


def film(in_dim: int, out_dim: int, heads: int = 1) -> Program:
    """GNN-FiLM (Brockschmidt, ICML 2020) as PyG ``FiLMConv`` (act ReLU, aggr mean), per node ``i``:

    ``h'_i = relu(gamma_i * (h_i W_skip) + beta_i)
    + sum_r mean_{j in N_r(i)} relu(gamma_{r,i} * (h_j W_r) + beta_{r,i})``

    with ``beta_i = h_i B_skip``, ``gamma_i = h_i G_skip`` and, per relation, from the destination,
    ``beta_{r,i} = h_i B_r + b_r``, ``gamma_{r,i} = h_i G_r + g_r``. PyG's ``films[r]`` (``film_skip``)
    computes ``[beta | gamma]`` in one linear; here they are two, whose weights concatenate to PyG's
    (:func:`rgtune.torch_layers.pyg.to_pyg_film`). Every weight and bias starts as PyG's ``Linear``'s.
    """
    if heads != 1:
        raise IRError(f"film has one head, got heads={heads}; use heads=1")
    p = ProgramBuilder("film", in_dim, heads)
    x, out = p.x, (1, out_dim)
    # PyG's Linear starts weight and bias U(+-1/sqrt(in_dim))
    init: dict[str, ParamInit] = {"init": "uniform", "bias_init": "uniform"}
    skip = p.mul(p.linear(x, "film_skip_gamma", out=out, **init), p.linear(x, "lin_skip", out=out, **init))
    skip = p.relu(p.add(skip, p.linear(x, "film_skip_beta", out=out, **init)))
    beta = p.typed_linear(p.dst(x), "films_beta", out=out, by="rel", bias="films_beta_bias", **init)
    gamma = p.typed_linear(p.dst(x), "films_gamma", out=out, by="rel", bias="films_gamma_bias", **init)
    message = p.relu(p.add(p.mul(gamma, p.typed_linear(p.src(x), "lins", out=out, by="rel", **init)), beta))
    return p.finish(p.add(skip, p.aggregate(p.mul(message, p.inv_dst_rel_degree()))))


def _head_dim(out_dim: int, heads: int) -> int:
    if heads < 1 or out_dim % heads:
        raise IRError(f"out_dim={out_dim} is not divisible by heads={heads}")
    return out_dim // heads


for _builder in (rgcn, rgat, hgt, film):
    register_model(_builder.__name__, _builder)
