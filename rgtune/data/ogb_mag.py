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

Example (needs the files; about 20 s and 4 GB of memory):
    >>> g = load_ogbn_mag()  # doctest: +SKIP
    >>> g.num_nodes(), g.num_edges(), g.features["paper"].shape  # doctest: +SKIP
    (1939743, 21111007, torch.Size([736389, 128]))
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tempfile
import urllib.error
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from rgtune._environ import scoped_env
from rgtune.data._cache import data_root
from rgtune.data.errors import DatasetError, DatasetNotFoundError
from rgtune.data.graph import HeteroGraph, NodeTask

__all__ = ["OGB_NAME", "load_ogbn_mag", "ogb_folder"]

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
    # OGB pickles numpy arrays and loads them with a bare torch.load, which torch >= 2.6 refuses
    # (weights_only by default). The file is the one OGB itself wrote from the raw CSVs, so allow it.
    # OGB prints and draws tqdm bars while processing; send both to the log.
    with scoped_env("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1"), warnings.catch_warnings(), \
            contextlib.redirect_stdout(_LogWriter()), contextlib.redirect_stderr(_LogWriter()):
        warnings.filterwarnings("ignore", message=".*TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD.*")
        warnings.filterwarnings("ignore", category=FutureWarning)
        yield


def _open_ogb(root: Path) -> Any:
    """``NodePropPredDataset("ogbn-mag", root)`` (tests replace this to stay offline)."""
    from ogb.nodeproppred import NodePropPredDataset

    with _ogb_environment():
        return NodePropPredDataset(name=OGB_NAME, root=str(root))


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
