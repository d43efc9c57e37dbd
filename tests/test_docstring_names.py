"""Every dotted ``trioserve.*`` name in a docstring or comment of src/ resolves: to a module,
or to an attribute of one. Modules move (``http/uploads.py`` became ``http/bodies/uploads.py``)
and prose naming the old place sends a reader to nothing.

Some dotted names are not modules but names the code itself spells as strings: loggers
(``trioserve.access``), WebSocket subprotocols (``trioserve.bearer.<KEY>``), span attributes
(``trioserve.request.id``). Prose may name those; they are read from the code's string
constants, not listed here, so a name stays allowed only while the code uses it.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "trioserve"

DOTTED = re.compile(r"\btrioserve(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


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
