"""Traces named by fsspec URLs (s3://, gs://, abfs://, file://, chained ones such as
zip://::s3://...): listing a run's directory, opening a trace, and a local copy where a reader needs
a real file (SQLite exports).

Why fsspec: it is what Dask workers already use for remote data, each cloud's package (s3fs,
gcsfs, adlfs) plugs into it with the user's own credentials, and it is already installed with the
`cluster` extra. It is imported only when a URL is given, so local analyses start no faster or
slower for it. Every error an fsspec backend raises (a protocol whose package is missing, no
credentials, no such key) becomes one line naming the URL.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from .model import TraceError

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def is_url(path) -> bool:
    """Whether `path` is an fsspec URL rather than a local path (a Path never is)."""
    return isinstance(path, str) and bool(_URL.match(path))


def name_of(url: str) -> str:
    """The last component of the URL's own path (the file name, for ranks and suffixes)."""
    head = url.split("::", 1)[0]
    return head.split("://", 1)[1].rstrip("/").rsplit("/", 1)[-1]


def _fs(url: str):
    try:
        import fsspec.core
    except ImportError:
        raise TraceError(f"{url}: reading URLs needs fsspec (pip install fsspec, plus s3fs or gcsfs for "
                         f"s3:// or gs://)") from None
    try:
        return fsspec.core.url_to_fs(url)
    except Exception as e:  # noqa: BLE001 - any backend: a missing package (ImportError), an unknown protocol
        raise _error(url, e) from None


def _error(url: str, e: BaseException) -> TraceError:
    if isinstance(e, FileNotFoundError):
        return TraceError(f"{url}: no such file or directory")
    if isinstance(e, PermissionError):
        return TraceError(f"{url}: cannot read (permission denied)")
    why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
    return TraceError(f"{url}: cannot read ({why})")


def _child(url: str, fs, path: str) -> str:
    """The URL of `path` inside the filesystem `url` names, keeping a chained URL's tail
    (zip://a.json::s3://bucket/run.zip)."""
    head, sep, tail = url.partition("::")
    if "://" in path:  # filesystems that list whole URLs (http)
        return f"{path}{sep}{tail}"
    protocol = head.split("://", 1)[0]
    return f"{protocol}://{path}{sep}{tail}"


def trace_files(url: str, is_trace_name: Callable[[str], bool]) -> list[str]:
    """The URL itself when it names a file, else the files of the directory it names whose
    names pass `is_trace_name` (trace.py's rule, the same as on disk)."""
    fs, path = _fs(url)
    try:
        if not fs.isdir(path):
            if not fs.exists(path):
                raise FileNotFoundError(path)
            return [url]
        entries = fs.ls(path, detail=True)
    except Exception as e:  # noqa: BLE001 - see _fs
        raise _error(url, e) from None
    names = sorted(e["name"] for e in entries if e.get("type") == "file")
    return [_child(url, fs, n) for n in names if is_trace_name(n.rstrip("/").rsplit("/", 1)[-1])]


class _Opened:
    """A file opened through a filesystem object that must live as long as the file (a zip://
    filesystem closes its archive when collected)."""

    def __init__(self, fs, f):
        self.fs, self.f = fs, f

    def read(self, n: int = -1) -> bytes:
        return self.f.read(n)

    def readinto(self, b) -> int:
        if hasattr(self.f, "readinto"):
            return self.f.readinto(b)
        data = self.f.read(len(b))
        memoryview(b).cast("B")[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.f.seek(offset, whence)

    def close(self) -> None:
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_url(url: str) -> tuple[_Opened, int]:
    """(a binary file object, its size in bytes) for a trace named by a URL."""
    fs, path = _fs(url)
    try:
        size = fs.size(path)
        return _Opened(fs, fs.open(path, "rb")), size
    except Exception as e:  # noqa: BLE001 - see _fs
        raise _error(url, e) from None


def local_copy(url: str, directory: str) -> str:
    """Copy the file a URL names into `directory` (same file name) and return its path: SQLite
    reads only local files."""
    fs, path = _fs(url)
    dest = os.path.join(directory, name_of(url))
    try:
        fs.get_file(path, dest)
    except Exception as e:  # noqa: BLE001 - see _fs
        raise _error(url, e) from None
    return dest
