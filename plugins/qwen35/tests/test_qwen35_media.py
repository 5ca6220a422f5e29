"""Images and video into a Qwen3.5 vision checkpoint, end to end over real HTTP.

Greedy parity is against mlx-vlm's own ``generate`` on the same checkpoint, image
and prompt text; the prompt text comes from the checkpoint's template through the
Hugging Face tokenizer, not from our engine.
"""


import anthropic
import httpx
import mlx.core as mx
import openai
import pytest
from mlx_lm import load as mlx_load
from mlx_lm.generate import generate_step
from mlxbun_qwen35 import fallback_template

from mlxbun_core.testing import media as M
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server

OFF = {"chat_template_kwargs": {"enable_thinking": False}}
PNG_A = M.image_bytes("PNG", size=(64, 48), seed=0)
PNG_B = M.image_bytes("PNG", size=(64, 48), seed=1)


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("qwen3_5", seed=7, vision=True, chat_template=fallback_template())


def ask(client, content, n=10, **kw):
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": content}], max_tokens=n,
        temperature=0, extra_body={"logprobs": True, **OFF, **kw.pop("extra", {})}, **kw)
    return r, [e.model_extra["id"] for e in r.choices[0].logprobs.content]


def reference(srv, ckpt, content, n=10, **media):
    return M.vlm_reference(ckpt, content, srv.engine.model.eos_token_ids, n, **media)


def test_image_greedy_parity_with_mlx_vlm(client, srv, ckpt):
    content = [M.image_part(PNG_A), {"type": "text", "text": "What is in this picture?"}]
    r, ours = ask(client, content)
    assert ours == reference(srv, ckpt, content, image=[M.pil_image(PNG_A)]) and ours
    assert r.usage.prompt_tokens > 20  # the image's soft tokens are counted


def test_two_images_give_different_outputs(client):
    text = {"type": "text", "text": "Describe."}
    _, a = ask(client, [M.image_part(PNG_A), text])
    _, b = ask(client, [M.image_part(PNG_B), text])
    assert a != b


def test_several_images_splice_in_document_order(client, srv, ckpt):
    text = {"type": "text", "text": "Compare these."}
    ab = [M.image_part(PNG_A), text, M.image_part(PNG_B)]
    ba = [M.image_part(PNG_B), text, M.image_part(PNG_A)]
    _, ours_ab = ask(client, ab)
    _, ours_ba = ask(client, ba)
    assert ours_ab == reference(srv, ckpt, ab, image=[M.pil_image(PNG_A), M.pil_image(PNG_B)])
    assert ours_ba == reference(srv, ckpt, ba, image=[M.pil_image(PNG_B), M.pil_image(PNG_A)])
    assert ours_ab != ours_ba


@pytest.mark.parametrize("fmt,mime", [("JPEG", "image/jpeg"), ("WEBP", "image/webp"),
                                      ("GIF", "image/gif"), ("BMP", "image/bmp"),
                                      ("TIFF", "image/tiff"), ("AVIF", "image/avif"),
                                      ("HEIF", "image/heic")])
def test_image_formats_are_served(client, fmt, mime):
    r, ours = ask(client, [M.image_part(M.image_bytes(fmt, size=(40, 40), seed=2), mime),
                           {"type": "text", "text": "Hi"}], n=2)
    assert len(ours) >= 1 and r.usage.prompt_tokens > 10


def test_stream_matches_non_stream(client):
    content = [M.image_part(PNG_A), {"type": "text", "text": "Describe."}]
    full, _ = ask(client, content)
    chunks = list(client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": content}], max_tokens=10,
        temperature=0, stream=True, extra_body=OFF))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content


def test_anthropic_and_openai_forms_give_the_same_reply(client, srv):
    import base64

    r, _ = ask(client, [M.image_part(PNG_A), {"type": "text", "text": "Describe."}])
    a = anthropic.Anthropic(base_url=srv.base_url, api_key="unused", max_retries=0)
    msg = a.messages.create(model="m", max_tokens=10, extra_body={"temperature": 0},
                            thinking={"type": "disabled"}, messages=[{"role": "user", "content": [
                                {"type": "image", "source": {
                                    "type": "base64", "media_type": "image/png",
                                    "data": base64.b64encode(PNG_A).decode()}},
                                {"type": "text", "text": "Describe."}]}])
    assert msg.content[0].text == r.choices[0].message.content


