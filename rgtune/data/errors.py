"""Exceptions raised by the dataset loaders.

Every loader error is a :class:`DatasetError` (a ``ValueError``), so callers (the CLI) can catch
one class and print its message, which always says what went wrong, where, and what to do.

Example:
    >>> from rgtune.data.errors import DatasetError, UnknownDatasetError
    >>> issubclass(UnknownDatasetError, DatasetError) and issubclass(DatasetError, ValueError)
    True
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "DatasetError",
    "UnknownDatasetError",
    "DatasetNotFoundError",
    "CorruptDatasetError",
    "ChecksumError",
]


class DatasetError(ValueError):
    """Base class of every dataset-loading error."""


class UnknownDatasetError(DatasetError, KeyError):
    """The dataset name is not in the registry (the message lists the known names)."""

    def __str__(self) -> str:  # KeyError would repr() the message; keep it readable
        return str(self.args[0]) if self.args else ""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """Raw files are missing and could not be downloaded.

    ``missing`` lists every path that was looked at and not found.
    """

    def __init__(self, message: str, missing: list[Path] | None = None) -> None:
        super().__init__(message)
        self.missing = list(missing or [])

    def __str__(self) -> str:  # OSError's __str__ would format (errno, strerror)
        return str(self.args[0])


class CorruptDatasetError(DatasetError):
    """A raw file is damaged: truncated gzip, malformed N-Triples or TSV line, bad archive.

    ``path`` and ``line`` (1-based, when known) say where.
    """

    def __init__(self, message: str, path: Path | str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.path = Path(path) if path is not None else None
        self.line = line


class ChecksumError(CorruptDatasetError):
    """A downloaded archive does not have the expected sha256."""
