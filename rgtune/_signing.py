"""A secret key of this user on this machine, and HMACs under it: which files this user wrote.

Two kinds of file rgtune writes travel and hold something that would run code if trusted: a saved
cost model is a pickle (unpickling runs whatever the file names), and an export folder names the
module its model is imported from. Both are signed with an HMAC under this key when written, and
trusted only when the HMAC checks out: a file this user wrote here. Anything else is data only (a
cost model is fit again from the trial history; an export's model must be registered in the
loading process, or its import explicitly allowed).

The key is 32 random bytes (hex) in ``<config>/costmodel.key`` (named for its first use, and kept
so that models saved before exports were signed stay trusted), where ``<config>`` is
``$RGTUNE_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/rgtune``, else ``~/.config/rgtune``. It is created
on first use: the folder with mode 0700, the file with mode 0600. A key file that is a link, not a
regular file, someone else's, or readable or writable by others is not used (:class:`SigningKeyError`
says what to fix): nothing signed is trusted until it is fixed.

Example:
    >>> import tempfile
    >>> from rgtune._environ import scoped_env
    >>> with scoped_env("RGTUNE_CONFIG_DIR", tempfile.mkdtemp()):
    ...     tag = sign(b"model bytes")
    ...     verify(b"model bytes", tag), verify(b"model bytes!", tag)
    (True, False)
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import threading
from pathlib import Path

__all__ = ["CONFIG_VARIABLE", "SigningKeyError", "config_dir", "key_path", "user_key", "sign", "verify"]

CONFIG_VARIABLE = "RGTUNE_CONFIG_DIR"
KEY_FILE = "costmodel.key"
_KEY_HEX = 64  # 32 bytes

_lock = threading.Lock()
_keys: dict[str, bytes] = {}


class SigningKeyError(OSError):
    """The per-user key cannot be created or is not safe to use."""


def config_dir() -> Path:
    """``$RGTUNE_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/rgtune``, else ``~/.config/rgtune``."""
    env = os.environ.get(CONFIG_VARIABLE)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME")
    return (Path(base) if base and os.path.isabs(base) else Path.home() / ".config") / "rgtune"


def key_path() -> Path:
    return config_dir() / KEY_FILE


def user_key() -> bytes:
    """This user's key (created on first use); :class:`SigningKeyError` when it cannot be used."""
    path = key_path()
    with _lock:
        if str(path) in _keys:
            return _keys[str(path)]
    key = _read_key(path) if os.path.lexists(path) else _create_key(path)
    with _lock:
        _keys[str(path)] = key
    return key


def _uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def _read_key(path: Path) -> bytes:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise SigningKeyError(f"cannot open rgtune's signing key {path} ({e.strerror or e}); it must be a regular "
                              f"file of yours (delete it to get a new one)") from None
    try:
        st = os.fstat(fd)
        problem = ""
        if not stat.S_ISREG(st.st_mode):
            problem = "is not a regular file"
        elif _uid() is not None and st.st_uid != _uid():
            problem = f"belongs to uid {st.st_uid}, not to you"
        elif os.name == "posix" and st.st_mode & 0o077:
            problem = f"can be read or written by others (mode {stat.S_IMODE(st.st_mode):o})"
        if problem:
            raise SigningKeyError(f"rgtune's signing key {path} {problem}; delete it (a new one is made: saved cost "
                                  f"models are fit again once, and your exports need trust_code=True) or make it yours "
                                  f"with mode 600")
        text = os.read(fd, 4 * _KEY_HEX).decode(errors="replace").strip()
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != _KEY_HEX // 2:
        raise SigningKeyError(f"rgtune's signing key {path} is damaged (not {_KEY_HEX} hex digits); delete it")
    return key


def _create_key(path: Path) -> bytes:
    """Write a new key atomically (a temporary file linked into place), or read the one a concurrent
    process made first."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.write(fd, secrets.token_hex(_KEY_HEX // 2).encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process was first: use its key
        finally:
            os.unlink(tmp)
    except OSError as e:
        if isinstance(e, SigningKeyError):
            raise
        raise SigningKeyError(f"cannot create rgtune's signing key {path} ({e.strerror or e}); set {CONFIG_VARIABLE} "
                              f"to a writable folder of yours") from None
    return _read_key(path)


def sign(data: bytes) -> str:
    """The HMAC-SHA256 of ``data`` under :func:`user_key`, in hex."""
    return hmac.new(user_key(), data, hashlib.sha256).hexdigest()


def verify(data: bytes, tag: object) -> bool:
    """Whether ``tag`` is :func:`sign` of ``data`` (constant-time comparison)."""
    return isinstance(tag, str) and hmac.compare_digest(sign(data), tag)
