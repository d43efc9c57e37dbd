"""Media in requests: data URIs, remote ``http(s)`` URLs and uploads, as one record.

Every image, audio clip or video a request carries reaches the engine as a *media record*
(a map in ``Submit.inputs``, see docs/protocol.md):
``{"modality", "mime_type", "data": bin}`` for media sent inline (data URIs, base64
fields, fetched URLs), or ``{"modality", "mime_type", "path", "filename"}`` for uploaded
files, which live under ``--upload-dir`` until the request ends.

Data URIs are decoded leniently (whitespace inside base64 is ignored, padding may be
missing, the URL-safe alphabet is accepted); anything else that is not base64 is a 400.
Large payloads are decoded :data:`DECODE_STEP` characters at a time, letting other tasks
run in between: the lenient path is slow (docs/security.md has its cost per MiB), and a
body may hold 128 MiB.
Remote URLs are fetched only with ``--allow-remote-media`` (off by default: a server that
fetches any URL a client names is an SSRF hole), within a byte budget per request and a
timeout per fetch. Even then, only public addresses are fetched: each hop's host is
resolved here, every address it resolves to must be global unicast (no loopback,
link-local such as the cloud metadata address, private, shared, multicast, reserved) or
in a network of ``--remote-media-allow``, and the connection goes to the address that was
checked (a name that resolves again to another address is not asked twice). Redirects
are followed here, each one checked the same way. Whatever fails answers one
``media_fetch_failed`` that says neither the status nor the error, so the server cannot be
used to learn which hosts or ports answer; the reason is logged. A fetch asks for the
media as they are (``Accept-Encoding: identity``); a host that compresses them anyway
(gzip, deflate) is inflated here within the request's budget, never past it (httpx
inflated each read whole: 64 KiB of gzip became 64 MiB held before the budget was
checked); any other encoding is refused.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import logging
import mimetypes
import re
import socket
import urllib.parse
import zlib
from typing import Any

import attrs
import httpx
import trio

from ..errors import HTTPError

log = logging.getLogger("trioserve.media")

#: Media type assumed when neither the client nor the URL says one.
DEFAULT_MIME = {"image": "image/png", "audio": "audio/wav", "video": "video/mp4"}
#: ``input_audio.format`` values and their media types.
AUDIO_FORMATS = {
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "flac": "audio/flac",
    "ogg": "audio/ogg",
    "opus": "audio/opus",
    "aac": "audio/aac",
    "pcm": "audio/pcm",
    "pcm16": "audio/pcm",
    "webm": "audio/webm",
    "m4a": "audio/mp4",
}
#: Redirects followed by a remote fetch (each one is a new URL the server fetches).
MAX_REDIRECTS = 3
#: Statuses that redirect (their ``Location`` is fetched next, checked like the first).
REDIRECTS = frozenset({301, 302, 303, 307, 308})

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Characters of base64 text decoded in one go (a multiple of 4) before other tasks run.
DECODE_STEP = 1 << 18

_WHITESPACE = re.compile(r"\s+")
_URL_SAFE = str.maketrans("-_", "+/")


@attrs.frozen
class Media:
    modality: str  # "image", "audio", "video"
    mime_type: str
    data: bytes | None = None
    path: str | None = None
    filename: str | None = None

    def record(self) -> dict[str, Any]:
        """The media record sent to the engine."""
        out: dict[str, Any] = {"modality": self.modality, "mime_type": self.mime_type}
        if self.path is not None:
            out["path"] = self.path
            out["filename"] = self.filename
        else:
            out["data"] = self.data
        return out


def _inflater(encoding: str | None) -> Any:
    """A decompressor for a fetched body's ``Content-Encoding`` (None: as it is); the
    refusal of an encoding this server does not inflate within a budget."""
    name = (encoding or "identity").strip().lower()
    if name in ("", "identity"):
        return None
    if name in ("gzip", "x-gzip", "deflate"):
        return zlib.decompressobj(32 + zlib.MAX_WBITS)  # a gzip or a zlib header
    raise _Refused(f"content-encoding {name[:40]!r}")


def _inflate(inflater: Any, data: bytes, limit: int) -> bytes:
    """At most ``limit`` bytes of ``data`` inflated (more would be past the budget)."""
    try:
        inflated: bytes = inflater.decompress(data, limit)
    except zlib.error:
        raise _Refused("a body that does not inflate") from None
    return inflated


def bad_media(message: str, code: str = "invalid_media", param: str | None = None) -> HTTPError:
    if param is not None:
        param = param.removeprefix("$.")
    return HTTPError(400, message, code, param=param)


async def decode_base64(text: str, what: str = "media") -> bytes:
    """Lenient base64: whitespace ignored, padding optional, standard or URL-safe.
    Decoded :data:`DECODE_STEP` characters at a time, with a checkpoint between steps."""
    out = []
    rest = ""  # the characters of an incomplete group, for the next step
    try:
        for start in range(0, len(text), DECODE_STEP):
            if start:
                await trio.lowlevel.checkpoint()
            chunk = rest + _WHITESPACE.sub("", text[start : start + DECODE_STEP]).translate(
                _URL_SAFE
            )
            if start + DECODE_STEP < len(text):
                whole = len(chunk) - len(chunk) % 4
                chunk, rest = chunk[:whole], chunk[whole:]
                out.append(base64.b64decode(chunk, validate=True))
            else:
                rest = chunk
        rest = rest.rstrip("=")
        out.append(base64.b64decode(rest + "=" * (-len(rest) % 4), validate=True))
    except (binascii.Error, ValueError):
        raise bad_media(f"{what} is not valid base64") from None
    return out[0] if len(out) == 1 else b"".join(out)


async def decode_data_uri(uri: str, modality: str) -> Media:
    """``data:[<type>][;param…][;base64],<payload>`` → :class:`Media`."""
    head, sep, payload = uri[len("data:") :].partition(",")
    if not sep:
        raise bad_media("a data URI needs a ',' before its payload")
    params = [p.strip() for p in head.split(";")]
    mime = params[0].lower() or DEFAULT_MIME[modality]
    if any(p.lower() == "base64" for p in params[1:]):
        data = await decode_base64(payload, "the data URI's payload")
    else:
        data = urllib.parse.unquote_to_bytes(payload)
    return Media(modality, mime, data=data)


def parse_networks(values: list[str]) -> list[IPNetwork]:
    """``--remote-media-allow`` values (``10.0.0.0/8``, ``fd00::/8``, one address) as
    networks; ValueError (a message for the command line) for one that is not."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(
                f"--remote-media-allow {value!r} is not an address or a network (CIDR)"
            ) from None
    return networks


