"""Seeded synthetic heterographs: the shape of real datasets, or explicit knobs.

Two entry points:

* :func:`load_synthetic` reads what follows ``synthetic:`` in a dataset name: a preset
  (``aifb``, ``mutag``, ``bgs``, ``am``, ``ogbn-mag``) or ``custom``, then ``key=value`` fields,
  e.g. ``"ogbn-mag,scale=0.1,seed=3"`` or ``"custom,nodes=10000,edges=80000,rels=12"``.
* :func:`random_graph` takes the knobs as arguments; property-based tests use it to reach what
  real data rarely has (empty relations, isolated nodes, a type without in-edges, a huge hub).

How a graph is drawn:

* **Relation sizes** follow a Zipf law over the relations (``zipf``). Presets pin the relations
  whose sizes the datasets README gives and spread the remaining edges over the others.
* **Degrees**: every node type gets a random popularity order; an endpoint is drawn by rank
  from a power law ``P(rank r) ~ (r + 1.5) ** -skew`` (``degree_skew`` for destinations,
  ``src_skew`` for sources; 0 is uniform). Popular nodes are popular in every relation.
* **Simple relations**: no duplicate ``(src, dst)`` within a relation unless ``multi``; duplicates
  are redrawn, so relation sizes are exact. Edges keep the (random) order they were drawn in.
* **Reverse relations** (``reverse``) mirror every relation under a prefixed name.
* **Determinism**: each random stream is seeded by ``(seed, purpose, crc32 of a name)``, so the
  same spec gives the same graph (same ``content_hash``) on every run, and changing one relation
  leaves the others' edges alone. The schema (which types a relation connects) never depends on
  ``seed``; ``seed`` changes the edges only.

Example:
    >>> g = load_synthetic("aifb,scale=0.2,seed=1")
    >>> g.name, g.num_rels, len(g.ntypes)
    ('synthetic:aifb,scale=0.2,seed=1', 104, 7)
    >>> g.content_hash == load_synthetic("aifb,seed=1,scale=0.2").content_hash
    True
    >>> h = random_graph([30, 40], num_relations=3, num_edges=200, empty_relations=1, hub_in_degree=500)
    >>> int(h.in_degrees.max()) >= 500, h.stats.empty_relations
    (True, 1)
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from rgtune._environ import parse_flag
from rgtune.data.errors import DatasetError
from rgtune.data.graph import CanonicalEType, HeteroGraph

__all__ = ["PRESETS", "SyntheticSpecError", "describe_presets", "load_synthetic", "random_graph"]


class SyntheticSpecError(DatasetError):
    """A ``synthetic:`` spec that cannot be read: names the bad field and what is valid (a ``ValueError``)."""


# ---------------------------------------------------------------------------- random streams
_POPULARITY, _EDGES, _SCHEMA, _HUB, _COVER = 1, 2, 3, 4, 5


def _rng(seed: int, purpose: int, key: str) -> np.random.Generator:
    """One independent stream per (seed, purpose, name): adding a relation does not move the others."""
    return np.random.default_rng([seed, purpose, zlib.crc32(key.encode())])


def _draw_ranks(rng: np.random.Generator, n: int, skew: float, size: int) -> np.ndarray:
    """``size`` ranks in ``[0, n)``, ``P(r) ~ (r + 1.5) ** -skew``: a continuous power law, floored."""
    if skew == 0.0 or n <= 1:
        return rng.integers(0, max(n, 1), size, dtype=np.int64)
    x = rng.random(size)
    # Invert the CDF of x ** -skew on [1, n + 1) in place: these arrays reach tens of millions.
    if abs(skew - 1.0) < 1e-6:
        np.multiply(x, math.log(n + 1.0), out=x)
        np.exp(x, out=x)
    else:
        a = 1.0 - skew
        np.multiply(x, (n + 1.0) ** a - 1.0, out=x)
        np.add(x, 1.0, out=x)
        np.power(x, 1.0 / a, out=x)
    ranks = x.astype(np.int64)
    ranks -= 1
    return np.minimum(ranks, n - 1, out=ranks)  # x may round up to n + 1 when u is near 1


def _draw_keys(rng: np.random.Generator, ns: int, nd: int, size: int, skews: tuple[float, float]) -> np.ndarray:
    keys = _draw_ranks(rng, ns, skews[0], size)
    keys *= nd
    keys += _draw_ranks(rng, nd, skews[1], size)
    return keys


def _in_sorted(values: np.ndarray, sorted_ref: np.ndarray) -> np.ndarray:
    if sorted_ref.size == 0:
        return np.zeros(values.shape, dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_ref, values), sorted_ref.size - 1)
    return sorted_ref[pos] == values


def _first_unique(keys: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique keys, the first occurrence of each in draw order); keys lie in ``[0, bound)``.

    Sorting ``key * n + position`` (all distinct) finds first occurrences with a plain value sort,
    which is fast and the same everywhere; an unstable argsort could order ties differently on
    another machine's SIMD dispatch, and a stable one is several times slower.
    """
    n = keys.size
    if n == 0 or bound * n >= 2**63:
        uniq, first = np.unique(keys, return_index=True)  # return_index: a stable sort
        first.sort()
        return uniq, keys[first]
    comp = keys * n
    comp += np.arange(n, dtype=np.int64)
    comp.sort()
    key = comp // n
    head = np.empty(n, dtype=bool)
    head[0] = True
    np.not_equal(key[1:], key[:-1], out=head[1:])
    pos = comp[head] % n
    pos.sort()
    return key[head], keys[pos]


