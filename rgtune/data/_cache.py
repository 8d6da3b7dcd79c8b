"""Where datasets live, and the processed-graph cache.

* Raw data root: the ``root`` argument, else ``$RGTUNE_DATA_DIR``, else ``<user cache>/datasets``.
* Processed graphs: ``$RGTUNE_CACHE_DIR``, else ``<user cache>/processed``; never the data root,
  which may be read-only or shared.

A processed graph is one ``torch.save`` file named by a key that hashes the raw files' contents,
the loader version and the construction, so editing a raw file or the loader invalidates it.
Files are written to a temporary name and ``os.replace``-d into place, so a reader never sees
half a file; one that fails to load anyway (disk trouble, an older format) is ignored and rebuilt.

Derived structures of a graph (its edge layouts, CSR, unique pairs: seconds each on a graph of tens
of millions of edges) are cached the same way under ``derived/`` in the same folder, one file per
structure, named by the graph's ``content_hash``, the structure and its format version
(:func:`load_derived`, :func:`save_derived`), so a changed graph or format never reads a stale file.

Example:
    >>> import torch, tempfile
    >>> from rgtune.data.graph import HeteroGraph
    >>> where = Path(tempfile.mkdtemp())
    >>> g = HeteroGraph({"a": 2}, {("a", "r", "a"): (torch.tensor([0]), torch.tensor([1]))}, name="tiny")
    >>> key = cache_key("tiny", "typed", {})
    >>> save_graph(key, g, where)
    >>> load_graph(key, where).content_hash == g.content_hash
    True
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

import torch

from rgtune.data.graph import HeteroGraph, NodeTask

__all__ = [
    "LOADER_VERSION",
    "user_cache_dir",
    "data_root",
    "processed_dir",
    "file_sha256",
    "cache_key",
    "load_graph",
    "save_graph",
    "derived_path",
    "load_derived",
    "save_derived",
]

log = logging.getLogger("rgtune.data")

#: Bump when a loader changes what it builds: every processed graph is rebuilt.
LOADER_VERSION = 1
_FORMAT = "rgtune-processed-graph"
_DERIVED_FORMAT = "rgtune-derived-structure"


def user_cache_dir() -> Path:
    """The per-user cache folder of rgtune (``$XDG_CACHE_HOME/rgtune`` or the platform's)."""
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "rgtune"


def data_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding one sub-folder of raw files per dataset."""
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get("RGTUNE_DATA_DIR")
    if env:
        return Path(env).expanduser()
    return user_cache_dir() / "datasets"


def processed_dir() -> Path:
    """The folder of processed graphs."""
    env = os.environ.get("RGTUNE_CACHE_DIR")
    return Path(env).expanduser() if env else user_cache_dir() / "processed"


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def cache_key(name: str, construction: str, raw_files: Mapping[str, Path]) -> str:
    """A file-name-safe key: dataset, construction, loader version and each raw file's sha256."""
    h = hashlib.sha256(f"{_FORMAT}\0{LOADER_VERSION}\0{name}\0{construction}\0".encode())
    for label in sorted(raw_files):
        h.update(f"{label}\0{file_sha256(raw_files[label])}\0".encode())
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    return f"{safe}-{construction}-{h.hexdigest()[:20]}"


def _path(key: str, directory: Path | None) -> Path:
    return (directory if directory is not None else processed_dir()) / f"{key}.pt"


def _to_payload(key: str, g: HeteroGraph) -> dict[str, Any]:
    task = g.task
    return {
        "format": _FORMAT,
        "version": LOADER_VERSION,
        "key": key,
        "name": g.name,
        "num_nodes": {t: g.num_nodes(t) for t in g.ntypes},
        "etypes": [list(c) for c in g.canonical_etypes],
        "edges": [list(g.edges(c)) for c in g.canonical_etypes],
        "features": dict(g.features),
        "task": None
        if task is None
        else {
            "category": task.category,
            "num_classes": task.num_classes,
            "train_idx": task.train_idx,
            "train_labels": task.train_labels,
            "test_idx": task.test_idx,
            "test_labels": task.test_labels,
        },
    }


def _from_payload(key: str, p: Mapping[str, Any]) -> HeteroGraph:
    if p.get("format") != _FORMAT or p.get("version") != LOADER_VERSION or p.get("key") != key:
        raise ValueError("not a processed graph of this loader version and key")
    edges = {tuple(c): (s, d) for c, (s, d) in zip(p["etypes"], p["edges"])}
    task = NodeTask(**p["task"]) if p["task"] is not None else None
    return HeteroGraph(p["num_nodes"], edges, name=p["name"], features=p["features"], task=task)  # type: ignore[arg-type]


def load_graph(key: str, directory: Path | None = None) -> HeteroGraph | None:
    """The cached graph of ``key`` (in ``directory``, default :func:`processed_dir`), or None
    when absent or unreadable (the caller then rebuilds it)."""
    path = _path(key, directory)
    if not path.is_file():
        return None
    try:
        # weights_only: a cache file is data, never code, even if someone planted one.
        return _from_payload(key, torch.load(path, map_location="cpu", weights_only=True))
    except Exception as e:  # noqa: BLE001 - any damage means "rebuild", never "fail"
        log.warning("ignoring unreadable processed graph %s (%s: %s); rebuilding it", path, type(e).__name__, e)
        return None


def save_graph(key: str, g: HeteroGraph, directory: Path | None = None) -> None:
    """Write ``g`` under ``key`` atomically; a cache that cannot be written only costs a warning."""
    _write_atomic(_path(key, directory), _to_payload(key, g), "processed graph")


def _write_atomic(path: Path, payload: Mapping[str, Any], what: str) -> None:
    """``torch.save`` ``payload`` to a temporary file beside ``path`` and rename it into place, so a
    reader sees the old file or the whole new one; an unwritable cache is only a warning."""
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            torch.save(dict(payload), f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; a cache may be shared read-only
        os.replace(tmp, path)
        tmp = None
    except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
        log.warning("could not write the %s to %s (%s); continuing without the cache", what, path, e)
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def derived_path(graph_hash: str, structure: str, version: int, directory: Path | None = None) -> Path:
    """The file of one derived ``structure`` (format ``version``) of the graph whose ``content_hash``
    is ``graph_hash``.

    Example:
        >>> derived_path("0123456789abcdef", "layout-dst", 1, Path("cache")).as_posix()
        'cache/derived/0123456789abcdef-layout-dst-v1.pt'
    """
    for label, value in (("graph_hash", graph_hash), ("structure", structure)):
        if not value or not all(c.isalnum() or c in "-_" for c in value):
            raise ValueError(f"{label} must be a non-empty name of letters, digits, '-' and '_', got {value!r}")
    folder = (directory if directory is not None else processed_dir()) / "derived"
    return folder / f"{graph_hash}-{structure}-v{version}.pt"


def load_derived(
    graph_hash: str, structure: str, version: int, directory: Path | None = None
) -> dict[str, torch.Tensor] | None:
    """The cached tensors of a derived structure, or None when absent or unreadable (then the caller
    builds and saves it).

    The file is memory-mapped: the tensors are read from the page cache on first touch, and the
    processes of one machine (tuner workers) that load the same structure share its pages.
    """
    path = derived_path(graph_hash, structure, version, directory)
    if not path.is_file():
        return None
    try:
        p = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        if (p.get("format"), p.get("structure"), p.get("version"), p.get("graph")) != (
            _DERIVED_FORMAT, structure, version, graph_hash
        ):
            raise ValueError(f"not the {structure} v{version} of graph {graph_hash}")
        tensors = p["tensors"]
        if not isinstance(tensors, dict) or not all(isinstance(t, torch.Tensor) for t in tensors.values()):
            raise ValueError("the payload holds no tensors")
        return tensors
    except Exception as e:  # noqa: BLE001 - any damage means "rebuild", never "fail"
        log.warning("ignoring unreadable derived structure %s (%s: %s); rebuilding it", path, type(e).__name__, e)
        return None


def save_derived(
    graph_hash: str, structure: str, version: int, tensors: Mapping[str, torch.Tensor], directory: Path | None = None
) -> None:
    """Write a derived structure's tensors atomically (see :func:`load_derived`).

    Example:
        >>> where = Path(tempfile.mkdtemp())
        >>> save_derived("0123456789abcdef", "demo", 1, {"x": torch.arange(3)}, where)
        >>> load_derived("0123456789abcdef", "demo", 1, where)["x"].tolist()
        [0, 1, 2]
        >>> load_derived("0123456789abcdef", "demo", 2, where) is None  # another format version
        True
    """
    payload = {"format": _DERIVED_FORMAT, "structure": structure, "version": version, "graph": graph_hash,
               # torch.save writes a view's whole storage: a slice of a bigger tensor is copied out first
               "tensors": {k: v if v.is_contiguous() and v.untyped_storage().nbytes() == v.numel() * v.element_size()
                           else v.contiguous().clone() for k, v in tensors.items()}}
    _write_atomic(derived_path(graph_hash, structure, version, directory), payload, f"{structure} structure")
