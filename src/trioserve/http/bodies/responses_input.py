"""The Responses API's ``input`` as chat messages: a string (one user message), or a list
of items: messages whose content is a string or ``input_text``/``output_text``/
``input_image`` parts, ``function_call`` items (an assistant's ``tool_calls``),
``function_call_output`` items (``tool`` messages) and ``reasoning`` items (the next
assistant message's ``reasoning``). Each bad item is an error at its path."""

from __future__ import annotations

from typing import Any

from .openai import MAX_MESSAGES, check_parts
from .validation import Errors, _json_type, invalid

#: Roles an input message may have.
INPUT_ROLES = frozenset({"user", "assistant", "system", "developer"})


def _text_part(part: dict[str, Any], loc: str, errors: Errors) -> dict[str, Any] | None:
    text = part.get("text")
    if type(text) is not str:
        errors.add("expected a string", f"{loc}.text")
        return None
    return {"type": "text", "text": text}


def _image_part(part: dict[str, Any], loc: str, errors: Errors) -> dict[str, Any] | None:
    url = part.get("image_url")
    if part.get("file_id") is not None:
        errors.add(
            "file ids are not served: send image_url (a URL or a data: URI)", f"{loc}.file_id"
        )
        return None
    if type(url) is not str:
        errors.add("expected a URL string", f"{loc}.image_url")
        return None
    return {"type": "image_url", "image_url": {"url": url}}


_PARTS = {"input_text": _text_part, "output_text": _text_part, "input_image": _image_part}


def chat_messages(
    instructions: str | None, items: Any, errors: Errors
) -> tuple[list[dict[str, Any]], list[tuple[int, int, str]]]:
    """The chat messages of a request's ``instructions`` (first) and ``input``
    (``items``), and where their media parts are (message, part, location)."""
    messages: list[dict[str, Any]] = []
    media: list[tuple[int, int, str]] = []
    if instructions is not None:
        messages.append({"role": "system", "content": instructions})
    if type(items) is str:
        messages.append({"role": "user", "content": items})
        return messages, media
    if type(items) is not list:
        errors.add(
            f"expected a string or a list of input items, got {_json_type(items)}", "$.input"
        )
        return messages, media
    if not items:
        errors.add("at least one input item is required", "$.input")
    if len(items) > MAX_MESSAGES:
        raise invalid([{"loc": "$.input", "msg": f"at most {MAX_MESSAGES} input items"}])
    parts_total = 0
    #: A reasoning item's text, for the assistant message after it.
    reasoning: str | None = None
    for i, item in enumerate(items):
        loc = f"$.input[{i}]"
        if type(item) is not dict:
            errors.add(f"expected an object, got {_json_type(item)}", loc)
            continue
        kind = item.get("type", "message")
        if kind != "message":
            if type(kind) is str and kind in _ITEMS:
                reasoning = _ITEMS[kind](item, loc, messages, reasoning, errors)
            else:
                errors.add(
                    f"input items of type {str(kind)[:40]!r} are not served (messages, "
                    "function_call, function_call_output and reasoning are)",
                    f"{loc}.type",
                )
            continue
        role = item.get("role")
        if type(role) is not str or role not in INPUT_ROLES:
            errors.add(f"expected one of {', '.join(sorted(INPUT_ROLES))}", f"{loc}.role")
            continue
        content = item.get("content")
        if type(content) is str:
            messages.append(_with_reasoning({"role": role, "content": content}, reasoning))
            reasoning = None
            continue
        if type(content) is not list:
            errors.add("expected a string or a list of content parts", f"{loc}.content")
            continue
        parts_total += len(content)
        check_parts(len(content), parts_total, f"{loc}.content", "item")
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(content):
            part_loc = f"{loc}.content[{j}]"
            kind = part.get("type") if type(part) is dict else None
            convert = _PARTS.get(kind) if type(kind) is str else None
            if convert is None:
                errors.add(
                    "expected a part of type input_text, output_text or input_image",
                    f"{part_loc}.type",
                )
                continue
            converted = convert(part, part_loc, errors)
            if converted is None:
                continue
            if converted["type"] == "image_url":
                media.append((len(messages), len(parts), part_loc))
            parts.append(converted)
        messages.append(_with_reasoning({"role": role, "content": parts}, reasoning))
        reasoning = None
    return messages, media


def _with_reasoning(message: dict[str, Any], reasoning: str | None) -> dict[str, Any]:
    if reasoning is not None and message["role"] == "assistant":
        message["reasoning"] = reasoning
    return message


def _assistant(messages: list[dict[str, Any]], reasoning: str | None) -> dict[str, Any]:
    """The assistant message a call belongs to: the last message if it is the
    assistant's (its text, or the calls before this one), else a new one."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and reasoning is None:
        return last
    message = _with_reasoning({"role": "assistant", "content": None}, reasoning)
    messages.append(message)
    return message


def _function_call(
    item: dict[str, Any],
    loc: str,
    messages: list[dict[str, Any]],
    reasoning: str | None,
    errors: Errors,
) -> str | None:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if type(call_id) is not str or type(name) is not str or type(arguments) is not str:
        errors.add("a function_call has a string call_id, name and arguments", loc)
        return reasoning
    message = _assistant(messages, reasoning)
    message.setdefault("tool_calls", []).append(
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    )
    return None


def _function_call_output(
    item: dict[str, Any],
    loc: str,
    messages: list[dict[str, Any]],
    reasoning: str | None,
    errors: Errors,
) -> str | None:
    call_id, output = item.get("call_id"), item.get("output")
    if type(call_id) is not str:
        errors.add("expected the call_id of the function_call it answers", f"{loc}.call_id")
        return reasoning
    if type(output) is list:  # input_text parts (images in a call's output: not served)
        texts = [p.get("text") for p in output if type(p) is dict]
        if not all(type(text) is str for text in texts) or len(texts) != len(output):
            errors.add("expected a string or input_text parts", f"{loc}.output")
            return reasoning
        output = "".join(str(text) for text in texts)
    if type(output) is not str:
        errors.add("expected a string", f"{loc}.output")
        return reasoning
    messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
    return reasoning


def _reasoning_item(
    item: dict[str, Any],
    loc: str,
    messages: list[dict[str, Any]],
    reasoning: str | None,
    errors: Errors,
) -> str | None:
    texts = []
    for field in ("content", "summary"):
        for part in item.get(field) or ():
            if type(part) is not dict or type(part.get("text")) is not str:
                errors.add("expected parts with a text", f"{loc}.{field}")
                return reasoning
            texts.append(part["text"])
        if texts:
            break  # the content if it has one, else the summary
    return "".join(texts)


#: How each input item other than a message joins the chat messages: it returns the
#: reasoning waiting for the next assistant message.
_ITEMS = {
    "function_call": _function_call,
    "function_call_output": _function_call_output,
    "reasoning": _reasoning_item,
}
