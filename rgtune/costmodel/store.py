"""Saving and loading a trained cost model: one file, a checked header, then the payload.

The file is one line of JSON (the header), a newline, and a pickle of the payload. The header
carries a magic string, the format version, the scikit-learn and numpy versions the estimator
was pickled with, what the model was trained for (device, backend, settings), the payload's
sha256, and an HMAC of the whole file under this user's secret key
(:mod:`rgtune._signing`). :func:`read_model` returns None with a reason for anything it
would not trust (another format, other library versions, another device, a truncated or edited
payload, a payload that does not unpickle); the caller then retrains. Writes go through a
temporary file and a rename, so a crash never leaves half a model behind.

Provenance rule: a pickle runs code when it is loaded, and a model file travels with its database
(``results.db.costmodel/`` next to a ``results.db`` someone sent you). So a model is unpickled only
when its HMAC checks out under this user's key on this machine, and the HMAC is checked before
anything is unpickled. A model without a valid HMAC (another user's or machine's, edited, or saved
before models were signed) is never loaded: the model is fit again from the trial history, which
is data, and saved with this user's HMAC. The sha256 catches accidents; the HMAC, provenance.

Example:
    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "m.rgcm")
    >>> write_model(p, {"weights": [1, 2]}, key={"backend": "cpu"})
    >>> read_model(p, key={"backend": "cpu"})
    ({'weights': [1, 2]}, '')
    >>> read_model(p, key={"backend": "cuda"})[1]
    "trained for {'backend': 'cpu'}, not {'backend': 'cuda'}"
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any, Mapping

from rgtune import _signing as signing

__all__ = ["FORMAT_VERSION", "MAGIC", "write_model", "read_model", "default_model_path"]

MAGIC = "rgtune-costmodel"
#: bump when the payload's meaning changes (features, target, fields): older files are retrained
#: 2: feature rows count the weight folds of reordering (weight_flops); 3: a cached row says whether its trial was
#: its workload's default schedule (history.DEFAULT_MARK); sampler workloads' rows describe a batch
FORMAT_VERSION = 3
SUFFIX = ".rgcm"


def _versions() -> dict[str, str]:
    import numpy
    import sklearn

    return {"sklearn": sklearn.__version__, "numpy": numpy.__version__}


def write_model(path: str | os.PathLike[str], payload: Any, key: Mapping[str, Any]) -> None:
    """Write ``payload`` for ``key`` atomically (temporary file, then rename)."""
    body = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    header = {"magic": MAGIC, "format": FORMAT_VERSION, **_versions(), "key": dict(key),
              "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
    header["hmac"] = signing.sign(_signed_bytes(header, body))  # SigningKeyError (an OSError): not saved
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(header, sort_keys=True).encode() + b"\n")
            f.write(body)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_model(path: str | os.PathLike[str], key: Mapping[str, Any]) -> tuple[Any | None, str]:
    """``(payload, "")``, or ``(None, why it was not trusted)``."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None, "no saved model"
    except OSError as e:
        return None, f"cannot read the saved model ({e.strerror or e})"
    head, sep, body = data.partition(b"\n")
    try:
        header = json.loads(head.decode()) if sep else None
    except (UnicodeDecodeError, ValueError):
        header = None
    if not isinstance(header, dict) or header.get("magic") != MAGIC:
        return None, "not a cost model file (corrupt header)"
    if header.get("format") != FORMAT_VERSION:
        return None, f"saved with format {header.get('format')!r}, this rgtune reads format {FORMAT_VERSION}"
    for lib, version in _versions().items():
        if header.get(lib) != version:
            return None, f"saved with {lib} {header.get(lib)}, this is {lib} {version}"
    if header.get("key") != dict(key):
        return None, f"trained for {header.get('key')}, not {dict(key)}"
    if header.get("size") != len(body) or header.get("sha256") != hashlib.sha256(body).hexdigest():
        return None, "the saved model is corrupt (checksum mismatch)"
    why = _untrusted(header, body)
    if why:
        return None, why
    try:
        return pickle.loads(body), ""
    except Exception as e:  # noqa: BLE001 - anything a damaged pickle raises
        return None, f"the saved model does not load ({type(e).__name__})"


def _signed_bytes(header: Mapping[str, Any], body: bytes) -> bytes:
    """What the HMAC covers: the header (without the HMAC itself), canonically, and the payload."""
    fields = {k: v for k, v in header.items() if k != "hmac"}
    return MAGIC.encode() + b"\0" + json.dumps(fields, sort_keys=True).encode() + b"\n" + body


def _untrusted(header: Mapping[str, Any], body: bytes) -> str:
    """Why a model file may not be unpickled (no valid HMAC under this user's key), or ``""``."""
    rule = "a model file runs code when loaded, so only models this user saved on this machine are loaded"
    if "hmac" not in header:
        return f"it is not signed (saved by an older rgtune, or not by rgtune); {rule}"
    try:
        ok = signing.verify(_signed_bytes(header, body), header["hmac"])
    except signing.SigningKeyError as e:
        return f"its signature cannot be checked: {e}"
    if not ok:
        return f"it was not saved by this user on this machine (its HMAC does not match this user's key); {rule}"
    return ""


def default_model_path(sqlite_file: str | os.PathLike[str] | None, db_name: str, device: str, backend: str) -> Path:
    """Where the model of one device and backend lives.

    Next to an SQLite file (``results.db`` -> ``results.db.costmodel/<device hash>-<backend>.rgcm``);
    for other databases, in the per-user cache (``$RGTUNE_CACHE_DIR/costmodels``, else
    ``~/.cache/rgtune/costmodels``), in a folder named by a hash of the database's name.

    Example:
        >>> default_model_path("runs/results.db", "", "AMD EPYC", "cpu").as_posix()
        'runs/results.db.costmodel/a4207cd081c4-cpu.rgcm'
    """
    name = f"{hashlib.sha256(device.encode()).hexdigest()[:12]}-{_safe(backend)}{SUFFIX}"
    if sqlite_file is not None:
        return Path(f"{os.fspath(sqlite_file)}.costmodel") / name
    return _cache_dir() / "costmodels" / hashlib.sha256(db_name.encode()).hexdigest()[:12] / name


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def _cache_dir() -> Path:
    env = os.environ.get("RGTUNE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rgtune"
