"""``POST /v1/audio/speech``: WAV with a correct header around the engine's PCM, or PCM."""

from __future__ import annotations

import io
import struct
import wave

import httpx
import openai
import pytest

from trioserve.engine_programs.mock import SPEECH_RATE, speech_chunks

TEXT = "the quick brown fox"
PCM = b"".join(speech_chunks(TEXT))


async def test_wav_wraps_the_engine_pcm_in_a_correct_header(frontend):
    async with frontend.client() as client:
        response = await client.post("/v1/audio/speech", json={"input": TEXT, "voice": "alloy"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "audio/wav"
    with wave.open(io.BytesIO(response.content)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, SPEECH_RATE)
        assert wav.getnframes() == len(PCM) // 2
        assert wav.readframes(wav.getnframes()) == PCM
    riff, size, wave_tag = struct.unpack("<4sI4s", response.content[:12])
    assert (riff, wave_tag, size) == (b"RIFF", b"WAVE", len(response.content) - 8)


async def test_pcm_is_the_samples_as_they_are(frontend):
    async with frontend.client() as client:
        response = await client.post(
            "/v1/audio/speech", json={"input": TEXT, "response_format": "pcm"}
        )
    assert response.content == PCM
    assert response.headers["content-type"].startswith("audio/pcm;rate=24000")


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "WAVE"])
async def test_other_formats_are_400_naming_the_supported_ones(frontend, fmt):
    async with frontend.client() as client:
        response = await client.post(
            "/v1/audio/speech", json={"input": TEXT, "response_format": fmt}
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "unsupported_response_format" and error["param"] == "response_format"
    assert "wav, pcm" in error["message"]


@pytest.mark.parametrize(("fmt", "header"), [("wav", 44), ("pcm", 0)])
async def test_streamed_audio_arrives_as_it_is_made(frontend, fmt, header):
    async with frontend.client() as client:
        response = await client.post(
            "/v1/audio/speech", json={"input": TEXT, "response_format": fmt, "stream": "true"}
        )
    assert response.status_code == 200
    assert "content-length" not in response.headers
    assert response.content[header:] == PCM
    if fmt == "wav":
        # Unknown length when the header left: the sizes streaming encoders write.
        assert struct.unpack("<I", response.content[4:8]) == (0xFFFFFFFF,)
        assert struct.unpack("<I", response.content[40:44]) == (0xFFFFFFFF,)


async def test_a_failure_mid_stream_breaks_the_body_instead_of_ending_it(frontend):
    body = {"input": TEXT, "stream": True, "mock_error_after": 2}
    async with frontend.client() as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post("/v1/audio/speech", json=body)
    assert frontend.engine.stats.aborts_received == 0


@pytest.mark.parametrize(
    ("body", "loc"),
    [({"voice": "x"}, "$.input"), ({"input": "x", "speed": 9}, "$.speed"),
     ({"input": "x", "speed": "fast"}, "$.speed")],
)  # fmt: skip
async def test_invalid_bodies_are_422(frontend, body, loc):
    async with frontend.client() as client:
        response = await client.post("/v1/audio/speech", json=body)
    assert response.status_code == 422
    assert response.json()["error"]["details"][0]["loc"] == loc


async def test_official_client(frontend):
    client = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="x", max_retries=0)
    async with client:
        speech = await client.audio.speech.create(
            model="mock", voice="alloy", input=TEXT, response_format="wav"
        )
        content = speech.content
    with wave.open(io.BytesIO(content)) as wav:
        assert wav.readframes(wav.getnframes()) == PCM
