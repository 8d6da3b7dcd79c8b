"""How generated C code reaches, from one row, the rows and types it reads (``src``, ``rel``, ...).

A kernel body works on one row of a domain (an edge position, a node, a pair). Expressions
name other rows by *via* (:mod:`rgtune.ir.kernels`); :class:`RowIndex` turns each via the
body uses into one ``const int64_t`` local computed once per row from the graph's index
arrays, declared in dependency order (a binary search for an edge's pair needs its
relation and node first). Graph array names are the fields of the kernel context
(``e_src``, ``sp_offsets``, ...).

Example:
    >>> rows = RowIndex("edge", "e", pair_index="bsearch")
    >>> rows.var("src_pair")
    'i_sp'
    >>> print("\\n".join(rows.declarations()))
    const int64_t i_rel = e_rel[e];
    const int64_t i_src = e_src[e];
    const int64_t i_sp = rg_find(sp_node, sp_offsets[i_rel], sp_offsets[i_rel + 1], i_src);
    >>> sorted(rows.arrays)
    ['e_rel', 'e_src', 'sp_node', 'sp_offsets']
"""

from __future__ import annotations

from typing import Iterable

from rgtune.ir.kernels import Expr, GraphLoad, Load, ParamLoad

#: the graph's index arrays a kernel may read (all ``idx_t``)
INDEX_ARRAYS = ("node_type", "csr_indptr", "e_src", "e_dst", "e_rel", "e_sp", "e_dp", "sp_node", "sp_rel",
                "sp_offsets", "dp_node", "dp_rel", "dp_offsets")
#: per-edge graph constants (``float``, converted once per graph)
GRAPH_CONSTANTS = ("inv_dst_rel_degree", "inv_dst_degree", "dst_degree", "edge_weight")  # edge_weight: the call's

_VAR = {"row": None, "src": "i_src", "dst": "i_dst", "rel": "i_rel", "src_pair": "i_sp", "dst_pair": "i_dp",
        "pair_node": "i_pn", "ntype": "i_nt", "src_ntype": "i_snt", "dst_ntype": "i_dnt", "none": "0"}


class RowIndex:
    """The index locals of one row of ``domain`` whose position is the C expression ``row``.

    ``known`` gives vias whose value the loop already has (``{"dst": "dn"}`` in a
    destination-parallel traversal).
    """

    def __init__(self, domain: str, row: str, pair_index: str = "direct", known: dict[str, str] | None = None) -> None:
        self.domain = domain
        self.row = row
        self.pair_index = pair_index
        self.known = dict(known or {})
        self.arrays: set[str] = set()
        self._decls: dict[str, str] = {}  # var -> declaration, in dependency order

    def var(self, via: str) -> str:
        """The C expression of ``via`` for this row (declaring what it needs)."""
        if via == "row":
            return self.row
        if via == "none":
            return "0"
        if via not in _VAR:
            raise ValueError(f"unknown via {via!r}")
        name = _VAR[via]
        if name not in self._decls:
            self._decls[name] = ""  # reserve the slot after its dependencies are declared
            value = self.known.get(via) or self._value(via)
            del self._decls[name]
            self._decls[name] = f"const int64_t {name} = {value};"
        return name

    def declarations(self) -> list[str]:
        return list(self._decls.values())

    def _array(self, name: str) -> str:
        self.arrays.add(name)
        return name

    def _value(self, via: str) -> str:
        d, row = self.domain, self.row
        if d == "edge":
            if via in ("src", "dst", "rel"):
                return f"{self._array('e_' + via)}[{row}]"
            if via in ("src_pair", "dst_pair"):
                side = via[0] + "p"  # sp / dp
                if self.pair_index == "direct":
                    return f"{self._array('e_' + side)}[{row}]"
                rel, node = self.var("rel"), self.var(via.split("_")[0])
                offs = self._array(f"{side}_offsets")
                return f"rg_find({self._array(side + '_node')}, {offs}[{rel}], {offs}[{rel} + 1], {node})"
            if via in ("src_ntype", "dst_ntype"):
                return f"{self._array('node_type')}[{self.var(via.split('_')[0])}]"
        elif d in ("node", "dst_node"):
            if via == "ntype":
                return f"{self._array('node_type')}[{row}]"
        elif d in ("src_pair", "dst_pair"):
            side = d[0] + "p"
            if via == "pair_node":
                return f"{self._array(side + '_node')}[{row}]"
            if via == "rel":
                return f"{self._array(side + '_rel')}[{row}]"
            if via in ("ntype", f"{d[:3]}_ntype"):
                return f"{self._array('node_type')}[{self.var('pair_node')}]"
        raise ValueError(f"no index {via!r} on {d} rows")


def expr_names(exprs: Iterable[Expr]) -> tuple[set[str], set[str], set[str]]:
    """Buffers, params and graph constants the expressions read."""
    bufs, params, consts = set(), set(), set()
    for e in exprs:
        for x in e.walk():
            if isinstance(x, Load):
                bufs.add(x.buffer)
            elif isinstance(x, ParamLoad):
                params.add(x.param)
            elif isinstance(x, GraphLoad):
                consts.add(x.kind)
    return bufs, params, consts
