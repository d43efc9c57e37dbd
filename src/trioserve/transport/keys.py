"""CURVE key files: read by frontends and engines, written by ``trioserve keygen``.

Two formats are read, so that keys made by trioserve, pyzmq (``zmq.auth``), czmq or by
hand all work:

- a **certificate**, as ``zmq.auth.create_certificates`` and czmq write them (ZPL): a
  ``curve`` section with ``public-key = "<Z85>"`` and, in the secret certificate, also
  ``secret-key = "<Z85>"``. ``trioserve keygen PREFIX`` writes ``PREFIX.key`` (the public
  certificate, to hand out) and ``PREFIX.key_secret`` (both keys, mode 0600);
- a **bare key**: a file whose one line (besides ``#`` comments and blank lines) is a
  40-character Z85 key, as ``zmq.curve_keypair()`` returns them. A secret key's public
  half is computed from it.

An engine's authorized frontend keys (``--curve-authorized-keys``) are a directory, where
every ``*.key`` certificate holds one (zmq.auth's convention: the frontends' public
certificates copied in), or a file of bare public keys, one a line (or one certificate).

Every problem is a :class:`ValueError` whose message names the file and what is wrong.
Z85 (ZeroMQ RFC 32) is pyzmq's codec, imported only when keys are read.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import attrs
from nacl import bindings as sodium

from .curve import KEY_SIZE, CurveClientKeys

log = logging.getLogger(__name__)

#: The largest key file read (bytes): 25,000 keys a line each.
MAX_KEY_FILE = 2**20
#: The most authorized keys an engine takes (its ZAP handler looks each frontend up).
MAX_AUTHORIZED_KEYS = 100_000
Z85_KEY_SIZE = 40


@attrs.frozen(repr=False)
class CurveServerKeys:
    """An engine's CURVE keys: its own pair and the frontends' public keys it accepts (raw
    32-byte keys; never in a repr)."""

    public: bytes
    secret: bytes
    authorized: frozenset[bytes]

    def __repr__(self) -> str:
        return f"CurveServerKeys(<keys>, {len(self.authorized)} authorized)"


def z85_encode(key: bytes) -> str:
    from zmq.utils import z85

    return z85.encode(key).decode("ascii")


def _z85_decode(text: bytes, where: str) -> bytes:
    import struct

    from zmq.utils import z85

    if len(text) != Z85_KEY_SIZE:
        raise ValueError(f"{where}: a key is 40 Z85 characters, this one is {len(text)}")
    try:
        key = z85.decode(text)
    except (KeyError, ValueError, struct.error):
        raise ValueError(f"{where}: not a Z85 key (characters outside Z85's alphabet)") from None
    assert len(key) == KEY_SIZE
    return key


def public_key_of(secret: bytes) -> bytes:
    """The public half of a CURVE secret key (Curve25519's base point multiplication, as
    libzmq's ``zmq_curve_public``)."""
    return sodium.crypto_scalarmult_base(secret)


class _KeyFile:
    """What one key file holds: a certificate's keys, or bare keys."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self.public: bytes | None = None
        self.secret: bytes | None = None
        self.bare: list[bytes] = []
        try:
            with open(path, "rb") as file:
                data = file.read(MAX_KEY_FILE + 1)
        except OSError as exc:
            raise ValueError(f"{self.path}: {exc.strerror or exc}") from None
        if len(data) > MAX_KEY_FILE:
            raise ValueError(f"{self.path}: larger than {MAX_KEY_FILE} bytes: not a key file")
        for number, raw in enumerate(data.splitlines(), 1):
            line = raw.strip()
            where = f"{self.path} line {number}"
            if not line or line.startswith(b"#"):
                continue
            name, equals, value = line.partition(b"=")
            name = name.strip()
            if equals and name in (b"public-key", b"secret-key"):
                key = _z85_decode(value.strip(b" \t'\""), where)
                if name == b"public-key":
                    self.public = key
                else:
                    self.secret = key
            elif raw[:1].isspace() or line in (b"metadata", b"curve"):
                # The rest of a certificate (its properties are indented; '=' alone
                # says nothing: it is one of Z85's characters).
                continue
            else:
                self.bare.append(_z85_decode(line, where))
                if len(self.bare) > MAX_AUTHORIZED_KEYS:
                    raise ValueError(f"{self.path}: more than {MAX_AUTHORIZED_KEYS} keys")
        if (self.public or self.secret) and self.bare:
            raise ValueError(f"{self.path}: a certificate with bare keys in it as well")


def read_public_key(path: str | os.PathLike[str]) -> bytes:
    """The public key in a certificate (public or secret) or a bare-key file."""
    file = _KeyFile(path)
    if file.public is not None:
        return file.public
    if file.secret is not None:
        return public_key_of(file.secret)
    if len(file.bare) == 1:
        return file.bare[0]
    raise ValueError(f"{file.path}: {len(file.bare)} keys where one public key belongs")


def read_secret_key(path: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """``(public, secret)`` from a secret certificate or a bare secret key. Warns (once per
    read) when other users may read the file."""
    file = _KeyFile(path)
    if file.secret is not None:
        secret = file.secret
    elif file.public is not None:
        raise ValueError(
            f"{file.path}: a public certificate, with no secret key in it (trioserve keygen "
            "writes the secret one as PREFIX.key_secret)"
        )
    elif len(file.bare) == 1:
        secret = file.bare[0]
    else:
        raise ValueError(f"{file.path}: {len(file.bare)} keys where one secret key belongs")
    public = public_key_of(secret)
    if file.public is not None and file.public != public:
        raise ValueError(f"{file.path}: its public key is not the secret key's")
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning(
            "%s: a secret key that other users may read (mode %o): chmod 600 it",
            file.path,
            stat.S_IMODE(mode),
        )
    return public, secret


def read_authorized_keys(path: str | os.PathLike[str]) -> frozenset[bytes]:
    """The frontends' public keys an engine accepts: every ``*.key`` certificate in a
    directory, or the keys in a file (bare, one a line, or a certificate). None is an
    error: an engine that accepts no frontend is a mistake, not a choice."""
    keys: set[bytes] = set()
    if os.path.isdir(path):
        files = sorted(Path(path).glob("*.key"))
        if len(files) > MAX_AUTHORIZED_KEYS:
            raise ValueError(f"{path}: more than {MAX_AUTHORIZED_KEYS} certificates")
        for cert in files:
            keys.add(read_public_key(cert))
        if not keys:
            raise ValueError(f"{path}: a directory without *.key certificates: no key to accept")
        return frozenset(keys)
    file = _KeyFile(path)
    if file.public is not None:
        return frozenset({file.public})
    if file.secret is not None:
        raise ValueError(f"{file.path}: a secret key, not the frontends' public keys")
    if not file.bare:
        raise ValueError(f"{file.path}: no key in it: no frontend could connect")
    return frozenset(file.bare)


def client_keys(
    secret_path: str | os.PathLike[str], server_path: str | os.PathLike[str]
) -> CurveClientKeys:
    """A frontend's keys: its own (secret) and the engine's public key."""
    public, secret = read_secret_key(secret_path)
    return CurveClientKeys(public=public, secret=secret, server=read_public_key(server_path))


def server_keys(
    secret_path: str | os.PathLike[str], authorized_path: str | os.PathLike[str]
) -> CurveServerKeys:
    """An engine's keys: its own (secret) and the frontends' it accepts."""
    public, secret = read_secret_key(secret_path)
    return CurveServerKeys(
        public=public, secret=secret, authorized=read_authorized_keys(authorized_path)
    )


_PUBLIC_BANNER = """#   ZeroMQ CURVE Public Certificate, written by trioserve keygen
#   The public key: give it to the other side (an engine's --curve-authorized-keys,
#   a frontend's --engine-curve-server-key).

"""
_SECRET_BANNER = """#   ZeroMQ CURVE **Secret** Certificate, written by trioserve keygen
#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.

"""


def write_keypair(prefix: str | os.PathLike[str]) -> tuple[str, str]:
    """Make a key pair; write ``PREFIX.key`` (public certificate, mode 0644) and
    ``PREFIX.key_secret`` (both keys, mode 0600, created so: never readable by others,
    not even for a moment). Refuses to overwrite either file (FileExistsError)."""
    public, secret = sodium.crypto_box_keypair()
    public_path, secret_path = f"{prefix}.key", f"{prefix}.key_secret"
    for path in (public_path, secret_path):
        if os.path.lexists(path):
            raise FileExistsError(f"{path} exists: not overwritten")
    z85_public = z85_encode(public)
    secret_text = (
        f'{_SECRET_BANNER}metadata\ncurve\n    public-key = "{z85_public}"\n'
        f'    secret-key = "{z85_encode(secret)}"\n'
    )
    public_text = f'{_PUBLIC_BANNER}metadata\ncurve\n    public-key = "{z85_public}"\n'
    _write_new(secret_path, secret_text, 0o600)
    _write_new(public_path, public_text, 0o644)
    return public_path, secret_path


def _write_new(path: str, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w", encoding="ascii") as file:
        os.fchmod(fd, mode)  # whatever the umask
        file.write(text)
