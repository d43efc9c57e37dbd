"""An incremental JSON syntax check, one character at a time, for calls in a model's text.

The call formats write a call as a JSON object (``{"name": ..., "arguments": {...}}``);
to stream the arguments as the model writes them, and still answer a text that is not a
call as text, the parser must know at every character whether the object is still sound,
which key it is in, and where each top-level value begins and ends. ``json.loads`` answers
only for a whole text; this answers as the text comes, in O(1) per character.
"""

from __future__ import annotations

import json
import re

# What the scanner expects next.
_VALUE = 0  # a value (after ':' or '[' or ',' in an array, or at the top)
_VALUE_OR_CLOSE = 1  # after '['
_KEY_OR_CLOSE = 2  # after '{'
_KEY = 3  # after ',' in an object
_COLON = 4
_AFTER = 5  # after a value in a container: ',' or its close
_STRING = 6
_ESCAPE = 7
_UNICODE = 8
_NUMBER = 9
_LITERAL = 10
_DONE = 11
_ERROR = 12

_WS = " \t\n\r"
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_NUMBER_RE = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?\Z")
_ESCAPES = frozenset('"\\/bfnrtu')
_HEX = frozenset("0123456789abcdefABCDEF")


class ObjectScanner:
    """Checks one JSON object as its text comes (:meth:`feed`), and tells what its
    top-level members are: each key, and where its value begins and ends in the text
    fed so far (:attr:`text`).

    After each feed: :attr:`done` (the object closed; :attr:`end` is the offset just past
    its ``}``; what follows is not the object's), :attr:`error` (the text cannot be JSON),
    :attr:`key` (the top-level key whose value is being read, or was read last),
    :attr:`value_start` (where that value begins, or -1), :attr:`members` (each finished
    top-level member: key, value start, value end).
    """

    def __init__(self) -> None:
        self.text = ""
        self.pos = 0
        self.state = _VALUE
        self.stack: list[str] = []
        self.in_key = False
        self.token_start = 0
        self.literal = ""
        self.unicode_left = 0
        self.key: str | None = None
        self.value_start = -1
        self.members: list[tuple[str, int, int]] = []
        self.end = -1

    @property
    def done(self) -> bool:
        return self.state == _DONE

    @property
    def error(self) -> bool:
        return self.state == _ERROR

    @property
    def depth(self) -> int:
        return len(self.stack)

    def member(self, key: str) -> tuple[int, int] | None:
        for name, start, end in self.members:
            if name == key:
                return start, end
        return None

    def feed(self, text: str) -> None:
        self.text += text
        while self.pos < len(self.text) and self.state < _DONE:
            if self._step(self.text[self.pos]):
                self.pos += 1

    def _fail(self) -> bool:
        self.state = _ERROR
        return False

    def _value_done(self, end: int) -> None:
        if self.depth == 1 and self.value_start >= 0 and not self.in_key:
            assert self.key is not None
            self.members.append((self.key, self.value_start, end))
            self.value_start = -1
        self.state = _AFTER if self.stack else _DONE

    def _step(self, c: str) -> bool:
        """Take character ``c`` at :attr:`pos`; False when it is not consumed (the end of a
        number, which the next state reads again)."""
        state = self.state
        if state == _STRING:
            if c == '"':
                if self.in_key:
                    self.in_key = False
                    if self.depth == 1:
                        self.key = json.loads(self.text[self.token_start : self.pos + 1])
                    self.state = _COLON
                else:
                    self._value_done(self.pos + 1)
            elif c == "\\":
                self.state = _ESCAPE
            elif c < " ":
                return self._fail()
            return True
        if state == _ESCAPE:
            if c not in _ESCAPES:
                return self._fail()
            if c == "u":
                self.state, self.unicode_left = _UNICODE, 4
            else:
                self.state = _STRING
            return True
        if state == _UNICODE:
            if c not in _HEX:
                return self._fail()
            self.unicode_left -= 1
            if not self.unicode_left:
                self.state = _STRING
            return True
        if state == _NUMBER:
            if c in _NUMBER_CHARS:
                return True
            if not _NUMBER_RE.match(self.text, self.token_start, self.pos):
                return self._fail()
            self._value_done(self.pos)
            return False
        if state == _LITERAL:
            if c != self.literal[0]:
                return self._fail()
            self.literal = self.literal[1:]
            if not self.literal:
                self._value_done(self.pos + 1)
            return True
        if c in _WS:
            return True
        if state in (_VALUE, _VALUE_OR_CLOSE):
            if state == _VALUE_OR_CLOSE and c == "]":
                self.stack.pop()
                self._value_done(self.pos + 1)
                return True
            if not self.stack and c != "{":
                return self._fail()  # an object, not any value
            if self.depth == 1:
                self.value_start = self.pos
            if c == "{":
                self.stack.append("{")
                self.state = _KEY_OR_CLOSE
            elif c == "[":
                self.stack.append("[")
                self.state = _VALUE_OR_CLOSE
            elif c == '"':
                self.state, self.in_key, self.token_start = _STRING, False, self.pos
            elif c == "-" or c.isdigit():
                self.state, self.token_start = _NUMBER, self.pos
            elif c in "tfn":
                self.state = _LITERAL
                self.literal = {"t": "rue", "f": "alse", "n": "ull"}[c]
            else:
                return self._fail()
            return True
        if state in (_KEY_OR_CLOSE, _KEY):
            if c == '"':
                self.state, self.in_key, self.token_start = _STRING, True, self.pos
                return True
            if state == _KEY_OR_CLOSE and c == "}":
                self.stack.pop()
                self._value_done(self.pos + 1)
                if self.state == _DONE:
                    self.end = self.pos + 1
                return True
            return self._fail()
        if state == _COLON:
            if c != ":":
                return self._fail()
            self.state = _VALUE
            return True
        if state == _AFTER:
            top = self.stack[-1]
            if c == ",":
                self.state = _KEY if top == "{" else _VALUE
                return True
            if (c == "}" and top == "{") or (c == "]" and top == "["):
                self.stack.pop()
                self._value_done(self.pos + 1)
                if self.state == _DONE:
                    self.end = self.pos + 1
                return True
            return self._fail()
        return self._fail()
