"""ogbn-mag through the ``ogb`` package's library-agnostic ``NodePropPredDataset``.

The graph is OGB's, unchanged: node types ``paper``, ``author``, ``institution``,
``field_of_study``; relations ``(author, writes, paper)``, ``(author, affiliated_with,
institution)``, ``(paper, cites, paper)``, ``(paper, has_topic, field_of_study)`` with OGB's node
ids and edge order (no reverse edges); 128-dim paper features as ``graph.features["paper"]``;
the 349-class paper-venue task with OGB's time split (train and test; ``NodeTask`` has no
validation fields, so the validation split is not carried).

Files live where OGB puts them, ``<root>/ogbn_mag/`` (``raw/``, ``processed/``, ``split/``).
When they are missing OGB downloads its zip (about 0.4 GB); this happens in a temporary folder
next to it and is renamed into place only when complete. OGB's own processed pickle is the
cache (it is not duplicated into the processed-graph cache).

The data folder may be shared, and OGB reads its pickle with a bare ``torch.load``, which can run
any code a tampered file names. So rgtune reads ``processed/data_processed`` itself, with an
unpickler that can build only what OGB writes there (dicts, tuples, strings, numbers, numpy
arrays of numbers: :data:`ALLOWED_GLOBALS`), and reads the split from OGB's CSV files, never from
a ``split_dict.pt``. A file that asks for anything else fails with :class:`DatasetError` naming
it, before anything from it runs.

Example (needs the files; about 20 s and 4 GB of memory):
    >>> g = load_ogbn_mag()  # doctest: +SKIP
    >>> g.num_nodes(), g.num_edges(), g.features["paper"].shape  # doctest: +SKIP
    (1939743, 21111007, torch.Size([736389, 128]))
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import logging
import os
import pickle
import shutil
import tempfile
import urllib.error
import warnings
import zipfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from rgtune.data._cache import data_root
from rgtune.data.errors import DatasetError, DatasetNotFoundError
from rgtune.data.graph import HeteroGraph, NodeTask

__all__ = ["OGB_NAME", "ALLOWED_GLOBALS", "load_ogbn_mag", "ogb_folder", "read_processed"]

log = logging.getLogger("rgtune.data")

OGB_NAME = "ogbn-mag"
_DIR = "ogbn_mag"  # OGB's folder name: the dataset name with '-' replaced by '_'


def ogb_folder(root: str | Path | None = None) -> Path:
    return data_root(root) / _DIR


def _ogb_version() -> str:
    import pandas as pd
    import ogb.nodeproppred

    master = Path(ogb.nodeproppred.__file__).parent / "master.csv"
    return str(pd.read_csv(master, index_col=0, keep_default_na=False)[OGB_NAME]["version"])


class _LogWriter(io.TextIOBase):
    """Sends OGB's ``print`` output to the log instead of the user's terminal."""

    def write(self, s: str) -> int:
        text = s.strip("\r\n ")
        if text:
            log.info("ogb: %s", text)
        return len(s)


@contextlib.contextmanager
def _ogb_environment() -> Iterator[None]:
    # OGB prints and draws tqdm bars while processing; send both to the log.
    with warnings.catch_warnings(), contextlib.redirect_stdout(_LogWriter()), \
            contextlib.redirect_stderr(_LogWriter()):
        warnings.filterwarnings("ignore", category=FutureWarning)
        yield


#: the only globals a processed ogbn-mag file may name: how numpy pickles arrays of numbers (numpy 2
#: writes ``numpy._core``, numpy 1 ``numpy.core``; both resolve to the installed numpy's objects)
ALLOWED_GLOBALS = frozenset({
    "numpy.ndarray", "numpy.dtype",
    "numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray.scalar", "numpy.core.multiarray.scalar",
})


@functools.lru_cache(maxsize=None)
def _numpy_global(name: str) -> Any:
    module, _, attr = name.rpartition(".")
    if module.startswith("numpy.core."):  # numpy 1's name for what numpy 2 calls numpy._core
        module = "numpy._core." + module.removeprefix("numpy.core.")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return getattr(importlib.import_module(module.replace("numpy._core.", "numpy.core.")), attr)


class _DataUnpickler(pickle.Unpickler):
    """Builds containers, numbers, strings and numpy arrays; refuses every other global and torch's
    storages (OGB's file has no tensors)."""

    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if full not in ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"it names {full!r}, which a processed ogbn-mag file never contains")
        return _numpy_global(full)

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it holds torch storages, which a processed ogbn-mag file never contains")


def _check_plain(value: Any, where: str = "") -> None:
    """Only containers of strings, numbers, None and numeric numpy arrays (no object arrays)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_plain(k, where)
            _check_plain(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
    elif isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise pickle.UnpicklingError(f"{where or 'a value'} is an array of {value.dtype}, not of numbers")
    elif not isinstance(value, (str, bytes, int, float, bool, np.generic, type(None))):
        raise pickle.UnpicklingError(f"{where or 'a value'} is a {type(value).__name__}")


def read_processed(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(graph, labels)`` from OGB's ``processed/data_processed`` (a ``torch.save`` zip of a pickle of
    numpy arrays), without running anything it names; :class:`DatasetError` for any other content."""
    try:
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(names) != 1:
                raise pickle.UnpicklingError(f"it has {len(names)} data.pkl members, not 1")
            with z.open(names[0]) as f:
                data = _DataUnpickler(f).load()
        if not (isinstance(data, dict) and isinstance(data.get("graph"), dict)
                and isinstance(data.get("labels"), dict)):
            raise pickle.UnpicklingError("it is not a dict with a 'graph' dict and a 'labels' dict")
        _check_plain(data)
    except (pickle.UnpicklingError, zipfile.BadZipFile, EOFError, ValueError, TypeError, KeyError) as e:
        raise DatasetError(
            f"dataset {OGB_NAME!r}: {path} is not a processed file as OGB writes it ({e}); it may have been "
            f"tampered with or damaged, and was not loaded. Delete it to have it rebuilt from raw/, or "
            f"copy the dataset again from a source you trust") from None
    return data["graph"], data["labels"]


