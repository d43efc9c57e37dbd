"""Stop strings, matched as vLLM matches them (``vllm/v1/engine/detokenizer.py``,
``check_stop_strings``): only where new text could complete a stop string is searched; of
several matches, the one that ends earliest in the text wins (ties: the order of the stop
list); the text is cut before the stop string, or after it with
``include_stop_str_in_output``."""

from __future__ import annotations

import sys


def check_stop_strings(
    output_text: str, new_char_count: int, stop: list[str], include_in_output: bool
) -> tuple[str, int] | None:
    """The stop string that ``new_char_count`` new characters at the end of
    ``output_text`` complete, and the length to cut the text to (``-1``: no cut); ``None``
    if none."""
    if not new_char_count or not stop:
        return None
    best: str | None = None
    best_index = 0
    best_end = sys.maxsize
    for candidate in stop:
        # Only where the new characters could complete it (a negative start counts from
        # the end, as vLLM's does).
        index = output_text.find(candidate, 1 - new_char_count - len(candidate))
        if index == -1:
            continue
        end = index + len(candidate)
        if end < best_end:
            best, best_index, best_end = candidate, index, end
    if best is None:
        return None
    if include_in_output:
        return (best, -1) if best_end >= len(output_text) else (best, best_end)
    return best, best_index


def hold_back(stop: list[str], include_in_output: bool) -> int:
    """Characters a stream holds back until the request ends, so that a stop string that
    is still being completed is never sent (vLLM's ``output_text_buffer_length``)."""
    if stop and not include_in_output:
        return max(len(s) for s in stop) - 1
    return 0