def _simple_keys(rng: np.random.Generator, ns: int, nd: int, num: int, skews: tuple[float, float]) -> np.ndarray:
    """``num`` distinct ``src * nd + dst`` keys in draw order; duplicates are redrawn."""
    capacity = ns * nd
    seen, kept = _first_unique(_draw_keys(rng, ns, nd, num, skews), capacity)
    parts, have = [kept], kept.size
    accept = max(have / max(num, 1), 0.05)  # the fraction of a draw expected to be new
    for _ in range(100_000):
        if have >= num:
            break
        need = num - have
        size = int(need / accept * 1.1) + 64
        _, cand = _first_unique(_draw_keys(rng, ns, nd, size, skews), capacity)
        fresh = cand[~_in_sorted(cand, seen)]
        if fresh.size < 0.05 * size:
            # The popular corner is saturated; finish with uniform endpoints so the loop ends.
            skews = (0.0, 0.0)
        fresh = fresh[:need]
        parts.append(fresh)
        have += fresh.size
        seen = np.sort(np.concatenate([seen, fresh]))
        # Uniform draws hit a free pair with probability (free pairs / all pairs): never 0 while
        # need > 0, and it bounds the next draw by about the number of pairs.
        accept = (capacity - have) / capacity if skews == (0.0, 0.0) else max(fresh.size / size, 0.05)
    return np.concatenate(parts)


# ------------------------------------------------------------------------------- the plan
_Edges = dict[CanonicalEType, tuple[np.ndarray, np.ndarray]]
_RelSpec = tuple[str, str, str, int, float | None, float | None]  # src, name, dst, edges, skews


@dataclass(frozen=True)
class _Rel:
    src: str
    name: str
    dst: str
    num_edges: int
    src_skew: float
    dst_skew: float


@dataclass(frozen=True)
class _Plan:
    """Everything :func:`_build` needs; specs and :func:`random_graph` both end here."""

    name: str
    num_nodes: Mapping[str, int]
    relations: tuple[_Rel, ...]
    seed: int
    multi: bool = False
    reverse_prefix: str | None = None  # None: no reverse relations
    isolated: int = 0  # per node type, the least popular nodes that no edge touches
    hub_in_degree: int = 0  # extra in-edges of the most popular destination of relations[0]
    cover: bool = False  # move edge ends onto nodes no edge touches (real datasets have almost none)


def _capacity(plan: _Plan, rel: _Rel) -> int:
    return _active(plan, rel.src) * _active(plan, rel.dst)


def _active(plan: _Plan, ntype: str) -> int:
    return max(int(plan.num_nodes[ntype]) - plan.isolated, 0)


