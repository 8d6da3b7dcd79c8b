"""Per-dataset rules of the typed RDF construction (what DGL's RDF datasets do, restated).

For each dataset: which IRIs are entities and what node type and key they get (from the IRI's
structure, not ``rdf:type``), which predicates become relations and under what name, which
predicates are the classification targets (dropped: they would leak the labels), and which
TSV columns hold the labelled entity and its label.

An entity rule returns ``(node type, key)``, ``(None, key)`` when the type is decided per triple
(MUTAG), or ``None`` to drop every triple that mentions the term. A relation rule returns the
relation name or ``None`` to drop the predicate.

Example:
    >>> from rgtune.data._ntriples import Term
    >>> AIFB.entity(Term("U", "http://www.aifb.uni-karlsruhe.de/Personen/viewPersonOWL/id1instance"))
    ('Personen', 'id1instance')
    >>> AIFB.relation("http://swrc.ontoware.org/ontology#author"), AIFB.relation("http://swrc.ontoware.org/ontology#employs")
    ('ontology#author', None)
    >>> MUTAG.entity(Term("U", "http://dl-learner.org/carcinogenesis#d1_2")), MUTAG.entity(Term("L", "0.5", XSD + "double"))
    (('d', 'd1_2'), ('_Literal', '0.5'))
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from rgtune.data._ntriples import Term
from rgtune.data.errors import DatasetError

__all__ = ["RDFRules", "AIFB", "MUTAG", "BGS", "AM", "RULES", "UNDETERMINED", "TypedTriples", "XSD"]

XSD = "http://www.w3.org/2001/XMLSchema#"
UNDETERMINED = -1  # node-type id of an entity whose type the triple decides (MUTAG)
LITERAL_TYPE = "_Literal"


@dataclass
class TypedTriples:
    """The kept triples with their node-type ids, for a dataset's per-triple fix-up."""

    scls: np.ndarray  # node-type id of each subject (UNDETERMINED allowed before the fix-up)
    ocls: np.ndarray
    rel: np.ndarray  # relation id (index into ``relations``)
    p: np.ndarray  # predicate term id
    terms: list[Term]
    relations: list[str]
    classes: dict[str, int]

    def class_id(self, name: str) -> int:
        return self.classes.setdefault(name, len(self.classes))

    def predicate_mask(self, test: Callable[[str], bool]) -> np.ndarray:
        """Per triple: whether ``test`` holds for its predicate IRI (evaluated once per predicate)."""
        uniq, inv = np.unique(self.p, return_inverse=True)
        per_pred = np.array([test(self.terms[int(x)].value) for x in uniq], dtype=bool)
        return per_pred[inv] if len(uniq) else np.zeros(0, dtype=bool)


@dataclass(frozen=True)
class RDFRules:
    """How one RDF dataset becomes a typed heterograph and a node-classification task."""

    name: str
    category: str  # node type of the labelled entities
    entity: Callable[[Term], tuple[str | None, str] | None]
    relation: Callable[[str], str | None]
    sample_column: int  # column of the entity IRI in trainingSet.tsv / testSet.tsv
    label_column: int
    fixup: Callable[[TypedTriples], None] | None = None
    tgz_sha256: str | None = None  # of https://data.dgl.ai/dataset/<name>.tgz, when known


# ------------------------------------------------------------------------------------ AIFB
_AIFB_ENTITY = "http://www.aifb.uni-karlsruhe.de/"
_SWRC = "http://swrc.ontoware.org/"
_AIFB_TARGETS = frozenset({_SWRC + "ontology#employs", _SWRC + "ontology#affiliation"})


def _aifb_entity(t: Term) -> tuple[str | None, str] | None:
    if t.kind == "L":
        return LITERAL_TYPE, t.value
    if t.kind == "U" and t.value.startswith(_AIFB_ENTITY):
        parts = t.value.split("/")  # http: / '' / host / <type> / <view> / <id>
        if len(parts) > 5:
            return parts[3], parts[5]
    return None


def _aifb_relation(iri: str) -> str | None:
    if iri in _AIFB_TARGETS:
        return None
    if iri.startswith(_SWRC):
        return iri.split("/")[3]  # "ontology#author"
    return iri.split("/")[-1]  # "22-rdf-syntax-ns#type"


# ----------------------------------------------------------------------------------- MUTAG
_CARCINOGENESIS = "http://dl-learner.org/carcinogenesis#"
_MUTAG_TARGET = _CARCINOGENESIS + "isMutagenic"
_COMPOUND = re.compile("d[0-9]")
_BOND = re.compile("bond[0-9]")


def _mutag_entity(t: Term) -> tuple[str | None, str] | None:
    if t.kind == "L":
        return LITERAL_TYPE, t.value
    if t.kind == "U" and t.value.startswith(_CARCINOGENESIS):
        local = t.value[len(_CARCINOGENESIS) :]
        kind = "d" if _COMPOUND.match(local) else "bond" if _BOND.match(local) else None
        return kind, local
    return None


