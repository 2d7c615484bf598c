"""The on-disk kernel cache, treated as untrusted input.

hopmm loads machine code from this directory, so it trusts only what it wrote itself:

- The directory must belong to this user and be writable by no one else. Otherwise hopmm
  warns once and uses a private directory of this user (mode 0700) under the system's
  temporary directory instead.
- Every entry (a kernel's cubin and its ptxas log) has a manifest, written last, that records
  the SHA-256 of each file. An entry is used only if its files match their manifest and are
  regular files of this user that no one else can write. A truncated, garbled or foreign entry
  is reported once (CacheWarning), compiled again and replaced; it is never loaded.
- Files are written aside and renamed into place (os.replace), so a reader in another process
  never sees a partial file.
- A cache that cannot be written (read-only, disk full) is reported once; the process goes on
  with the kernels it compiled kept in memory.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
import tempfile
import threading
import warnings
from pathlib import Path

CACHE_ENV = "HOPMM_CACHE_DIR"
CACHE_FILE_MODE = 0o644          # readable by others: a cache directory may be shared read-only
CACHE_DIR_MODE = 0o755           # the same, and never writable by group or others
PRIVATE_DIR_MODE = 0o700         # the fallback directory: this user's alone
# Written into every manifest; a manifest of another format is foreign and the entry rebuilt.
MANIFEST_FORMAT = "hopmm-kernel-cache-1"
MANIFEST_SUFFIX = ".manifest"
LOCK_SUFFIX = ".lock"
# Group or others may write: anyone with that right could plant machine code for hopmm to run.
_UNSAFE_WRITE_BITS = stat.S_IWGRP | stat.S_IWOTH


class CacheWarning(UserWarning):
    """The kernel cache or autotune table was unusable or damaged; hopmm worked around it."""


_warned: set = set()
_warned_lock = threading.Lock()


def warn_once(key, message: str) -> None:
    """warnings.warn(message) the first time `key` is seen in this process."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, CacheWarning, stacklevel=3)


def forget_reports() -> None:
    """Reports everything again, as a new process would (tests)."""
    with _warned_lock:
        _warned.clear()


def configured_dir() -> Path:
    """HOPMM_CACHE_DIR, else $XDG_CACHE_HOME/hopmm, else ~/.cache/hopmm."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hopmm"


def untrusted_reason(st: os.stat_result, what: str) -> str | None:
    """Why a file or directory of status `st` must not be trusted, or None."""
    if st.st_uid != os.getuid():
        return f"{what} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & _UNSAFE_WRITE_BITS:
        return f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def private_dir() -> Path:
    """This user's own cache under the temporary directory (mode 0700); where someone else
    holds that name, a fresh directory of a unique name."""
    path = Path(tempfile.gettempdir()) / f"hopmm-{os.getuid()}"
    try:
        path.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
        st = path.lstat()
        if (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
                and stat.S_IMODE(st.st_mode) == PRIVATE_DIR_MODE):
            return path
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="hopmm-"))   # mkdtemp makes it 0700


# configured path -> the directory used for it, once it was found trusted (or replaced):
# the autotune table is looked up on every planned call, and this keeps that a dict lookup.
_resolved: dict = {}
_resolved_lock = threading.Lock()


def cache_dir(create: bool = True) -> Path:
    """The directory to read and write: the configured one where it is trusted, else a
    private one (warned once). Made on the way unless `create` is False (the per-call lookup of
    the autotune table only reads, and a mkdir per call costs ~20 us)."""
    configured = configured_dir()
    key = str(configured)
    found = _resolved.get(key)
    if found is not None:
        return found
    with _resolved_lock:
        found = _resolved.get(key)
        if found is not None:
            return found
        if create:
            try:
                configured.mkdir(mode=CACHE_DIR_MODE, parents=True, exist_ok=True)
            except OSError as exc:
                report_unwritable(configured, exc)
                return configured
        try:
            st = configured.stat()   # a link to a directory is judged by the directory
        except FileNotFoundError:
            return configured        # nothing there to read yet: decided once it exists
        reason = untrusted_reason(st, f"kernel cache directory {configured}")
        if reason is None and not stat.S_ISDIR(st.st_mode):
            reason = f"kernel cache {configured} is not a directory"
        if reason is not None:
            private = private_dir()
            warn_once(("untrusted", key), f"hopmm: not using the cache: {reason}; using the "
                      f"private directory {private} instead")
            found = private
        else:
            found = configured
        _resolved[key] = found
        return found


def forget_resolved() -> None:
    """Judges every cache directory again on its next use (tests; a changed HOPMM_CACHE_DIR
    is judged on its own without this)."""
    with _resolved_lock:
        _resolved.clear()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_trusted(path: Path) -> bytes:
    """The content of a regular file of this user that no one else can write; OSError if it
    is missing, ValueError if it is not to be trusted. Opened without following a link, and
    judged by the opened file itself, so it cannot be swapped between the check and the read."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file")
        reason = untrusted_reason(st, str(path))
        if reason is not None:
            raise ValueError(reason)
        return f.read()


