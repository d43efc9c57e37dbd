"""Every dotted ``trioserve.*`` name in a docstring or comment of src/ resolves: to a module,
or to an attribute of one; and every path to a file of the project in the docstrings and
comments of src/, tools/ and tests/ names a file that is there. Modules move (the uploads
module left ``http/`` for ``http/bodies/``) and prose naming the old place sends a reader
to nothing.

Some dotted names are not modules but names the code itself spells as strings: loggers
(``trioserve.access``), WebSocket subprotocols (``trioserve.bearer.<KEY>``), span attributes
(``trioserve.request.id``). Prose may name those; they are read from the code's string
constants, not listed here, so a name stays allowed only while the code uses it.

A path (``http/bodies/media.py``, ``tests/vllm/test_parity.py``, ``docs/api.md``) may be
written from the repository's root, from ``src/trioserve/`` or from the mentioning file's
directory; a bare ``<name>.py`` must be the name of some file of the project. Another
project's file is written with its own top directory (h11's ``h11/_state.py``), which is
none of those places' directories, and is not checked.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "trioserve"
#: Whose docstrings and comments are read for paths.
SCANNED = (SRC, ROOT / "tools", ROOT / "tests")

DOTTED = re.compile(r"\btrioserve(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
#: A file named in prose: a path, or a bare name, ending in .py or .md (not inside a URL).
PATH = re.compile(r"(?<![\w./:-])((?:[\w.-]+/)*[\w.-]+\.(?:py|md))\b")


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or a chain of attributes of its longest module prefix."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def prose_and_code_strings(source: str) -> tuple[list[tuple[int, str]], set[str]]:
    """The docstrings and comments of ``source`` (with their line), and its other strings."""
    tree = ast.parse(source)
    docstrings: list[tuple[int, str]] = []
    prose_nodes: set[int] = set()
    for node in ast.walk(tree):
        # A bare string statement: a module, class or function docstring, or an attribute's
        # docstring (Sphinx reads the string after an assignment).
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            docstrings.append((node.lineno, node.value.value))
            prose_nodes.add(id(node.value))
    code_strings = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in prose_nodes
    }
    comments = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    return docstrings + comments, code_strings


def test_every_dotted_trioserve_name_in_docstrings_and_comments_resolves():
    mentions: list[tuple[str, int, str]] = []
    spelled_by_code: set[str] = set()
    for path in sorted(SRC.rglob("*.py")):
        prose, code_strings = prose_and_code_strings(path.read_text())
        spelled_by_code.update(
            match.group(0) for text in code_strings for match in DOTTED.finditer(text)
        )
        relative = str(path.relative_to(SRC.parent))
        mentions.extend(
            (relative, line, match.group(0))
            for line, text in prose
            for match in DOTTED.finditer(text)
        )
    assert len(mentions) > 20, "the scan finds the names the docstrings do give"
    unresolved = [
        f"{path}:{line}: {name}"
        for path, line, name in mentions
        if name not in spelled_by_code
        and not any(spelled.startswith(name + ".") for spelled in spelled_by_code)
        and not resolves(name)
    ]
    assert unresolved == []


def test_a_name_of_a_module_that_is_gone_is_found():
    # The check itself: a moved module's old name does not resolve, its new one does.
    assert not resolves("trioserve.http.uploads")
    assert resolves("trioserve.http.bodies.uploads")
    assert resolves("trioserve.transport.owner.SocketOwner")
    assert not resolves("trioserve.transport.owner.NoSuchOwner")


#: The names of the project's Python files, for a bare ``<name>.py``.
FILE_NAMES = {path.name for top in SCANNED for path in top.rglob("*.py")}


def names_a_missing_file(path: str, mentioned_in: Path) -> bool:
    """Whether ``path``, written in the prose of the file ``mentioned_in``, names a file of
    the project that is not there (see the module's docstring for where it may start)."""
    first, slash, _ = path.partition("/")
    if not slash:
        # A bare name (only .py: a bare .md may be a document outside the repository).
        return path.endswith(".py") and path not in FILE_NAMES
    bases = (ROOT, SRC, mentioned_in.parent)
    if first in (".", "..") or not any((base / first).is_dir() for base in bases):
        return False  # outside the repository, or another project's file
    return not any((base / path).is_file() for base in bases)


def test_every_path_to_a_project_file_in_docstrings_and_comments_is_there():
    mentions = []
    for top in SCANNED:
        for path in sorted(top.rglob("*.py")):
            prose, _ = prose_and_code_strings(path.read_text())
            mentions.extend(
                (path, line, match.group(1))
                for line, text in prose
                for match in PATH.finditer(text)
            )
    assert len(mentions) > 200, "the scan finds the paths the prose does give"
    missing = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path, line, name in mentions
        if names_a_missing_file(name, path)
    ]
    assert missing == []


def test_a_path_to_a_file_that_is_not_there_is_found():
    here = SRC / "server" / "http1" / "protocol.py"
    for gone in (
        "h11_server.py",
        "tests/text/test_agents_chunking.py",
        "http/bodies/tools.py",
        "src/trioserve/zmtp.py",
        "tools/no_such_tool.py",
        "docs/no_such_page.md",
    ):
        assert names_a_missing_file(gone, here), gone
    for there in (
        "serve.py",
        "tests/text/agents/test_chunking.py",
        "http/bodies/agents.py",
        "server/http1/connection.py",
        "src/trioserve/transport/zmtp.py",
        "tools/wakeups.py",
        "docs/architecture.md",
    ):
        assert not names_a_missing_file(there, here), there
    # Another project's file, and one outside the repository, are not ours to check.
    assert not names_a_missing_file("vllm/v1/engine/core.py", here)
    assert not names_a_missing_file("../shared/vllm-enginecore.md", here)