def test_responses_input_image(client):
    r, _ = ask(client, [M.image_part(PNG_A), {"type": "text", "text": "Describe."}])
    resp = client.responses.create(model="m", max_output_tokens=10, temperature=0,
                                   extra_body=OFF, input=[{"role": "user", "content": [
                                       {"type": "input_image",
                                        "image_url": M.data_url(PNG_A, "image/png")},
                                       {"type": "input_text", "text": "Describe."}]}])
    assert resp.output_text == r.choices[0].message.content


def test_video_greedy_parity_with_mlx_vlm(client, srv, ckpt):
    from mlx_vlm.utils import VideoMetadata

    from mlxbun_core.media.decode import decode_video

    clip = M.video_bytes(seconds=2.0, fps=8, size=(64, 48), seed=3)
    content = [{"type": "video_url", "video_url": {"url": M.data_url(clip, "video/mp4")}},
               {"type": "text", "text": "What happens?"}]
    r, ours = ask(client, content)
    v = decode_video(clip)
    meta = VideoMetadata(total_num_frames=v.total_num_frames, fps=v.source_fps,
                         frames_indices=list(v.frames_indices), duration=v.duration_s,
                         height=v.frames.shape[1], width=v.frames.shape[2])
    assert ours == reference(srv, ckpt, content, video=[v.frames], video_metadata=[meta]) and ours
    _, other = ask(client, [{"type": "video", "data": M.data_url(M.video_bytes(seed=4), "")[13:]},
                            {"type": "text", "text": "What happens?"}])
    assert other != ours


def test_audio_is_refused_naming_the_model(client, srv):
    wav = M.wav_bytes(M.tone(0.5))
    import base64

    with pytest.raises(openai.BadRequestError) as info:
        ask(client, [{"type": "input_audio", "input_audio": {
            "data": base64.b64encode(wav).decode(), "format": "wav"}}])
    assert f"model {srv.engine.model.id} does not accept audio input" in str(info.value)


def test_models_row_reports_vision(srv):
    row = httpx.get(srv.v1 + "/models").json()["data"][0]
    assert row["vision"] is True and row["audio"] is False
    assert row["capabilities"]["vision"] is True and row["capabilities"]["audio"] is False


def test_text_only_keeps_mlx_lm_tokens_and_loads_no_tower(ckpt):
    s = start_server(ckpt)
    try:
        c = openai.OpenAI(base_url=s.v1, api_key="unused", max_retries=0)
        msgs = [{"role": "user", "content": "Hello there"}]
        r = c.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0,
                                      extra_body={"logprobs": True, **OFF})
        ours = [e.model_extra["id"] for e in r.choices[0].logprobs.content]
        pipe = s.engine.model.extras.get("media_pipeline")
        assert pipe is None or pipe._vlm is None
    finally:
        s.stop()
    model, tok = mlx_load(str(ckpt))
    prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False,
                                     enable_thinking=False)
    theirs = []
    for t, _ in generate_step(mx.array(tok.encode(prompt, add_special_tokens=False)), model,
                              max_tokens=8):
        theirs.append(t)
        if t in tok.eos_token_ids:
            break
    assert ours == theirs


def test_anthropic_tool_result_image_and_url_source(srv, monkeypatch):
    """The computer-use shape: a screenshot inside a tool_result, here by URL."""
    from mlxbun_core.media import fetch
    from mlxbun_core.testing.media_server import MediaServer

    a = anthropic.Anthropic(base_url=srv.base_url, api_key="unused", max_retries=0)
    tools = [{"name": "screenshot", "description": "Take one", "input_schema": {"type": "object"}}]

    def turn(result):
        return a.messages.create(model="m", max_tokens=4, tools=tools,
                                 extra_body={"temperature": 0},
                                 thinking={"type": "disabled"}, messages=[
            {"role": "user", "content": "Look at the screen."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "screenshot",
                                               "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": result}]}])

    monkeypatch.setattr(fetch.policy, "allow_private", True)
    with MediaServer(routes={"/s.png": (200, {"Content-Type": "image/png"}, PNG_A)}) as host:
        with_image = turn([{"type": "image", "source": {"type": "url", "url": host.url("/s.png")}},
                           {"type": "text", "text": "done"}])
        assert [p for p, _ in host.requests] == ["/s.png"]
    text_only = turn([{"type": "text", "text": "done"}])
    assert with_image.usage.input_tokens > text_only.usage.input_tokens + 3
