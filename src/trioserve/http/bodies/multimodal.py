"""Chat messages with media content parts, translated for the engine.

Accepted parts (OpenAI's, plus the ``audio_url``/``video_url`` spellings other servers
accept):

- ``{"type": "image_url", "image_url": {"url": URL} | URL}``
- ``{"type": "input_audio", "input_audio": {"data": BASE64 | DATA_URI, "format": "wav"}}``
- ``{"type": "audio_url", "audio_url": {"url": URL} | URL}``
- ``{"type": "video_url", "video_url": {"url": URL} | URL}``

Each becomes ``{"type": "image" | "audio" | "video", "media": <media record>}`` in place
(see :mod:`trioserve.http.bodies.media`); text and unknown parts pass unchanged. The submit's
``inputs.modalities`` lists the content modalities (``"text"`` included) in the order they
first appear, so an engine can set up its encoders before reading the messages.
"""

from __future__ import annotations

from typing import Any

from ...protocol import Submit
from .media import AUDIO_FORMATS, Media, MediaFetcher, decode_base64
from .openai import Generation
from .validation import invalid

#: Part types carrying a URL, and the modality of what they point to.
URL_PARTS = {"image_url": "image", "audio_url": "audio", "video_url": "video"}


async def part_media(part: dict[str, Any], loc: str, fetcher: MediaFetcher) -> Media:
    kind = part["type"]
    if kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, dict) or not isinstance(data := audio.get("data"), str):
            raise invalid([{"loc": f"{loc}.input_audio.data", "msg": "expected a base64 string"}])
        if data.lstrip().startswith("data:"):
            return await fetcher.resolve(data, "audio", f"{loc}.input_audio.data")
        fmt = audio.get("format")
        mime = AUDIO_FORMATS.get(fmt.lower(), "audio/wav") if isinstance(fmt, str) else "audio/wav"
        return Media("audio", mime, data=await decode_base64(data, f"{loc}.input_audio.data"))
    value = part.get(kind)
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str):
        raise invalid([{"loc": f"{loc}.{kind}.url", "msg": "expected a URL string"}])
    return await fetcher.resolve(url, URL_PARTS[kind], f"{loc}.{kind}.url")


async def translate_messages(
    messages: list[dict[str, Any]], fetcher: MediaFetcher
) -> tuple[list[dict[str, Any]], list[str]]:
    """``messages`` with their media parts resolved, and the modalities in first-seen order."""
    modalities: list[str] = []

    def seen(modality: str) -> None:
        if modality not in modalities:
            modalities.append(modality)

    out = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, str):
            seen("text")
        elif isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                kind = part.get("type")
                if kind == "text":
                    seen("text")
                elif kind == "input_audio" or kind in URL_PARTS:
                    media = await part_media(part, f"$.messages[{i}].content[{j}]", fetcher)
                    seen(media.modality)
                    part = {"type": media.modality, "media": media.record()}
                parts.append(part)
            message = {**message, "content": parts}
        out.append(message)
    return out, modalities


async def resolve_parts(
    submit: Submit, where: tuple[tuple[int, int, str], ...], fetcher: MediaFetcher
) -> Submit:
    """``submit`` with the image parts at ``where`` ((message index, part index, JSON
    path of the part in the client's body) in ``inputs.messages``) fetched or decoded into
    media records (as chat's ``image_url`` parts are), and the modalities the engine will
    read, in the order they first appear, in ``inputs.modalities``: the routes whose
    bodies are not chat's (the Responses API, Anthropic's Messages) say where their media
    came from, so an error names the client's own field."""
    at = {(m, p): loc for m, p, loc in where}
    modalities: list[str] = []
    messages = []
    for m, message in enumerate(submit.inputs["messages"]):
        content = message.get("content")
        if type(content) is not list:
            parts = None
            if "text" not in modalities:
                modalities.append("text")
        else:
            parts = []
            for p, part in enumerate(content):
                loc = at.get((m, p))
                modality = "text"
                if loc is not None:
                    media = await part_media(part, loc, fetcher)
                    modality = media.modality
                    part = {"type": modality, "media": media.record()}
                if modality not in modalities:
                    modalities.append(modality)
                parts.append(part)
        messages.append(message if parts is None else {**message, "content": parts})
    return submit.with_inputs({"messages": messages, "modalities": modalities})


async def resolve_chat_media(generation: Generation, fetcher: MediaFetcher) -> Generation:
    """The chat ``generation`` with its media resolved (other capabilities unchanged)."""
    if generation.capability != "chat":
        return generation
    submit = generation.submit
    messages, modalities = await translate_messages(submit.inputs["messages"], fetcher)
    inputs = {**submit.inputs, "messages": messages, "modalities": modalities}
    return generation.with_submit(submit.with_inputs(inputs))