def is_public(address: IPAddress) -> bool:
    """Whether ``address`` is one remote media may come from without an allow-list: global
    unicast (an IPv4 address mapped into IPv6 judged as itself)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


class _Refused(Exception):
    """A hop the fetcher will not make or that failed; ``reason`` is for the log only."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class MediaFetcher:
    """Resolves media URLs for one request; remote fetches share one byte budget.
    ``allowed``: networks fetched from although not public (``--remote-media-allow``)."""

    def __init__(
        self,
        *,
        allow_remote: bool,
        max_bytes: int,
        timeout: float,
        allowed: list[IPNetwork] | None = None,
    ) -> None:
        self.allow_remote = allow_remote
        self.budget = max_bytes
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.allowed = allowed or []

    async def resolve(self, url: Any, modality: str, loc: str) -> Media:
        if not isinstance(url, str) or not url.strip():
            raise bad_media(f"{loc}: expected a URL string", param=loc)
        url = url.strip()
        scheme = url.partition(":")[0].lower()
        if scheme == "data":
            return await decode_data_uri(url, modality)
        if scheme not in ("http", "https"):
            raise bad_media(
                f"{loc}: unsupported URL scheme {scheme!r} (data:, and http(s): when the "
                "server allows remote media)",
                "invalid_media_url",
                loc,
            )
        if not self.allow_remote:
            raise bad_media(
                f"{loc}: remote media URLs are disabled on this server (send a data: URI, "
                "or start the server with --allow-remote-media)",
                "remote_media_disabled",
                loc,
            )
        return await self._fetch(url, modality, loc)

    def _allows(self, address: IPAddress) -> bool:
        return is_public(address) or any(address in network for network in self.allowed)

    async def _address(self, host: str, port: int) -> str:
        """The address to connect to for ``host``: every address it resolves to checked
        (one that may not be fetched from refuses the host: a name that resolves to a
        public and a private address is not tried on either)."""
        try:
            infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise _Refused(f"{host} does not resolve ({exc})") from None
        addresses = [ipaddress.ip_address(str(info[4][0]).partition("%")[0]) for info in infos]
        refused = [str(a) for a in addresses if not self._allows(a)]
        if refused or not addresses:
            raise _Refused(
                f"{host} resolves to {', '.join(refused) or 'nothing'}, not a public address "
                "(--remote-media-allow lets a network be fetched from)"
            )
        return str(addresses[0])

    async def _fetch(self, url: str, modality: str, loc: str) -> Media:
        too_large = bad_media(
            f"{loc}: remote media exceed {self.max_bytes} bytes", "media_too_large", loc
        )
        chunks: list[bytes] = []
        content_type = ""
        with trio.move_on_after(self.timeout) as scope:
            try:
                # trust_env off: a proxy from the environment would connect for us, to
                # addresses never checked here.
                async with httpx.AsyncClient(
                    follow_redirects=False, timeout=None, trust_env=False
                ) as client:
                    for _ in range(MAX_REDIRECTS + 1):
                        target = urllib.parse.urlsplit(url)
                        if target.scheme not in ("http", "https") or not target.hostname:
                            raise _Refused(f"not an http(s) URL with a host: {url[:200]}")
                        port = target.port or (443 if target.scheme == "https" else 80)
                        address = await self._address(target.hostname, port)
                        # To the address checked, under the URL's name (Host, and for TLS
                        # the name the certificate is checked against).
                        request = client.build_request(
                            "GET",
                            httpx.URL(url).copy_with(host=address),
                            headers={
                                "host": target.netloc.rpartition("@")[2],
                                "accept-encoding": "identity",
                            },
                            extensions={"sni_hostname": target.hostname},
                        )
                        response = await client.send(request, stream=True)
                        try:
                            if response.status_code in REDIRECTS:
                                location = response.headers.get("location")
                                if not location:
                                    raise _Refused(f"{response.status_code} without Location")
                                url = urllib.parse.urljoin(url, location)
                                continue
                            if response.status_code != 200:
                                raise _Refused(f"answered {response.status_code}")
                            declared = response.headers.get("content-length", "")
                            if declared.isdigit() and int(declared) > self.budget:
                                raise too_large
                            inflater = _inflater(response.headers.get("content-encoding"))
                            async for raw in response.aiter_raw():
                                # Inflated at most one byte past the budget: enough to
                                # know it is exceeded, never the whole bomb.
                                chunk = (
                                    raw
                                    if inflater is None
                                    else _inflate(inflater, raw, max(self.budget, 0) + 1)
                                )
                                self.budget -= len(chunk)
                                if self.budget < 0:
                                    raise too_large
                                chunks.append(chunk)
                            content_type = response.headers.get("content-type", "")
                            break
                        finally:
                            await response.aclose()
                    else:
                        raise _Refused(f"more than {MAX_REDIRECTS} redirects")
            except _Refused as refused:
                raise self._failed(loc, url, refused.reason) from None
            except httpx.HTTPError as exc:
                raise self._failed(loc, url, type(exc).__name__) from None
        if scope.cancelled_caught:
            raise bad_media(
                f"{loc}: fetching the media took longer than {self.timeout:g} s",
                "media_fetch_timeout",
                loc,
            )
        mime = content_type.split(";")[0].strip().lower()
        if not mime or mime == "application/octet-stream":
            path = urllib.parse.urlsplit(url).path
            mime = mimetypes.guess_type(path)[0] or DEFAULT_MIME[modality]
        return Media(modality, mime, data=b"".join(chunks))

    def _failed(self, loc: str, url: str, reason: str) -> HTTPError:
        """One answer for every failure: what failed is the operator's to read, not the
        client's (a status or an error name would tell which hosts and ports answer)."""
        log.info("remote media %s not fetched: %s", _loggable_url(url), reason)
        return bad_media(f"{loc}: the media URL could not be fetched", "media_fetch_failed", loc)


def _loggable_url(url: str) -> str:
    """``url`` without its query and credentials, cut short, for a log line."""
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}"[:200].encode("unicode_escape").decode("ascii")