@functools.lru_cache(maxsize=None)
def _dataset_class() -> type:
    """OGB's ``NodePropPredDataset`` with its two ``torch.load`` calls replaced (see the module docstring)."""
    from ogb.io.read_graph_raw import read_nodesplitidx_split_hetero
    from ogb.nodeproppred import NodePropPredDataset

    class Dataset(NodePropPredDataset):  # type: ignore[misc, valid-type]
        def pre_process(self) -> None:
            processed = Path(self.root) / "processed" / "data_processed"
            if processed.is_file():
                self.graph, self.labels = read_processed(processed)
            else:
                super().pre_process()  # reads the raw CSVs and torch.save-s the pickle; loads nothing

        def get_idx_split(self, split_type: str | None = None) -> dict[str, dict[str, Any]]:
            folder = Path(self.root) / "split" / (split_type or self.meta_info["split"])
            train, valid, test = read_nodesplitidx_split_hetero(str(folder))
            return {"train": train, "valid": valid, "test": test}

    return Dataset


def _open_ogb(root: Path) -> Any:
    """OGB's ``NodePropPredDataset("ogbn-mag", root)``, reading no pickle unsafely (tests replace this to
    stay offline)."""
    with _ogb_environment():
        return _dataset_class()(name=OGB_NAME, root=str(root))


def _has_files(folder: Path) -> bool:
    return (folder / "processed" / "data_processed").is_file() or (folder / "raw" / "triplet-type-list.csv.gz").is_file()


def _download(base: Path) -> None:
    """Let OGB download and process into a temporary root, then rename the folder into place."""
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{_DIR}.download-", dir=base))
    try:
        _open_ogb(work)
        try:
            os.rename(work / _DIR, base / _DIR)
        except OSError:
            if not _has_files(base / _DIR):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def load_ogbn_mag(root: str | Path | None = None, *, features: bool = True, download: bool = True) -> HeteroGraph:
    """ogbn-mag as a :class:`HeteroGraph` with paper features and the paper-venue task."""
    base = data_root(root)
    folder = base / _DIR
    if not _has_files(folder):
        why = "downloads are disabled (download=False)"
        if download:
            try:
                _download(base)
            except (urllib.error.URLError, OSError, TimeoutError) as e:
                why = f"downloading it through the ogb package failed: {e}"
        if not _has_files(folder):
            looked = [folder / "processed" / "data_processed", folder / "raw" / "triplet-type-list.csv.gz"]
            raise DatasetNotFoundError(
                f"dataset {OGB_NAME!r}: files not found; looked for:\n"
                + "\n".join(f"  {p}" for p in looked)
                + f"\n{why[0].upper() + why[1:]}.\nTo provide them, run "
                f"`python -c \"from ogb.nodeproppred import NodePropPredDataset as D; D('{OGB_NAME}', root='{base}')\"` "
                f"on a machine with network access and copy {folder}{os.sep} here, or point the environment variable "
                f"RGTUNE_DATA_DIR (CLI: --data-dir) at a folder with an {_DIR!r} sub-folder.",
                looked,
            )
    release = folder / f"RELEASE_v{_ogb_version()}.txt"
    if not release.is_file():
        # OGB would stop and ask on stdin whether to delete the folder; fail clearly instead.
        raise DatasetError(
            f"dataset {OGB_NAME!r}: {folder} is not the version this ogb package expects ({release.name} is missing); "
            f"delete the folder to download it again"
        )
    if not (folder / "processed").is_dir():
        (folder / "processed").mkdir()  # OGB writes its pickle there but assumes the folder exists
    log.info("%s: loading %s", OGB_NAME, folder)
    return _to_graph(_open_ogb(base), features)


def _to_graph(ds: Any, features: bool) -> HeteroGraph:
    graph, labels = ds[0]
    split = ds.get_idx_split()
    edges = {
        tuple(c): (torch.from_numpy(np.asarray(ei[0])), torch.from_numpy(np.asarray(ei[1])))
        for c, ei in graph["edge_index_dict"].items()
    }
    feats = {}
    if features:
        own = graph.get("node_feat_dict") or {}
        feats = {t: torch.from_numpy(np.asarray(x)) for t, x in own.items() if x is not None}
    y = torch.from_numpy(np.asarray(labels["paper"]).reshape(-1).astype(np.int64))
    train = torch.from_numpy(np.asarray(split["train"]["paper"]).astype(np.int64))
    test = torch.from_numpy(np.asarray(split["test"]["paper"]).astype(np.int64))
    task = NodeTask("paper", int(ds.num_classes), train, y[train], test, y[test])
    return HeteroGraph(dict(graph["num_nodes_dict"]), edges, name=OGB_NAME, features=feats, task=task)