def _build(plan: _Plan) -> HeteroGraph:
    order = {t: _rng(plan.seed, _POPULARITY, t).permutation(int(n)) for t, n in plan.num_nodes.items()}
    edges: _Edges = {}
    for i, rel in enumerate(plan.relations):
        ns, nd = _active(plan, rel.src), _active(plan, rel.dst)
        num = rel.num_edges if plan.multi else min(rel.num_edges, ns * nd)
        if ns == 0 or nd == 0 or num == 0:
            keys = np.zeros(0, dtype=np.int64)
        else:
            if ns * nd >= 2**62:
                raise SyntheticSpecError(f"relation {rel.name!r}: {ns} x {nd} node pairs overflow 64-bit edge keys")
            rng = _rng(plan.seed, _EDGES, "\0".join((rel.src, rel.name, rel.dst)))
            skews = (rel.src_skew, rel.dst_skew)
            keys = _draw_keys(rng, ns, nd, num, skews) if plan.multi else _simple_keys(rng, ns, nd, num, skews)
        s_rank, d_rank = np.divmod(keys, max(nd, 1))
        if i == 0 and plan.hub_in_degree:
            s_rank, d_rank = _add_hub(plan, rel, s_rank, d_rank)
        edges[(rel.src, rel.name, rel.dst)] = (order[rel.src][s_rank], order[rel.dst][d_rank])
    if plan.cover:
        for t in plan.num_nodes:
            _cover(edges, t, int(plan.num_nodes[t]), _rng(plan.seed, _COVER, t))
    if plan.reverse_prefix is not None:
        for (a, r, b), (s, d) in list(edges.items()):
            edges[(b, plan.reverse_prefix + r, a)] = (d, s)
    tensors = {c: (torch.from_numpy(s), torch.from_numpy(d)) for c, (s, d) in edges.items()}
    return HeteroGraph(dict(plan.num_nodes), tensors, name=plan.name)


def _cover(edges: _Edges, t: str, n: int, rng: np.random.Generator) -> None:
    """Give every untouched node of type ``t`` one edge end, taken from nodes that keep at least one.

    Entity graphs are made of the entities their triples mention, so almost no node is isolated;
    power-law draws leave many. Ends move from the largest (relation, side) of type ``t`` first.
    The moved edge cannot become a duplicate: its new end had no edge at all.
    """
    slots = sorted(((arr.size, c, i) for c, pair in edges.items() for i, arr in enumerate(pair) if c[2 * i] == t),
                   key=lambda x: -x[0])  # stable: ties stay in relation order
    deg = np.zeros(n, dtype=np.int64)
    for _, c, i in slots:
        deg += np.bincount(edges[c][i], minlength=n)
    lonely = np.flatnonzero(deg == 0)
    for _, c, i in slots:
        if lonely.size == 0:
            break
        ends = edges[c][i]
        donors = np.flatnonzero(deg[ends] >= 2)
        if donors.size == 0:
            continue
        picked = rng.choice(donors, size=min(donors.size, 2 * lonely.size), replace=False)
        # A donor node gives at most deg - 1 ends: rank each pick within its node, in pick order.
        order = np.argsort(ends[picked], kind="stable")
        node = ends[picked][order]
        start = np.r_[0, np.flatnonzero(node[1:] != node[:-1]) + 1]
        rank = np.arange(node.size) - np.repeat(start, np.diff(np.r_[start, node.size]))
        ok = np.empty(node.size, dtype=bool)
        ok[order] = rank < deg[node] - 1
        picked = picked[ok][: lonely.size]
        new = ends.copy()  # the arrays may be shared with another relation's reverse or a caller
        np.subtract.at(deg, new[picked], 1)
        new[picked] = lonely[: picked.size]
        deg[lonely[: picked.size]] = 1
        edges[c] = (new, edges[c][1]) if i == 0 else (edges[c][0], new)
        lonely = lonely[picked.size :]