def atomic_write(path: Path, data: bytes) -> None:
    """Writes aside, then renames into place: readers see the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, CACHE_FILE_MODE)  # mkstemp makes 0600; a cache directory may be shared
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class DamagedEntry(ValueError):
    """A cache entry that is there but is not what hopmm wrote."""


def manifest_path(path: Path) -> Path:
    return path.with_name(path.name + MANIFEST_SUFFIX)


def read_entry(path: Path, parts: tuple[str, ...]) -> dict | None:
    """{suffix: content} of the entry `path` (a stem) whose files are path + each suffix of
    `parts`, each checked against the manifest; None where there is no manifest (no entry);
    DamagedEntry where anything does not match."""
    try:
        raw = read_trusted(manifest_path(path))
    except FileNotFoundError:
        strays = [p for p in parts if path.with_name(path.name + p).exists()]
        if strays:   # a file hopmm did not finish, or did not write
            raise DamagedEntry(f"{', '.join(strays)} without a manifest") from None
        return None
    except (OSError, ValueError) as exc:
        raise DamagedEntry(f"manifest unusable: {exc}") from exc
    try:
        manifest = json.loads(raw.decode())
        if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"not a {MANIFEST_FORMAT} manifest")
        digests = manifest["sha256"]
        if not isinstance(digests, dict) or set(digests) != set(parts):
            raise ValueError("manifest names other files")
    except (ValueError, KeyError, UnicodeDecodeError) as exc:
        raise DamagedEntry(f"manifest garbled: {exc}") from exc
    out = {}
    for part in parts:
        file = path.with_name(path.name + part)
        try:
            data = read_trusted(file)
        except (OSError, ValueError) as exc:
            raise DamagedEntry(f"{file.name} unusable: {exc}") from exc
        if sha256(data) != digests[part]:
            raise DamagedEntry(f"{file.name} does not match the SHA-256 recorded when it was "
                               f"written (truncated, garbled or replaced)")
        out[part] = data
    return out


def write_entry(path: Path, files: dict) -> None:
    """Writes {suffix: bytes} as the entry `path`: the files first, the manifest of their
    hashes last, so a manifest is only ever seen beside the files it describes."""
    for part, data in files.items():
        atomic_write(path.with_name(path.name + part), data)
    manifest = {"format": MANIFEST_FORMAT,
                "sha256": {part: sha256(data) for part, data in files.items()}}
    atomic_write(manifest_path(path), json.dumps(manifest, sort_keys=True).encode())


@contextlib.contextmanager
def entry_lock(path: Path):
    """Holds an exclusive lock of the entry `path` across processes (flock on a lock file
    beside it), so one process compiles while the others wait and then read its entry. Yields
    False, holding nothing, where the lock file cannot be made (a read-only directory)."""
    try:
        f = open(path.with_name(path.name + LOCK_SUFFIX), "a")
    except OSError:
        yield False
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def report_unwritable(directory: Path, exc: OSError) -> None:
    warn_once(("unwritable", str(directory)),
              f"hopmm: cannot write the kernel cache {directory} ({exc}); compiled kernels "
              f"and autotune results are kept in memory only in this process")
