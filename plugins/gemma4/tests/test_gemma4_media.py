"""Images and audio into a Gemma 4 checkpoint with vision and audio towers, over HTTP.

Greedy parity is against mlx-vlm's own ``generate`` on the same checkpoint, media
and prompt text (rendered by the checkpoint's template through the HF tokenizer).
"""

import base64

import httpx
import numpy as np
import openai
import pytest
from mlxbun_gemma4 import fallback_template

from mlxbun_core.media.decode import decode_audio
from mlxbun_core.testing import media as M
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server

PNG_A = M.image_bytes("PNG", size=(64, 48), seed=0)
PNG_B = M.image_bytes("PNG", size=(64, 48), seed=2)
WAV = M.wav_bytes(M.tone(1.0, rate=16_000, freq=440))


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("gemma4", seed=2, vision=True, audio=True,
                           chat_template=fallback_template())


def audio_part(data: bytes, fmt="wav"):
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(),
                                                   "format": fmt}}


def ask(client, content, n=10):
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}],
                                       max_tokens=n, temperature=0, extra_body={"logprobs": True})
    return r, [e.model_extra["id"] for e in r.choices[0].logprobs.content]


def reference(srv, ckpt, content, n=10, **media):
    return M.vlm_reference(ckpt, content, srv.engine.model.eos_token_ids, n, **media)


def test_image_greedy_parity_with_mlx_vlm(client, srv, ckpt):
    content = [M.image_part(PNG_A), {"type": "text", "text": "What is in this picture?"}]
    r, ours = ask(client, content)
    assert ours == reference(srv, ckpt, content, image=[M.pil_image(PNG_A)]) and ours
    assert r.usage.prompt_tokens > 16  # 16 soft tokens plus the markers and the text


def test_two_images_give_different_outputs(client):
    text = {"type": "text", "text": "Describe."}
    first = ask(client, [M.image_part(PNG_A), text])[1]
    assert first != ask(client, [M.image_part(PNG_B), text])[1]


def test_audio_greedy_parity_with_mlx_vlm(client, srv, ckpt):
    content = [audio_part(WAV), {"type": "text", "text": "Transcribe this audio."}]
    r, ours = ask(client, content)
    assert ours == reference(srv, ckpt, content, audio=[decode_audio(WAV)]) and ours
    # one second of audio is ceil(1000 / 40) = 25 soft tokens, plus its two markers (and
    # the text around them may split into a token more or less)
    short, _ = ask(client, [{"type": "text", "text": "Transcribe this audio."}], n=1)
    assert 0 <= r.usage.prompt_tokens - (short.usage.prompt_tokens + 25 + 2) <= 2


def test_compressed_audio_and_the_audio_url_alias(client, srv, ckpt):
    mp3 = M.encoded_audio(M.tone(1.0, rate=22_050, freq=300), 22_050, "mp3", "mp3")
    content = [{"type": "audio_url", "audio_url": {"url": M.data_url(mp3, "audio/mpeg")}},
               {"type": "text", "text": "What do you hear?"}]
    _, ours = ask(client, content)
    assert ours == reference(srv, ckpt, content, audio=[decode_audio(mp3)])
    noise = np.random.default_rng(0).standard_normal((16_000, 1)) * 0.3  # same length, other sound
    _, other = ask(client, [audio_part(M.wav_bytes(noise)),
                            {"type": "text", "text": "What do you hear?"}])
    assert other != ours


def test_image_and_audio_mixed_in_document_order(client, srv, ckpt):
    content = [audio_part(WAV), {"type": "text", "text": "and"}, M.image_part(PNG_A),
               {"type": "text", "text": "together?"}]
    _, ours = ask(client, content)
    assert ours == reference(srv, ckpt, content, image=[M.pil_image(PNG_A)],
                             audio=[decode_audio(WAV)])


def test_video_is_refused_naming_the_model(client, srv):
    clip = M.video_bytes(seconds=1.0)
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, [{"type": "video_url", "video_url": {"url": M.data_url(clip, "video/mp4")}}])
    assert f"model {srv.engine.model.id} does not accept video input" in str(info.value)
    with pytest.raises(openai.BadRequestError, match="video and audio content parts cannot"):
        ask(client, [audio_part(WAV), {"type": "video", "data": base64.b64encode(clip).decode()}])


def test_undecodable_media_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="audio could not be decoded"):
        ask(client, [audio_part(b"not audio at all" * 20)])
    with pytest.raises(openai.BadRequestError, match="image could not be decoded"):
        ask(client, [M.image_part(b"not an image")])
    with pytest.raises(openai.BadRequestError, match="malformed data URL"):
        ask(client, [{"type": "image_url", "image_url": {"url": "data:image/png;base64"}}])
    r, _ = ask(client, [{"type": "text", "text": "still fine"}], n=2)  # the next one is served
    assert r.choices[0].finish_reason in ("stop", "length")


def test_models_row_reports_vision_and_audio(srv):
    row = httpx.get(srv.v1 + "/models").json()["data"][0]
    assert (row["vision"], row["audio"], row["video"]) == (True, True, False)


def test_checkpoint_without_audio_tower_refuses_audio():
    s = start_server(tiny_checkpoint("gemma4", seed=2, vision=True,
                                     chat_template=fallback_template()))
    try:
        c = openai.OpenAI(base_url=s.v1, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="does not accept audio input"):
            ask(c, [audio_part(WAV)])
        row = httpx.get(s.v1 + "/models").json()["data"][0]
        assert (row["vision"], row["audio"]) == (True, False)
        assert ask(c, [M.image_part(PNG_A), {"type": "text", "text": "Hi"}], n=2)[1]
    finally:
        s.stop()