def _add_hub(plan: _Plan, rel: _Rel, s_rank: np.ndarray, d_rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Give rank-0 destination ``hub_in_degree`` in-edges in ``rel`` (distinct sources unless multi)."""
    ns, k = _active(plan, rel.src), plan.hub_in_degree
    if _capacity(plan, rel) == 0 or (not plan.multi and ns < k):
        raise ValueError(
            f"hub_in_degree={k}: relation {rel.name!r} has {ns} usable source nodes; "
            "use more source nodes or multi=True"
        )
    rng = _rng(plan.seed, _HUB, rel.name)
    if plan.multi:
        hub_src = rng.integers(0, ns, k, dtype=np.int64)
    else:
        hub_src = rng.permutation(ns)[:k]
        keep = d_rank != 0  # drop the hub's own edges so that no (src, hub) pair repeats
        s_rank, d_rank = s_rank[keep], d_rank[keep]
    return np.concatenate([s_rank, hub_src]), np.concatenate([d_rank, np.zeros(k, dtype=np.int64)])


def _zipf_sizes(total: int, n: int, exponent: float, first_rank: int = 1) -> np.ndarray:
    """Split ``total`` over ``n`` parts with Zipf weights; integers summing exactly to ``total``."""
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    w = (np.arange(n, dtype=np.float64) + first_rank) ** -exponent
    share = w / w.sum() * total
    sizes = np.floor(share).astype(np.int64)
    # Largest remainders get the leftover units; a stable sort keeps ties in rank order.
    extra = np.argsort(-(share - sizes), kind="stable")[: total - int(sizes.sum())]
    sizes[extra] += 1
    return sizes


# ----------------------------------------------------------------------------- presets
@dataclass(frozen=True)
class _Preset:
    """A dataset's published statistics plus the assumptions needed to draw a look-alike."""

    about: str
    num_nodes: Mapping[str, int]
    edges: int  # total, as the README states it
    rels: int  # canonical edge types, total
    names: int  # distinct relation names, total
    pinned: tuple[_RelSpec, ...] = ()
    reverse: bool = True  # the stated totals include reverse relations
    reverse_prefix: str = "rev-"
    zipf: float = 1.2
    degree_skew: float = 0.9
    src_skew: float = 0.5
    sink_types: tuple[str, ...] = ("_Literal",)  # never a source of a forward relation (RDF literals)


def _split_types(total: int, names: Sequence[str]) -> dict[str, int]:
    return dict(zip(names, (int(c) for c in _zipf_sizes(total, len(names), 1.0))))


_PRESETS: dict[str, _Preset] = {
    "aifb": _Preset(
        "AIFB, DGL's typed RDF construction",
        {"Forschungsgebiete": 146, "Forschungsgruppen": 5, "Kooperationen": 28, "Personen": 237,
         "Projekte": 78, "Publikationen": 1318, "_Literal": 5450},
        edges=48_810, rels=104, names=78,
        pinned=(("Personen", "publication", "Publikationen", 2609, None, None),
                ("Publikationen", "author", "Personen", 2550, None, None),
                ("Publikationen", "isAbout", "Forschungsgebiete", 2120, None, None)),
    ),
    "mutag": _Preset(
        "MUTAG, DGL's typed RDF construction",
        {"SCHEMA": 3687, "_Literal": 1104, "bond": 9317, "d": 9529, "hasStructure": 3526},
        edges=148_100, rels=50, names=46,
        pinned=(("bond", "inBond", "d", 18634, None, None),),
    ),
    # BGS and AM: the README gives totals only; the node-type split (8 and 7 types, Zipf) is assumed,
    # and each relation name is taken to be one canonical edge type.
    "bgs": _Preset(
        "BGS-sized (type split assumed)",
        _split_types(94_806, ["Lexicon/NamedRockUnit"] + [f"bgs{i}" for i in range(1, 8)]),
        edges=672_884, rels=96, names=96, sink_types=(),
    ),
    "am": _Preset(
        "AM-sized (type split assumed)",
        _split_types(881_680, ["proxy"] + [f"am{i}" for i in range(1, 7)]),
        edges=5_668_682, rels=96, names=96, sink_types=(),
    ),
    "ogbn-mag": _Preset(
        "ogbn-mag as OGB ships it; reverse=1 adds rev_ relations (42.2M edges)",
        {"author": 1_134_649, "field_of_study": 59_965, "institution": 8_740, "paper": 736_389},
        edges=21_111_007, rels=4, names=4, reverse=False, reverse_prefix="rev_", sink_types=(),
        # (src skew, dst skew): few affiliations per author, few authors per paper, heavy-tailed
        # citation counts, fields of study with very many papers.
        pinned=(("author", "affiliated_with", "institution", 1_043_998, 0.2, 1.0),
                ("author", "writes", "paper", 7_145_660, 0.7, 0.3),
                ("paper", "cites", "paper", 5_416_271, 0.4, 0.8),
                ("paper", "has_topic", "field_of_study", 7_505_078, 0.2, 1.0)),
    ),
}
PRESETS: tuple[str, ...] = tuple(_PRESETS) + ("custom",)


def _preset_relations(key: str, p: _Preset, zipf: float) -> list[_RelSpec]:
    """The forward relations at scale 1: the pinned ones, then Zipf-sized fillers (seed-independent)."""
    fwd = 2 if p.reverse else 1
    n_rels, n_names, n_edges = p.rels // fwd, p.names // fwd, p.edges // fwd
    rels = list(p.pinned)
    n_fill = n_rels - len(rels)
    sizes = _zipf_sizes(n_edges - sum(r[3] for r in rels), n_fill, zipf, first_rank=len(rels) + 1)
    fill_names = [f"r{i:02d}" for i in range(n_names - len({r[1] for r in rels}))]
    return rels + _place(_rng(0, _SCHEMA, key), p.num_nodes, sizes, fill_names, taken={r[:3] for r in rels},
                         sink_types=p.sink_types)


def _place(
    rng: np.random.Generator,
    num_nodes: Mapping[str, int],
    sizes: np.ndarray,
    names: Sequence[str],
    taken: set[tuple[str, str, str]],
    sink_types: Sequence[str] = (),
) -> list[_RelSpec]:
    """Give each relation size a (src type, name, dst type): the first ``len(names)`` get fresh
    names, later ones reuse a name between another pair of types (AIFB: 104 edge types, 78 names).
    Endpoint types are drawn by sqrt(node count), preferring pairs with room for 4x the edges;
    a type no relation in ``taken`` touches is made the end of one of the smallest relations."""
    types = sorted(num_nodes)
    srcs = [t for t in types if t not in sink_types] or types
    p_src, p_dst = (np.sqrt([num_nodes[t] for t in ts]) + 1e-9 for ts in (srcs, types))
    p_src, p_dst = p_src / p_src.sum(), p_dst / p_dst.sum()
    touched = {t for c in taken for t in (c[0], c[2])}
    forced = {len(sizes) - 1 - k: t for k, t in enumerate(t for t in types if t not in touched)}
    out = []
    for i, size in enumerate(int(x) for x in sizes):
        best: tuple[str, str, str] | None = None
        for _ in range(200):
            name = names[i] if i < len(names) else names[int(rng.integers(len(names)))]
            s, d = srcs[int(rng.choice(len(srcs), p=p_src))], types[int(rng.choice(len(types), p=p_dst))]
            d = forced.get(i, d)
            if (s, name, d) in taken:
                continue
            if best is None or num_nodes[s] * num_nodes[d] > num_nodes[best[0]] * num_nodes[best[2]]:
                best = (s, name, d)
            if num_nodes[s] * num_nodes[d] >= 4 * size:
                break
        if best is None:
            raise SyntheticSpecError(f"cannot find {len(sizes)} distinct edge types over node types {types}")
        taken.add(best)
        out.append((*best, size, None, None))
    return out


# ------------------------------------------------------------------------------- the spec
def _number(kind: type, minimum: float, strict: bool = False) -> Callable[[str], float | int]:
    def parse(text: str) -> float | int:
        value = float(text)  # "1e6" is a fine way to write a count
        if kind is int:
            if not value.is_integer():
                raise ValueError(text)
            value = int(value)
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            raise ValueError(text)
        return value

    return parse


# name -> (parser, what it accepts, only for "custom")
_FIELDS: dict[str, tuple[Callable[[str], object], str, bool]] = {
    "nodes": (_number(int, 1), "an integer >= 1: total nodes", True),
    "edges": (_number(int, 0), "an integer >= 0: total edges", True),
    "ntypes": (_number(int, 1), "an integer >= 1: node types", True),
    "rels": (_number(int, 0), "an integer >= 0: canonical edge types", True),
    "zipf": (_number(float, 0.0), "a number >= 0: Zipf exponent of relation sizes", False),
    "degree_skew": (_number(float, 0.0), "a number >= 0: power-law exponent of destination popularity", False),
    "src_skew": (_number(float, 0.0), "a number >= 0: power-law exponent of source popularity", False),
    "reverse": (parse_flag, "0/1: mirror every relation under a reverse name", False),
    "multi": (parse_flag, "0/1: allow duplicate (src, dst) pairs within a relation", False),
    "scale": (_number(float, 0.0, strict=True), "a number > 0 multiplying node and edge counts", False),
    "seed": (_number(int, 0), "an integer >= 0", False),
}


@dataclass(frozen=True)
class _Options:
    """The fields of a spec, with ``custom``'s defaults; a preset overrides some defaults."""

    nodes: int = 1000
    edges: int = 8000
    ntypes: int = 3
    rels: int = 6
    zipf: float = 1.0
    degree_skew: float = 1.0
    src_skew: float = 0.5
    reverse: bool = False
    multi: bool = False
    scale: float = 1.0
    seed: int = 0


def _defaults(preset: str) -> _Options:
    if preset == "custom":
        return _Options()
    p = _PRESETS[preset]
    return _Options(zipf=p.zipf, degree_skew=p.degree_skew, src_skew=p.src_skew, reverse=p.reverse)


def _fields_help(custom: bool) -> str:
    return ", ".join(f"{k} ({v[1]})" for k, v in _FIELDS.items() if custom or not v[2])


def _parse(spec: str) -> tuple[str, dict[str, object]]:
    text = spec.strip()
    if text.startswith("synthetic:"):
        text = text[len("synthetic:") :]
    parts = [p.strip() for p in text.split(",")]
    if not parts[0] or "=" in parts[0]:
        raise SyntheticSpecError(
            f"synthetic spec {spec!r} must start with a preset, one of: {', '.join(PRESETS)} "
            f"(e.g. 'aifb,scale=0.5' or 'custom,nodes=10000,edges=80000')"
        )
    preset = parts[0].lower()
    if preset not in PRESETS:
        raise SyntheticSpecError(f"unknown synthetic preset {parts[0]!r} in {spec!r}; presets: {', '.join(PRESETS)}")
    given: dict[str, object] = {}
    for part in parts[1:]:
        key, eq, raw = (s.strip() for s in part.partition("="))
        if not eq or not key:
            raise SyntheticSpecError(f"synthetic spec {spec!r}: expected key=value, got {part!r}")
        if key not in _FIELDS or (_FIELDS[key][2] and preset != "custom"):
            where = "" if key not in _FIELDS else f" (only 'custom' takes it; preset {preset!r} fixes it)"
            raise SyntheticSpecError(
                f"synthetic spec {spec!r}: unknown field {key!r}{where}; valid fields for {preset!r}: "
                f"{_fields_help(preset == 'custom')}"
            )
        if key in given:
            raise SyntheticSpecError(f"synthetic spec {spec!r}: field {key!r} given twice")
        parser, accepts, _ = _FIELDS[key]
        try:
            given[key] = parser(raw)
        except ValueError:
            raise SyntheticSpecError(
                f"synthetic spec {spec!r}: field {key!r} must be {accepts}, got {raw!r}"
            ) from None
    return preset, given


def _canonical_name(preset: str, given: Mapping[str, object]) -> str:
    """``synthetic:<preset>`` plus the non-default fields in a fixed order: equal graphs, equal names."""
    defaults, parts = _defaults(preset), [preset]
    for key in _FIELDS:
        if key in given and given[key] != getattr(defaults, key):
            v = given[key]
            parts.append(f"{key}={int(v) if isinstance(v, bool) else v}")
    return "synthetic:" + ",".join(parts)


def _scaled_nodes(num_nodes: Mapping[str, int], scale: float) -> dict[str, int]:
    return {t: max(1, round(n * scale)) for t, n in num_nodes.items()}


def _preset_plan(preset: str, given: Mapping[str, object]) -> _Plan:
    p, o = _PRESETS[preset], replace(_defaults(preset), **given)
    rels = [
        # A preset's per-relation skews hold unless the spec sets a skew for all relations.
        _Rel(s, name, d, round(size * o.scale),
             o.src_skew if "src_skew" in given or s_skew is None else s_skew,
             o.degree_skew if "degree_skew" in given or d_skew is None else d_skew)
        for s, name, d, size, s_skew, d_skew in _preset_relations(preset, p, o.zipf)
    ]
    return _Plan(_canonical_name(preset, given), _scaled_nodes(p.num_nodes, o.scale), tuple(rels), seed=o.seed,
                 multi=o.multi, reverse_prefix=p.reverse_prefix if o.reverse else None, cover=True)


def _custom_plan(given: Mapping[str, object], spec: str) -> _Plan:
    o = replace(_Options(), **given)
    if o.nodes < o.ntypes:
        raise SyntheticSpecError(f"synthetic spec {spec!r}: nodes={o.nodes} must be >= ntypes={o.ntypes}")
    if o.reverse and (o.rels % 2 or o.edges % 2):
        raise SyntheticSpecError(
            f"synthetic spec {spec!r}: with reverse=1, rels and edges count both directions and must be even"
        )
    if o.rels == 0 and o.edges > 0:
        raise SyntheticSpecError(f"synthetic spec {spec!r}: edges={o.edges} need rels >= 1")
    fwd = 2 if o.reverse else 1
    num_nodes = _split_types(o.nodes, [f"t{i}" for i in range(o.ntypes)])
    sizes = _zipf_sizes(o.edges // fwd, o.rels // fwd, o.zipf)
    schema = _rng(0, _SCHEMA, f"custom:{o.nodes}:{o.ntypes}:{o.rels}")
    placed = _place(schema, num_nodes, sizes, [f"r{i}" for i in range(o.rels // fwd)], set())
    relations = tuple(_Rel(s, r, d, round(n * o.scale), o.src_skew, o.degree_skew) for s, r, d, n, _, _ in placed)
    plan = _Plan(_canonical_name("custom", given), _scaled_nodes(num_nodes, o.scale), relations, seed=o.seed,
                 multi=o.multi, reverse_prefix="rev_" if o.reverse else None, cover=True)
    short = [r for r in relations if not plan.multi and r.num_edges > _capacity(plan, r)]
    if short:
        r = short[0]
        raise SyntheticSpecError(
            f"synthetic spec {spec!r}: relation {r.name!r} ({r.src} -> {r.dst}) needs {r.num_edges} edges but its "
            f"node types allow {_capacity(plan, r)} distinct pairs; use more nodes, fewer edges, or multi=1"
        )
    return plan


# --------------------------------------------------------------------------------- public API
def load_synthetic(spec: str) -> HeteroGraph:
    """Draw the graph a ``synthetic:`` spec describes (see the module docstring and :data:`PRESETS`).

    Preset node counts, edge counts and relation counts are the datasets README's; ``scale``
    multiplies node counts (each type keeps at least one node) and edge counts. At small scales
    a preset relation may need more distinct pairs than its shrunken types have; it is then
    clipped to all of them (``multi=1`` avoids that). ``custom`` raises instead.

    Raises:
        SyntheticSpecError: a malformed spec; the message names the field and the valid ones.

    Example:
        >>> g = load_synthetic("custom,nodes=500,edges=3000,ntypes=2,rels=4,seed=7")
        >>> g.num_nodes(), g.num_edges(), g.num_rels
        (500, 3000, 4)
        >>> load_synthetic("aifb,scael=2")  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        SyntheticSpecError: synthetic spec 'aifb,scael=2': unknown field 'scael'; valid fields for 'aifb': ...
    """
    preset, given = _parse(spec)
    plan = _custom_plan(given, spec) if preset == "custom" else _preset_plan(preset, given)
    return _build(plan)


def describe_presets() -> list[str]:
    """One line per preset (name, counts, what it imitates), for ``--help`` and ``rgtune`` listings."""
    lines = []
    for key, p in _PRESETS.items():
        lines.append(
            f"{key:<9} {sum(p.num_nodes.values()):>10,} nodes {p.edges:>11,} edges {p.rels:>4} relations "
            f"{len(p.num_nodes):>2} node types  {p.about}"
        )
    o = _Options()
    lines.append(f"custom    nodes={o.nodes}, edges={o.edges}, ntypes={o.ntypes}, rels={o.rels}, zipf={o.zipf}, "
                 f"degree_skew={o.degree_skew}, src_skew={o.src_skew}, reverse=0 (the defaults)")
    lines.append("          every preset also takes scale=, seed=, reverse=, multi=, zipf=, degree_skew=, src_skew=")
    return lines


def random_graph(
    num_nodes: int | Sequence[int] | Mapping[str, int] = (20, 30),
    num_relations: int = 3,
    num_edges: int = 100,
    *,
    relations: Sequence[tuple[str, str, str]] | None = None,
    zipf: float = 1.0,
    degree_skew: float = 0.0,
    src_skew: float = 0.0,
    reverse: bool = False,
    multi: bool = True,
    empty_relations: int = 0,
    isolated_nodes: int = 0,
    source_only_ntypes: int = 0,
    hub_in_degree: int = 0,
    seed: int = 0,
    name: str = "random",
) -> HeteroGraph:
    """A random heterograph with explicit knobs, for tests that need corner cases on demand.

    Args:
        num_nodes: node counts; an int or a sequence names the types ``n0, n1, ...``.
        num_relations: how many relations to make (names ``r0, r1, ...``), unless ``relations``
            gives the canonical edge types itself.
        num_edges: forward edges in all, spread over the non-empty relations by a Zipf law
            (``zipf``), before ``reverse`` and the hub's edges. Without ``multi`` a relation gets
            at most as many edges as it has distinct node pairs.
        degree_skew, src_skew: power-law exponents of destination / source popularity (0: uniform).
        reverse: add a ``rev_<name>`` relation mirroring every relation.
        multi: allow duplicate ``(src, dst)`` pairs within a relation.
        empty_relations: the last this-many relations get no edges.
        isolated_nodes: in every node type, this many nodes touch no edge (a type with fewer
            nodes has none that can).
        source_only_ntypes: the last this-many node types (sorted) are never a destination
            (only with generated relations and without ``reverse``).
        hub_in_degree: the most popular destination of the first relation gets at least this
            many in-edges (from distinct sources unless ``multi``).
        seed: the seed; the same arguments give the same graph.

    Example:
        >>> g = random_graph({"a": 5, "b": 8}, relations=[("a", "x", "b"), ("b", "y", "b")], num_edges=12, seed=1)
        >>> g.canonical_etypes, g.num_edges()
        ([('a', 'x', 'b'), ('b', 'y', 'b')], 12)
    """
    counts = _node_counts(num_nodes)
    if min([num_edges, empty_relations, isolated_nodes, source_only_ntypes, hub_in_degree, seed]) < 0:
        raise ValueError(
            "num_edges, empty_relations, isolated_nodes, source_only_ntypes, hub_in_degree and seed must be >= 0"
        )
    if relations is None:
        if source_only_ntypes and (reverse or source_only_ntypes >= len(counts)):
            raise ValueError("source_only_ntypes needs reverse=False and at least one other node type")
        types = sorted(counts)
        rng = _rng(seed, _SCHEMA, "random_graph")
        dst_types = types[: len(types) - source_only_ntypes]
        relations = [(types[int(rng.integers(len(types)))], f"r{i}", dst_types[int(rng.integers(len(dst_types)))])
                     for i in range(num_relations)]
    elif source_only_ntypes:
        raise ValueError(
            "source_only_ntypes applies to generated relations; with relations=, leave a type out of every dst"
        )
    if len(set(map(tuple, relations))) < len(relations):
        raise ValueError(f"relations repeat a canonical edge type: {list(relations)}")
    unknown = sorted({t for s, _, d in relations for t in (s, d)} - set(counts))
    if unknown:
        raise ValueError(f"relations name node types {unknown} that num_nodes does not have ({sorted(counts)})")
    if empty_relations > len(relations):
        raise ValueError(f"empty_relations={empty_relations} but there are only {len(relations)} relations")
    sizes = list(_zipf_sizes(num_edges, len(relations) - empty_relations, zipf)) + [0] * empty_relations
    plan = _Plan(
        name, counts,
        tuple(_Rel(s, r, d, int(n), src_skew, degree_skew) for (s, r, d), n in zip(relations, sizes)),
        seed=seed, multi=multi, reverse_prefix="rev_" if reverse else None,
        isolated=isolated_nodes, hub_in_degree=hub_in_degree,
    )
    if hub_in_degree and not plan.relations:
        raise ValueError("hub_in_degree needs at least one relation")
    return _build(plan)


def _node_counts(num_nodes: int | Sequence[int] | Mapping[str, int]) -> dict[str, int]:
    if isinstance(num_nodes, Mapping):
        counts = {str(t): int(n) for t, n in num_nodes.items()}
    elif isinstance(num_nodes, int):
        counts = {"n0": num_nodes}
    else:
        counts = {f"n{i}": int(n) for i, n in enumerate(num_nodes)}
    if not counts or min(counts.values()) < 0:
        raise ValueError(f"num_nodes needs at least one node type and no negative counts, got {num_nodes!r}")
    return counts

