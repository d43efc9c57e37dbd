"""Uploaded files: written under ``--upload-dir`` only, removed when the request ends.

Each request that uploads gets a fresh directory of its own under the upload root
(``req-`` + random hex, mode 0700), and each file in it a name made of the part's index and
the client's filename reduced to one safe path component: letters, digits, ``.``, ``_``,
``-``, no directory part, no leading dot, bounded length; the extension likewise (or one
guessed from the part's media type). Whatever the client sends (``../../etc/passwd``,
``C:\\x``, NUL bytes, a 10 kB name) the file lands in the request's directory, and
:meth:`Uploads.close` removes that directory however the request ended.
"""

from __future__ import annotations

import atexit
import functools
import mimetypes
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path

import trio

#: Longest file stem and extension kept from a client's filename.
MAX_STEM = 80
MAX_EXTENSION = 10

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]+")


@functools.cache
def default_upload_root() -> Path:
    """This process's own upload root when no ``--upload-dir`` is given: created fresh
    (never an existing path someone else could have made, or pointed elsewhere with a
    symlink), mode 0700, removed when the process exits."""
    root = Path(tempfile.mkdtemp(prefix="trioserve-uploads-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def safe_filename(name: str | None, content_type: str | None, index: int) -> str:
    """One safe path component for upload number ``index`` (unique within its request)."""
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    stem, dot, extension = base.rpartition(".")
    if not dot:
        stem, extension = base, ""
    stem = _UNSAFE.sub("_", stem).strip("._-")[:MAX_STEM] or "upload"
    extension = _NOT_ALNUM.sub("", extension)[:MAX_EXTENSION].lower()
    if not extension and content_type:
        guessed = mimetypes.guess_extension(content_type.split(";")[0].strip().lower())
        extension = (guessed or "").lstrip(".")
    # The index prefix makes names unique and never ".", ".." or hidden.
    return f"{index}-{stem}" + (f".{extension}" if extension else "")


class Uploads:
    """The uploaded files of one request. Use as a context manager: leaving it removes them."""

    def __init__(self, root: str | Path | None) -> None:
        self.root = Path(root) if root else default_upload_root()
        self.directory: Path | None = None
        self.count = 0

    async def new_file(self, filename: str | None, content_type: str | None) -> Path:
        """A fresh path (not yet created) for the next uploaded file."""
        if self.directory is None:
            await trio.Path(self.root).mkdir(parents=True, exist_ok=True)
            directory = self.root / f"req-{secrets.token_hex(8)}"
            await trio.Path(directory).mkdir(mode=0o700)
            self.directory = directory
        path = self.directory / safe_filename(filename, content_type, self.count)
        self.count += 1
        # Defence in depth: the name is one component by construction.
        if path.parent != self.directory or path.name in ("", ".", ".."):
            raise AssertionError(f"unsafe upload path {path!r}")
        return path

    def close(self) -> None:
        """Remove this request's files. Synchronous (a small directory), so it runs to the
        end even in a cancelled ``finally``; idempotent."""
        directory, self.directory = self.directory, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    def __enter__(self) -> Uploads:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def open_upload(path: Path) -> trio.abc.AsyncResource:
    """Create ``path`` exclusively (never follows or overwrites anything), for writing."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    return trio.wrap_file(os.fdopen(fd, "wb"))
