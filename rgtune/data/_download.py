"""Finding a dataset's raw files, and downloading them when they are missing.

A dataset folder (``<root>/aifb/``) keeps the original file names of the upstream archive.
When a needed file is missing, the archive is fetched into a temporary folder inside the root,
its sha256 checked (when one is known), its members extracted and checked, and only then moved
into place with ``os.rename`` (or, if the folder already exists, file by file with
``os.replace``): an interrupted download leaves nothing half-written behind.

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp()) / "aifb"
    >>> try:
    ...     ensure_raw_files("aifb", folder, [("trainingSet.tsv",)], url=None, sha256=None, download=False)
    ... except DatasetNotFoundError as e:
    ...     print(e.missing[0].name)
    trainingSet.tsv
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Sequence

from rgtune.data._cache import file_sha256
from rgtune.data.errors import ChecksumError, CorruptDatasetError, DatasetNotFoundError

__all__ = ["fetch", "ensure_raw_files", "download_archive"]

log = logging.getLogger("rgtune.data")

_TIMEOUT_S = 60


def fetch(url: str, dest: Path) -> None:
    """Stream ``url`` into ``dest`` (a progress bar on a terminal, a log line otherwise).

    Tests replace this function to serve archives they build themselves.
    """
    log.info("downloading %s", url)
    with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as resp, open(dest, "wb") as out:
        total = int(resp.headers.get("Content-Length") or 0) or None
        from tqdm.auto import tqdm

        with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name, disable=not sys.stderr.isatty()) as bar:
            while block := resp.read(1 << 20):
                out.write(block)
                bar.update(len(block))


def _find(folder: Path, names: Sequence[str]) -> Path | None:
    for n in names:
        if (folder / n).is_file():
            return folder / n
    return None


def ensure_raw_files(
    dataset: str,
    folder: Path,
    needed: Sequence[Sequence[str]],
    *,
    url: str | None,
    sha256: str | None,
    download: bool,
) -> list[Path]:
    """The path of each needed file (each given as acceptable names, first preferred).

    Missing files are downloaded from ``url`` when ``download`` is true; if that is impossible,
    :class:`DatasetNotFoundError` lists every path looked at and says how to provide them.
    """
    found = [_find(folder, names) for names in needed]
    if all(p is not None for p in found):
        return found  # type: ignore[return-value]
    if not download:
        why = "downloads are disabled (download=False)"
    elif url is None:
        why = "no download URL is known for it"
    else:
        try:
            download_archive(dataset, url, sha256, [names[0] for names in needed], folder)
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            why = f"downloading {url} failed: {e}"
        else:
            why = f"the download from {url} did not provide them"
        found = [_find(folder, names) for names in needed]
        if all(p is not None for p in found):
            return found  # type: ignore[return-value]
    missing = [folder / n for names, p in zip(needed, found) if p is None for n in names]
    looked = "\n".join(f"  {p}" for p in missing)
    source = f"the files of {url} (a .tgz; extract it)" if url else "the files"
    raise DatasetNotFoundError(
        f"dataset {dataset!r}: raw files not found; looked for:\n{looked}\n"
        f"{why[0].upper() + why[1:]}.\n"
        f"To provide them, put {source} into {folder}{os.sep}, or point the environment variable "
        f"RGTUNE_DATA_DIR (CLI: --data-dir) at a folder with a {folder.name!r} sub-folder holding them.",
        missing,
    )


def download_archive(dataset: str, url: str, sha256: str | None, members: Sequence[str], folder: Path) -> None:
    """Fetch the ``.tgz`` at ``url``, verify it, and move its files into ``folder`` atomically.

    ``members`` are file names the archive must contain (checked whether or not a hash is known).
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dataset}.download-", dir=folder.parent))
    try:
        archive = work / f"{dataset}.tgz"
        fetch(url, archive)
        digest = file_sha256(archive)
        if sha256 is not None and digest != sha256:
            raise ChecksumError(
                f"{url}: sha256 mismatch, expected {sha256}, got {digest} ({archive.stat().st_size} bytes); "
                "the download is corrupt or the file changed upstream. Nothing was written."
            )
        staged = work / dataset
        names = _extract_files(archive, staged, url)
        absent = sorted(set(members) - names)
        if absent:
            raise CorruptDatasetError(f"{url}: the archive lacks {absent} (it has {sorted(names)}). Nothing was written.")
        archive.unlink()
        try:
            os.rename(staged, folder)  # the common case: one atomic step
        except OSError:
            if not folder.is_dir():
                raise
            for f in staged.iterdir():  # the folder exists (partly filled by hand): add what it lacks
                if not (folder / f.name).exists():
                    os.replace(f, folder / f.name)
        log.info("dataset %s: %d files in %s", dataset, len(names), folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _extract_files(archive: Path, dest: Path, url: str) -> set[str]:
    """Extract the regular files of a tar archive flat into ``dest``; returns their names.

    Only regular files are written, each under its base name, so no member can escape ``dest``
    or plant a link; names are unique or the archive is rejected.
    """
    dest.mkdir()
    names: set[str] = set()
    try:
        with tarfile.open(archive, "r:*") as tar:
            for m in tar:
                base = Path(m.name).name
                if not m.isfile() or not base or base.startswith("._"):
                    continue  # folders, links, macOS resource forks
                if base in names:
                    raise CorruptDatasetError(f"{url}: the archive has two members named {base!r}")
                src = tar.extractfile(m)
                assert src is not None
                with src, open(dest / base, "wb") as out:
                    shutil.copyfileobj(src, out)
                names.add(base)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise CorruptDatasetError(f"{url}: could not extract the .tgz archive ({e}). Nothing was written.") from None
    return names

