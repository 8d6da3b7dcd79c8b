"""The dataset registry and :func:`load_dataset`, the one entry point for graphs by name.

Names: ``aifb``, ``mutag``, ``bgs``, ``am`` (RDF entity classification; two constructions),
``ogbn-mag`` (through the ``ogb`` package) and ``synthetic:<spec>`` (generated, see
:mod:`rgtune.data.synthetic`).

Raw files are looked up under the data root: the ``root`` argument, else ``$RGTUNE_DATA_DIR``,
else the per-user cache (``~/.cache/rgtune/datasets``), one folder per dataset with the
upstream file names (``aifb/aifb_stripped.nt.gz``, ``aifb/trainingSet.tsv``, ...). Missing files
are downloaded when possible. Processed graphs are cached in ``$RGTUNE_CACHE_DIR`` (else
``~/.cache/rgtune/processed``).

Example:
    >>> sorted(list_datasets())
    ['aifb', 'am', 'bgs', 'mutag', 'ogbn-mag', 'synthetic:<spec>']
    >>> g = load_dataset("aifb")  # the raw files from --data-dir, $RGTUNE_DATA_DIR or the user cache
    >>> g.num_nodes(), g.num_edges(), g.num_rels, g.task.category
    (7262, 48810, 104, 'Personen')
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rgtune.data.stored import is_stored_name, load_stored
from rgtune.data.errors import DatasetError, UnknownDatasetError
from rgtune.data.graph import HeteroGraph

__all__ = ["DatasetInfo", "DATASETS", "SYNTHETIC_PREFIX", "list_datasets", "dataset_info", "load_dataset"]

SYNTHETIC_PREFIX = "synthetic:"


@dataclass(frozen=True)
class DatasetInfo:
    """What the registry knows of a dataset before loading it."""

    name: str
    kind: Literal["rdf", "ogb", "synthetic"]
    description: str  # one line, for `rgtune datasets`


DATASETS: dict[str, DatasetInfo] = {
    i.name: i
    for i in (
        DatasetInfo(
            "aifb", "rdf", "AIFB institute (RDF): 7,262 nodes, 48,810 edges, 104 relations; Personen, 4 classes, 140/36"
        ),
        DatasetInfo(
            "mutag", "rdf", "MUTAG carcinogenesis (RDF): 27,163 nodes, 148,100 edges, 50 relations; d, 2 classes, 272/68"
        ),
        DatasetInfo(
            "bgs", "rdf", "British Geological Survey (RDF, downloaded): 94,806 nodes, 672,884 edges; rock units, 2 classes"
        ),
        DatasetInfo("am", "rdf", "Amsterdam Museum (RDF, downloaded): 881,680 nodes, 5,668,682 edges; proxy, 11 classes"),
        DatasetInfo(
            "ogbn-mag",
            "ogb",
            "OGB MAG (ogb package, ~0.4 GB download): 1,939,743 nodes, 21,111,007 edges, 4 relations; "
            "128-d paper features, 349 classes",
        ),
        DatasetInfo(
            "synthetic:<spec>", "synthetic", "a generated graph; <spec> as rgtune.data.synthetic.load_synthetic reads it"
        ),
    )
}
_ALIASES = {"ogbn_mag": "ogbn-mag", "mag": "ogbn-mag"}


def list_datasets() -> dict[str, str]:
    """Dataset name -> one-line description, in registry order."""
    return {name: info.description for name, info in DATASETS.items()}


def dataset_info(name: str) -> DatasetInfo:
    """The registry entry of ``name`` (any ``synthetic:<spec>`` maps to the synthetic entry)."""
    return DATASETS[_canonical(name)]


def _canonical(name: str) -> str:
    if name.startswith(SYNTHETIC_PREFIX):
        return f"{SYNTHETIC_PREFIX}<spec>"
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key in DATASETS and DATASETS[key].kind != "synthetic":
        return key
    known = [n for n in DATASETS]
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownDatasetError(f"unknown dataset {name!r}.{hint} Known datasets: {', '.join(known)}")


def load_dataset(
    name: str,
    root: str | Path | None = None,
    *,
    construction: Literal["typed", "untyped"] = "typed",
    features: bool | None = None,
    download: bool = True,
    use_cache: bool = True,
) -> HeteroGraph:
    """Load a dataset by name as a :class:`HeteroGraph` (with its :class:`NodeTask` when it has one).

    Args:
        name: a name of :func:`list_datasets` (case-insensitive), ``synthetic:<spec>``, or ``graph:<content hash>``
            (a graph stored by :func:`rgtune.data.stored.store_graph`: ``rgtune.tune(model, graph)``, ``tune --graph``).
        root: the data root (default ``$RGTUNE_DATA_DIR``, else the per-user cache).
        construction: RDF datasets only: ``"typed"`` (DGL's heterograph) or ``"untyped"``
            (PyG's ``Entities`` graph).
        features: include the dataset's own node features (ogbn-mag papers); ``None`` or
            ``True`` include them, ``False`` skips them. The RDF datasets have none.
        download: fetch missing raw files from the canonical URL.
        use_cache: read and write the processed-graph cache.

    Raises:
        UnknownDatasetError: the name is not known (the message lists the known ones).
        DatasetNotFoundError: files are missing and could not be downloaded.
        CorruptDatasetError: a raw file is damaged (names the file and line).
    """
    if is_stored_name(name):  # a user's own graph, stored by content for the tuner's worker
        return load_stored(name)
    key = _canonical(name)
    kind = DATASETS[key].kind
    if kind != "rdf" and construction != "typed":
        raise DatasetError(f"construction={construction!r} applies to the RDF datasets only, not to {name!r}")
    if kind == "synthetic":
        from rgtune.data.synthetic import load_synthetic  # written separately; imported on demand

        return load_synthetic(name[len(SYNTHETIC_PREFIX) :])
    if kind == "ogb":
        from rgtune.data.ogb_mag import load_ogbn_mag

        return load_ogbn_mag(root, features=features is not False, download=download)
    from rgtune.data.rdf import load_rdf

    return load_rdf(key, root, construction=construction, download=download, use_cache=use_cache)
