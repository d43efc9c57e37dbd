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
timeout per fetch.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
import re
import urllib.parse
from typing import Any

import attrs
import httpx
import trio

from ...errors import HTTPError

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


class MediaFetcher:
    """Resolves media URLs for one request; remote fetches share one byte budget."""

    def __init__(self, *, allow_remote: bool, max_bytes: int, timeout: float) -> None:
        self.allow_remote = allow_remote
        self.budget = max_bytes
        self.max_bytes = max_bytes
        self.timeout = timeout

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

    async def _fetch(self, url: str, modality: str, loc: str) -> Media:
        too_large = bad_media(
            f"{loc}: remote media exceed {self.max_bytes} bytes", "media_too_large", loc
        )
        chunks: list[bytes] = []
        with trio.move_on_after(self.timeout) as scope:
            try:
                async with (
                    httpx.AsyncClient(
                        follow_redirects=True, max_redirects=MAX_REDIRECTS, timeout=None
                    ) as client,
                    client.stream("GET", url) as response,
                ):
                    if response.status_code != 200:
                        raise bad_media(
                            f"{loc}: fetching the media answered {response.status_code}",
                            "media_fetch_failed",
                            loc,
                        )
                    declared = response.headers.get("content-length", "")
                    if declared.isdigit() and int(declared) > self.budget:
                        raise too_large
                    async for chunk in response.aiter_bytes():
                        self.budget -= len(chunk)
                        if self.budget < 0:
                            raise too_large
                        chunks.append(chunk)
                    content_type = response.headers.get("content-type", "")
            except httpx.HTTPError as exc:
                raise bad_media(
                    f"{loc}: fetching the media failed ({type(exc).__name__})",
                    "media_fetch_failed",
                    loc,
                ) from None
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
