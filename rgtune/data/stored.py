"""Graphs that are not datasets: saved to a file, or stored by content so that a tuner's worker loads them.

A user's own graph (a :class:`HeteroGraph`, or one converted from PyG or DGL) has no dataset name for the
tuner's measurement worker, a fresh process, to load it by. :func:`store_graph` writes it once into the
processed-graph cache under its ``content_hash`` and returns the name ``graph:<content_hash>``, which
:func:`~rgtune.data.datasets.load_dataset` loads in any process of this user (``$RGTUNE_CACHE_DIR``): the
same graph, checked by its hash. :func:`save_graph_file` and :func:`load_graph_file` do the same with a
file of the user's choosing (``tune --graph FILE``).

Either file holds tensors, numbers and strings only, read with ``torch.load(weights_only=True)``: loading
a graph never runs code from the file.

Example:
    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> from rgtune.data.graph import HeteroGraph
    >>> g = HeteroGraph({"a": 3}, {("a", "r", "a"): (torch.tensor([0, 1]), torch.tensor([1, 2]))}, name="mine")
    >>> folder = Path(tempfile.mkdtemp())
    >>> name = store_graph(g, folder)
    >>> name == f"graph:{g.content_hash}"
    True
    >>> load_stored(name, folder).content_hash == g.content_hash
    True
    >>> save_graph_file(g, folder / "mine.pt")
    >>> load_graph_file(folder / "mine.pt").name
    'mine'
"""

from __future__ import annotations

from pathlib import Path

import torch

from rgtune.data._cache import _from_payload, _to_payload, _write_atomic, processed_dir
from rgtune.data.errors import DatasetError, DatasetNotFoundError
from rgtune.data.graph import HeteroGraph

__all__ = ["STORED_PREFIX", "store_graph", "load_stored", "is_stored_name", "save_graph_file", "load_graph_file"]

#: the dataset name of a stored graph: ``graph:<content_hash>``
STORED_PREFIX = "graph:"
_FILE_KEY = "graph-file"


def _stored_path(content_hash: str, directory: Path | None) -> Path:
    return (directory if directory is not None else processed_dir()) / "graphs" / f"{content_hash}.pt"


def is_stored_name(name: str) -> bool:
    """Whether ``name`` names a stored graph (``graph:<content_hash>``)."""
    return isinstance(name, str) and name.startswith(STORED_PREFIX)


def store_graph(graph: HeteroGraph, directory: Path | None = None) -> str:
    """Write ``graph`` under its content hash (once: an existing file is kept) and return its dataset name."""
    path = _stored_path(graph.content_hash, directory)
    if not path.is_file():
        _write_atomic(path, _to_payload(graph.content_hash, graph), "stored graph")
        if not path.is_file():  # an unwritable cache: the worker could not load it, say so now
            raise DatasetError(f"could not store graph {graph.name!r} in {path.parent} for the tuner's worker; "
                               "set RGTUNE_CACHE_DIR to a writable folder")
    return STORED_PREFIX + graph.content_hash


def load_stored(name: str, directory: Path | None = None) -> HeteroGraph:
    """The graph stored as ``name`` (``graph:<content_hash>``), checked against its hash."""
    content_hash = name[len(STORED_PREFIX):]
    if not content_hash or not all(c in "0123456789abcdef" for c in content_hash):
        raise DatasetNotFoundError(f"{name!r} is not a stored graph's name (graph:<content hash>)")
    path = _stored_path(content_hash, directory)
    if not path.is_file():
        raise DatasetNotFoundError(f"no stored graph {name!r} in {path.parent} (graphs are stored by "
                                   "rgtune.tune(model, graph) and tune --graph, per user cache: RGTUNE_CACHE_DIR)")
    try:
        graph = _from_payload(content_hash, torch.load(path, map_location="cpu", weights_only=True))
    except Exception as e:  # noqa: BLE001 - damaged, or another graph's file under this name
        raise DatasetError(f"stored graph {path} does not hold the graph {name!r} ({type(e).__name__}: {e}); delete "
                           "the file and store the graph again") from None
    if graph.content_hash != content_hash:
        raise DatasetError(f"stored graph {path} does not hold the graph {name!r} (its content hash is "
                           f"{graph.content_hash}); delete the file and store the graph again")
    return graph


def save_graph_file(graph: HeteroGraph, path: str | Path) -> None:
    """Save ``graph`` (edges, node counts, features, task) to ``path``, for ``tune --graph``."""
    p = Path(path)
    p.unlink(missing_ok=True)
    _write_atomic(p, _to_payload(_FILE_KEY, graph), "graph file")
    if not p.is_file():
        raise DatasetError(f"could not write the graph file {str(p)!r} (see the warning above)")


def load_graph_file(path: str | Path) -> HeteroGraph:
    """A graph saved by :func:`save_graph_file` (tensors only: nothing in the file runs)."""
    p = Path(path)
    if not p.is_file():
        raise DatasetNotFoundError(f"no graph file {str(p)!r}")
    try:
        return _from_payload(_FILE_KEY, torch.load(p, map_location="cpu", weights_only=True))
    except Exception as e:  # noqa: BLE001 - any other file: say what is expected
        raise DatasetError(f"{str(p)!r} is not a graph saved by rgtune.data.save_graph_file ({type(e).__name__}: "
                           f"{e}); convert a PyG or DGL graph with rgtune.data.from_pyg / from_dgl and save it with "
                           "save_graph_file") from None
