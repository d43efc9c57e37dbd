"""The mock engine's media: a valid PNG, a PCM sine tone, an ftyp-led video payload."""

from __future__ import annotations

import struct

from tests.helpers.media import png_info
from trioserve.engine_programs.mock import (
    SPEECH_CHUNK_SAMPLES,
    mock_image,
    mock_video,
    png_image,
    speech_chunks,
)
from trioserve.protocol import OutputItem, decode, encode
from trioserve.protocol.messages import Outputs


def test_png_is_valid_and_of_the_asked_size_and_colour():
    width, height, raw = png_info(png_image(5, 3, (10, 20, 30)))
    assert (width, height) == (5, 3)
    assert raw == (b"\x00" + bytes((10, 20, 30)) * 5) * 3


def test_images_depend_on_prompt_seed_and_source():
    assert mock_image("a", 1) == mock_image("a", 1)
    assert len({mock_image("a", 1), mock_image("a", 2), mock_image("b", 1)}) == 3
    assert mock_image("a", 1, None, b"src") != mock_image("a", 1)
    assert png_info(mock_image("a", 1, "1000x2"))[:2] == (256, 2)


def test_speech_is_a_continuous_sine_tone_one_chunk_per_word():
    chunks = speech_chunks("one two three")
    assert len(chunks) == 3 and len(speech_chunks("")) == 1
    samples = struct.unpack(f"<{3 * SPEECH_CHUNK_SAMPLES}h", b"".join(chunks))
    assert samples[0] == 0 and max(samples) > 9000 and min(samples) < -9000


def test_video_starts_with_an_ftyp_box_and_grows_with_frames():
    video = mock_video("p", 0, 4, 8.0)
    assert video[4:12] == b"ftypisom"
    assert len(mock_video("p", 0, 5, 8.0)) > len(video)


def test_mime_type_crosses_the_wire_and_is_left_out_when_unset():
    item = OutputItem("r", 0, modality="image", data=b"\x89PNG", mime_type="image/png")
    assert decode(encode(Outputs([item]))) == Outputs([item])
    assert b"mime_type" not in encode(Outputs([OutputItem("r", 0, data="x")]))