def _mutag_relation(iri: str) -> str | None:
    if iri == _MUTAG_TARGET:
        return None
    if iri.startswith(_CARCINOGENESIS):
        return iri[len(_CARCINOGENESIS) :]
    return iri.split("/")[-1]


def _mutag_fixup(k: TypedTriples) -> None:
    # Triples of a schema predicate (rdf:type, rdfs:subClassOf, ...) make their object, and an
    # untyped subject, a SCHEMA node; any other untyped object is typed by its relation's name.
    schema_pred = k.predicate_mask(lambda iri: not iri.startswith(_CARCINOGENESIS))
    schema = k.class_id("SCHEMA")
    k.ocls[schema_pred] = schema
    k.scls[schema_pred & (k.scls == UNDETERMINED)] = schema
    untyped = k.ocls == UNDETERMINED
    if untyped.any():
        by_relation = np.array([k.class_id(r) for r in k.relations], dtype=np.int64)
        k.ocls[untyped] = by_relation[k.rel[untyped]]


# ------------------------------------------------------------------------------------- BGS
_BGS_ENTITY = "http://data.bgs.ac.uk/"
_BGS_STATUS = "http://data.bgs.ac.uk/ref/CurrentStatus"
_BGS_RELATION = "http://data.bgs.ac.uk/ref"
_BGS_TARGET = "http://data.bgs.ac.uk/ref/Lexicon/hasLithogenesis"


def _bgs_entity(t: Term) -> tuple[str | None, str] | None:
    # Literals, blank nodes and the CURRENT/DEPRECATED status terms are not entities.
    if t.kind != "U" or t.value.startswith(_BGS_STATUS) or not t.value.startswith(_BGS_ENTITY):
        return None
    parts = t.value.split("/")  # http: / '' / host / (ref|id) / <major> / <minor> / <instance>
    if len(parts) != 7:
        return None
    return f"{parts[4]}/{parts[5]}", parts[6]


def _bgs_relation(iri: str) -> str | None:
    if iri == _BGS_TARGET:
        return None
    if iri.startswith(_BGS_RELATION):
        parts = iri.split("/")
        # DGL drops shorter IRIs and asserts on longer ones; both are dropped here.
        return f"{parts[4]}/{parts[5]}" if len(parts) == 6 else None
    return iri.replace(".", "_")


# -------------------------------------------------------------------------------------- AM
_AM_ENTITY = "http://purl.org/collections/nl/am/"
_AM_TARGETS = frozenset({_AM_ENTITY + "objectCategory", _AM_ENTITY + "material"})


def _am_entity(t: Term) -> tuple[str | None, str] | None:
    if t.kind == "L":
        return None
    if t.kind == "B":
        return "_BNode", t.value  # keyed by the file's label: deterministic, unlike rdflib's
    if t.value.startswith(_AM_ENTITY):
        parts = t.value.split("/")
        if len(parts) != 7:
            return None  # DGL asserts here; such IRIs do not occur in AM
        head = parts[6].split("-")
        if len(head) == 2:
            return head[0], head[1]  # "<type>-<id>"
        return "TYPE", parts[6]
    return None


def _am_relation(iri: str) -> str | None:
    if iri in _AM_TARGETS:
        return None
    if iri.startswith(_AM_ENTITY):
        parts = iri.split("/")
        return parts[6] if len(parts) == 7 else None
    return iri.replace(".", "_")


# -------------------------------------------------------------------------------- registry
AIFB = RDFRules(
    "aifb",
    "Personen",
    _aifb_entity,
    _aifb_relation,
    sample_column=0,
    label_column=2,
    tgz_sha256="11823f0265dbc4928c055303f6dd5520935c3b9f19de402928c921da37482690",
)
MUTAG = RDFRules(
    "mutag",
    "d",
    _mutag_entity,
    _mutag_relation,
    sample_column=0,
    label_column=2,
    fixup=_mutag_fixup,
    tgz_sha256="53cc2fbbc278d0d70c00353c6885e7b19d0ee8f5bd5d1da8c84ff9d8aee01c2a",
)
# No published sha256 is known for bgs.tgz / am.tgz: their downloads are checked by member names.
BGS = RDFRules("bgs", "Lexicon/NamedRockUnit", _bgs_entity, _bgs_relation, sample_column=1, label_column=2)
AM = RDFRules("am", "proxy", _am_entity, _am_relation, sample_column=0, label_column=2)

RULES: dict[str, RDFRules] = {r.name: r for r in (AIFB, MUTAG, BGS, AM)}


def check_resolved(k: TypedTriples, dataset: str) -> None:
    """Every kept triple must have typed ends after the fix-up (DGL asserts the same)."""
    bad = np.flatnonzero((k.scls == UNDETERMINED) | (k.ocls == UNDETERMINED))
    if bad.size:
        raise DatasetError(f"dataset {dataset!r}: {bad.size} triples have an entity whose node type no rule decides")
