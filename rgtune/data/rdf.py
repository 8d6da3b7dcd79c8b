"""The RDF entity-classification datasets (AIFB, MUTAG, BGS, AM) as :class:`HeteroGraph`.

Two constructions (see ``datasets/README.md``):

* ``"typed"`` (default): DGL's ``AIFBDataset``/``MUTAGDataset``/... heterograph, Hector's inputs.
  Node types come from IRI structure, literals become ``_Literal`` nodes keyed by their string,
  blank nodes (except in AM) and the target predicates are dropped, every kept triple also gives
  a reverse edge ``rev-<rel>``. Relation ``type`` is renamed ``rdftype`` as in DGL.
* ``"untyped"``: PyG's ``Entities`` / the R-GCN paper's graph. Every distinct subject and object
  term is a node of the one node type ``_N``; each predicate IRI ``p`` is a relation ``p``
  with a reverse relation ``rev-p``.

Numbering is canonical, never the accident of a set's iteration order: typed nodes are sorted
by key within their type, untyped nodes by (IRI | literal | blank node, text, datatype,
language), and each relation's edges by (source, destination).

Example (a four-triple AIFB-like file):
    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> A, S = "http://www.aifb.uni-karlsruhe.de/", "http://swrc.ontoware.org/ontology#"
    >>> _ = (d / "g.nt").write_text(
    ...     f'<{A}Personen/viewPersonOWL/id1instance> <{S}name> "Ann" .\\n'
    ...     f'<{A}Personen/viewPersonOWL/id2instance> <{S}name> "Bob" .\\n'
    ...     f'<{A}Publikationen/viewPublikationOWL/id9instance> <{S}author> <{A}Personen/viewPersonOWL/id1instance> .\\n'
    ...     f'<{A}Personen/viewPersonOWL/id1instance> <{S}employs> <{A}Personen/viewPersonOWL/id2instance> .\\n')
    >>> tsv = "person\\tid\\tlabel\\r\\n{}\\t1\\tg1\\r\\n"
    >>> _ = (d / "train.tsv").write_text(tsv.format(f"{A}Personen/viewPersonOWL/id1instance"))
    >>> _ = (d / "test.tsv").write_text(tsv.format(f"{A}Personen/viewPersonOWL/id2instance"))
    >>> g = build_rdf("aifb", d / "g.nt", d / "train.tsv", d / "test.tsv").graph
    >>> g.num_nodes(), g.num_edges(), g.ntypes
    (5, 6, ['Personen', 'Publikationen', '_Literal'])
    >>> g.task.train_idx.tolist(), g.task.test_idx.tolist(), g.task.num_classes
    ([0], [1], 1)
    >>> build_rdf("aifb", d / "g.nt", d / "train.tsv", d / "test.tsv", construction="untyped").graph.num_rels
    6
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, NamedTuple

import numpy as np
import torch

from rgtune.data._cache import cache_key, data_root, load_graph, save_graph
from rgtune.data._download import ensure_raw_files
from rgtune.data._ntriples import Term, Triples, parse_ntriples, read_text
from rgtune.data._rdf_rules import RULES, UNDETERMINED, RDFRules, TypedTriples, check_resolved
from rgtune.data.errors import CorruptDatasetError, DatasetError
from rgtune.data.graph import CanonicalEType, HeteroGraph, NodeTask

__all__ = ["Construction", "RDFBuild", "RULES", "RDFRules", "build_rdf", "load_rdf", "rdf_url", "UNTYPED_NTYPE"]

log = logging.getLogger("rgtune.data")

Construction = Literal["typed", "untyped"]
CONSTRUCTIONS: tuple[str, ...] = ("typed", "untyped")
UNTYPED_NTYPE = "_N"
_DROPPED = -2  # node-type id of a term that no triple may use
_RENAME = {"type": "rdftype", "rev-type": "rev-rdftype"}  # DGL: names usable as nn.ModuleDict keys


def rdf_url(name: str) -> str:
    """Where PyG and the R-GCN code fetch the raw archive of ``name``."""
    return f"https://data.dgl.ai/dataset/{name}.tgz"


class _Parts(NamedTuple):
    """What a construction produces, before it becomes a :class:`HeteroGraph`."""

    num_nodes: dict[str, int]
    edges: dict[CanonicalEType, tuple[torch.Tensor, torch.Tensor]]
    lookup: Callable[[str], int | None]  # labelled entity IRI -> node id in the task's node type
    keys: Callable[[], dict[str, list[str]]]


@dataclass(frozen=True)
class RDFBuild:
    """A built graph, plus the entity key of every node (per node type, in local id order)."""

    graph: HeteroGraph
    _keys: Callable[[], dict[str, list[str]]]

    def node_keys(self) -> dict[str, list[str]]:
        """Typed: the entity key (``"id1instance"``, a literal's text); untyped: the term's text."""
        return self._keys()


# ------------------------------------------------------------------------------- tasks
def _read_split(path: Path, rules: RDFRules) -> list[tuple[str, str, int]]:
    """``(entity IRI, label, line number)`` per data row of a split file (first line is a header)."""
    rows = []
    need = max(rules.sample_column, rules.label_column) + 1
    lines = read_text(path).replace("\r\n", "\n").replace("\r", "\n").split("\n")  # CRLF, as shipped
    for lineno, line in enumerate(lines, 1):
        if lineno == 1 or not line.strip():
            continue
        cols = line.strip().split("\t")
        if len(cols) < need:
            raise CorruptDatasetError(
                f"{path}, line {lineno}: expected {need} tab-separated columns, got {len(cols)}: {line[:120]!r}",
                path,
                lineno,
            )
        rows.append((cols[rules.sample_column], cols[rules.label_column], lineno))
    return rows


def _make_task(
    category: str,
    splits: list[list[tuple[str, str, int]]],
    lookup: Callable[[str], int | None],
    path_of: list[Path],
) -> NodeTask:
    # Label ids in order of first appearance (training file, then test file), as DGL numbers them.
    label_ids: dict[str, int] = {}
    out: list[tuple[torch.Tensor, torch.Tensor]] = []
    for rows, path in zip(splits, path_of):
        idx, lab, absent = [], [], []
        for iri, label, lineno in rows:
            node = lookup(iri)
            if node is None:  # DGL skips these too (an entity without any kept triple)
                absent.append(f"line {lineno}: {iri}")
                continue
            idx.append(node)
            lab.append(label_ids.setdefault(label, len(label_ids)))
        if absent:
            more = f" and {len(absent) - 3} more" if len(absent) > 3 else ""
            log.warning("%s: %d entities are not %s nodes of the graph and are ignored (%s%s)",
                        path, len(absent), category, "; ".join(absent[:3]), more)  # fmt: skip
        out.append((torch.tensor(idx, dtype=torch.int64), torch.tensor(lab, dtype=torch.int64)))
    (train_idx, train_y), (test_idx, test_y) = out
    return NodeTask(category, len(label_ids), train_idx, train_y, test_idx, test_y)


# ------------------------------------------------------------------------ typed graph
def _group_edges(
    etkey: np.ndarray, src: np.ndarray, dst: np.ndarray, names: Callable[[int], CanonicalEType]
) -> dict[CanonicalEType, tuple[torch.Tensor, torch.Tensor]]:
    """Split edges by relation key; each relation's edges sorted by (src, dst)."""
    order = np.lexsort((dst, src, etkey))
    etkey, src, dst = etkey[order], src[order], dst[order]
    keys, starts = np.unique(etkey, return_index=True)
    bounds = list(starts) + [len(etkey)]
    edges: dict[CanonicalEType, tuple[torch.Tensor, torch.Tensor]] = {}
    for i, k in enumerate(keys):
        s, d = torch.from_numpy(src[bounds[i] : bounds[i + 1]]), torch.from_numpy(dst[bounds[i] : bounds[i + 1]])
        c = names(int(k))
        if c in edges:  # two relation names that coincide after DGL's renaming: one relation
            s, d = torch.cat([edges[c][0], s]), torch.cat([edges[c][1], d])
            perm = torch.from_numpy(np.lexsort((d.numpy(), s.numpy())))
            s, d = s[perm], d[perm]
        edges[c] = (s, d)
    return edges


def _typed(rules: RDFRules, tr: Triples) -> _Parts:
    """DGL's construction, vectorized: entity/relation rules once per distinct term, then arrays."""
    classes: dict[str, int] = {}
    keys: dict[str, int] = {}
    ecls = np.full(len(tr.terms), _DROPPED, dtype=np.int64)
    ekey = np.zeros(len(tr.terms), dtype=np.int64)
    for i, term in enumerate(tr.terms):
        ent = rules.entity(term)
        if ent is not None:
            ecls[i] = UNDETERMINED if ent[0] is None else classes.setdefault(ent[0], len(classes))
            ekey[i] = keys.setdefault(ent[1], len(keys))
    relations: dict[str, int] = {}
    prel = np.full(len(tr.terms), -1, dtype=np.int64)
    for p in np.unique(tr.p):
        name = rules.relation(tr.terms[int(p)].value)
        if name is not None:
            prel[p] = relations.setdefault(name, len(relations))

    keep = (ecls[tr.s] != _DROPPED) & (ecls[tr.o] != _DROPPED) & (prel[tr.p] >= 0)
    s, p, o = tr.s[keep], tr.p[keep], tr.o[keep]
    k = TypedTriples(ecls[s], ecls[o], prel[p], p, tr.terms, list(relations), classes)
    if rules.fixup is not None:
        rules.fixup(k)
    check_resolved(k, rules.name)

    # Nodes: distinct (type, key) pairs, numbered within each type in sorted key order.
    key_strings = list(keys)
    rank = np.empty(len(key_strings), dtype=np.int64)
    by_text = np.array(sorted(range(len(key_strings)), key=key_strings.__getitem__), dtype=np.int64)
    rank[by_text] = np.arange(len(key_strings))
    nk = max(len(key_strings), 1)
    both = np.concatenate([k.scls * nk + rank[ekey[s]], k.ocls * nk + rank[ekey[o]]])
    nodes, inverse = np.unique(both, return_inverse=True)
    node_cls = nodes // nk
    local = np.arange(len(nodes)) - np.searchsorted(node_cls, node_cls, side="left")
    s_loc, o_loc = local[inverse[: len(s)]], local[inverse[len(s) :]]

    class_names = list(k.classes)
    counts = np.bincount(node_cls, minlength=len(class_names))
    num_nodes = {class_names[c]: int(counts[c]) for c in np.flatnonzero(counts)}

    nrel, ncls = len(k.relations), len(class_names)
    rel_names = [_RENAME.get(r, r) for r in k.relations] + [_RENAME.get(f"rev-{r}", f"rev-{r}") for r in k.relations]
    forward = (k.scls * 2 * nrel + k.rel) * ncls + k.ocls
    reverse = (k.ocls * 2 * nrel + k.rel + nrel) * ncls + k.scls
    etkey = np.concatenate([forward, reverse])

    def name_of(key: int) -> CanonicalEType:
        rest, dst_c = divmod(key, ncls)
        src_c, r = divmod(rest, 2 * nrel)
        return class_names[src_c], rel_names[r], class_names[dst_c]

    edges = _group_edges(etkey, np.concatenate([s_loc, o_loc]), np.concatenate([o_loc, s_loc]), name_of)

    def lookup(iri: str) -> int | None:
        ent = rules.entity(Term("U", iri))
        if ent is None or ent[0] != rules.category or ent[0] not in k.classes or ent[1] not in keys:
            return None
        want = k.classes[ent[0]] * nk + rank[keys[ent[1]]]
        pos = int(np.searchsorted(nodes, want))
        return int(local[pos]) if pos < len(nodes) and nodes[pos] == want else None

    def node_keys() -> dict[str, list[str]]:
        by_rank = sorted(key_strings)
        present = np.flatnonzero(counts)
        return {class_names[c]: [by_rank[int(x)] for x in nodes[node_cls == c] % nk] for c in present}

    return _Parts(num_nodes, edges, lookup, node_keys)


# ---------------------------------------------------------------------- untyped graph
def _term_order(t: Term) -> tuple[int, str, str, str]:
    return ("ULB".index(t.kind), t.value, t.datatype or "", t.lang or "")


def _untyped(tr: Triples) -> _Parts:
    """PyG's construction: every distinct subject/object term a node, every predicate a relation."""
    used = np.unique(np.concatenate([tr.s, tr.o]))
    order = sorted(used.tolist(), key=lambda i: _term_order(tr.terms[i]))
    pos = np.full(len(tr.terms), -1, dtype=np.int64)
    pos[np.array(order, dtype=np.int64)] = np.arange(len(order))
    preds = np.unique(tr.p)
    names = [tr.terms[int(p)].value for p in preds]
    rel = np.searchsorted(preds, tr.p)
    n = len(preds)
    etkey = np.concatenate([rel, rel + n])
    src, dst = pos[tr.s], pos[tr.o]
    all_names = names + [f"rev-{x}" for x in names]
    edges = _group_edges(
        etkey,
        np.concatenate([src, dst]),
        np.concatenate([dst, src]),
        lambda key: (UNTYPED_NTYPE, all_names[key], UNTYPED_NTYPE),
    )
    iri_node = {tr.terms[i].value: int(pos[i]) for i in order if tr.terms[i].kind == "U"}

    def node_keys() -> dict[str, list[str]]:
        return {UNTYPED_NTYPE: [tr.terms[i].value for i in order]}

    return _Parts({UNTYPED_NTYPE: len(order)}, edges, iri_node.get, node_keys)


# ----------------------------------------------------------------------------- build
def build_rdf(
    rules: RDFRules | str,
    nt_path: Path,
    train_tsv: Path,
    test_tsv: Path,
    construction: Construction = "typed",
) -> RDFBuild:
    """Build a dataset's graph and task from explicit files (no data root, no cache)."""
    if isinstance(rules, str):
        rules = RULES[rules]
    if construction not in CONSTRUCTIONS:
        raise DatasetError(f"unknown construction {construction!r}; choose one of {list(CONSTRUCTIONS)}")
    t0 = time.perf_counter()
    log.info("%s: parsing %s", rules.name, nt_path)
    triples = parse_ntriples(nt_path)
    splits = [_read_split(Path(f), rules) for f in (train_tsv, test_tsv)]
    parts = _typed(rules, triples) if construction == "typed" else _untyped(triples)
    category = rules.category if construction == "typed" else UNTYPED_NTYPE
    if category not in parts.num_nodes:
        raise DatasetError(f"dataset {rules.name!r}: the graph has no {category!r} nodes to classify")
    task = _make_task(category, splits, parts.lookup, [Path(train_tsv), Path(test_tsv)])
    name = rules.name if construction == "typed" else f"{rules.name}-untyped"
    graph = HeteroGraph(parts.num_nodes, parts.edges, name=name, task=task)
    log.info("%s: %r built from %d triples in %.2f s", rules.name, graph, len(triples), time.perf_counter() - t0)
    return RDFBuild(graph, parts.keys)


def load_rdf(
    name: str,
    root: str | Path | None = None,
    *,
    construction: Construction = "typed",
    download: bool = True,
    use_cache: bool = True,
) -> HeteroGraph:
    """Load an RDF dataset from ``<root>/<name>/`` (downloading it if needed), through the cache."""
    rules = RULES[name]
    if construction not in CONSTRUCTIONS:
        raise DatasetError(f"unknown construction {construction!r}; choose one of {list(CONSTRUCTIONS)}")
    folder = data_root(root) / name
    nt, train, test = ensure_raw_files(
        name,
        folder,
        [(f"{name}_stripped.nt.gz", f"{name}_stripped.nt"), ("trainingSet.tsv",), ("testSet.tsv",)],
        url=rdf_url(name),
        sha256=rules.tgz_sha256,
        download=download,
    )
    key = cache_key(name, construction, {"graph": nt, "train": train, "test": test})
    if use_cache and (graph := load_graph(key)) is not None:
        return graph
    graph = build_rdf(rules, nt, train, test, construction).graph
    if use_cache:
        save_graph(key, graph)
    return graph
