"""RGCN, RGAT, HGT and FiLM written in the inter-operator IR.

Each function reads like the model's equations (DESIGN.md, "The models"). Parameter names
and slice shapes are those of the reference layers in :mod:`rgtune.models`, so a state_dict
moves between a reference layer and a compiled one unchanged (FiLM's map to PyG's ``FiLMConv``
through :func:`rgtune.models.pyg.to_pyg_film`). The passes, not these
functions, decide how each value is materialized and computed.

Example:
    >>> print(build_model("rgcn", in_dim=4, out_dim=3).ops[-1])
    %6 = add(%4, %5) : node[1x3]
"""

from __future__ import annotations

from typing import Callable

from rgtune.ir.program import IRError, ParamInit, Program, ProgramBuilder, inv_sqrt


def rgcn(in_dim: int, out_dim: int, heads: int = 1) -> Program:
    """``h'_i = h_i W_0 + b + sum_r mean_{j in N_r(i)} h_j W_r`` (PyG ``RGCNConv``, aggr mean)."""
    p = ProgramBuilder("rgcn", in_dim, heads)
    x = p.x
    message = p.mul(p.typed_linear(p.src(x), "weight", out=(1, out_dim), by="rel"), p.inv_dst_rel_degree())
    root = p.linear(x, "root", out=(1, out_dim), bias="bias")
    return p.finish(p.add(root, p.aggregate(message)))


def rgat(in_dim: int, out_dim: int, heads: int = 1) -> Program:
    """Per edge ``j -> i`` of relation ``r`` and head ``h``:
    ``z_j = h_j W_r``, ``e_ij = LeakyReLU(a_dst_r . h_i W_r + a_src_r . z_j)``,
    ``alpha = softmax_i(e)``, ``h'_i = sum_j alpha_ij z_j``."""
    p = ProgramBuilder("rgat", in_dim, heads)
    d = _head_dim(out_dim, heads)
    z = p.typed_linear(p.src(p.x), "weight", out=(heads, d), by="rel")
    z_dst = p.typed_linear(p.dst(p.x), "weight", out=(heads, d), by="rel")
    e = p.leaky_relu(p.add(p.inner(z_dst, p.param("attn_dst", like=z_dst, dim=d)),
                           p.inner(z, p.param("attn_src", like=z, dim=d))), slope=0.2)
    alpha = p.edge_softmax(e)
    return p.finish(p.aggregate(p.mul(alpha, z)))


def hgt(in_dim: int, out_dim: int, heads: int = 1) -> Program:
    """PyG ``HGTConv``: typed K/Q/V; per relation and head ``k_e = K_src W_att``,
    ``m_e = V_src W_msg``, ``s = <k_e, Q_dst> mu_r / sqrt(D)``, ``a = softmax_dst(s)``,
    ``h = sum a m_e``; ``out = gelu(h) A_t + b_t``, gated skip when ``in == out``."""
    p = ProgramBuilder("hgt", in_dim, heads)
    d = _head_dim(out_dim, heads)
    x = p.x
    k = p.typed_linear(x, "k_weight", out=(heads, d), by="ntype", bias="k_bias")
    q = p.typed_linear(x, "q_weight", out=(heads, d), by="ntype", bias="q_bias")
    v = p.typed_linear(x, "v_weight", out=(heads, d), by="ntype", bias="v_bias")
    k_e = p.typed_linear(p.src(k), "w_att", out=(heads, d), by="rel", per_head=True)
    m_e = p.typed_linear(p.src(v), "w_msg", out=(heads, d), by="rel", per_head=True)
    s = p.scale(p.mul(p.inner(k_e, p.dst(q)), p.param("mu", like=k_e, init="ones")), inv_sqrt(d))
    h = p.aggregate(p.mul(p.edge_softmax(s), m_e))
    out = p.typed_linear(p.gelu(h), "a_weight", out=(1, out_dim), by="ntype", bias="a_bias")
    return p.finish(p.gated_residual(out, x, "skip") if in_dim == out_dim else out)


def film(in_dim: int, out_dim: int, heads: int = 1) -> Program:
    """GNN-FiLM (Brockschmidt, ICML 2020) as PyG ``FiLMConv`` (act ReLU, aggr mean), per node ``i``:

    ``h'_i = relu(gamma_i * (h_i W_skip) + beta_i)
    + sum_r mean_{j in N_r(i)} relu(gamma_{r,i} * (h_j W_r) + beta_{r,i})``

    with ``beta_i = h_i B_skip``, ``gamma_i = h_i G_skip`` and, per relation, from the destination,
    ``beta_{r,i} = h_i B_r + b_r``, ``gamma_{r,i} = h_i G_r + g_r``. PyG's ``films[r]`` (``film_skip``)
    computes ``[beta | gamma]`` in one linear; here they are two, whose weights concatenate to PyG's
    (:func:`rgtune.models.pyg.to_pyg_film`). Every weight and bias starts as PyG's ``Linear``'s.
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


MODELS: dict[str, Callable[[int, int, int], Program]] = {"rgcn": rgcn, "rgat": rgat, "hgt": hgt}


def build_model(name: str, in_dim: int = 64, out_dim: int = 64, heads: int = 1) -> Program:
    """The program of model ``name`` (one of :data:`MODELS`)."""
    if name not in MODELS:
        raise IRError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    if in_dim <= 0 or out_dim <= 0:
        raise IRError(f"feature sizes must be positive, got in_dim={in_dim}, out_dim={out_dim}")
    return MODELS[name](in_dim, out_dim, heads)
