"""Media through the generic plugin (a Qwen3-VL checkpoint no family claims), the
destination policy of a live server, and the event loop staying free."""

import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from mlxbun_core import cli, startup
from mlxbun_core.media import fetch
from mlxbun_core.testing import media as M
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.media_server import MediaServer, slow
from mlxbun_core.testing.vision import QWEN_VL_TEMPLATE

PNG = M.image_bytes("PNG", size=(64, 48), seed=0)


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("qwen3_vl", seed=4, vision=True, chat_template=QWEN_VL_TEMPLATE)


@pytest.fixture
def images():
    with MediaServer("127.0.0.1", {"/a.png": (200, {"Content-Type": "image/png"}, PNG)}) as s:
        yield s


def ask(client, content, n=8):
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}],
                                       max_tokens=n, temperature=0, extra_body={"logprobs": True})
    return r, [e.model_extra["id"] for e in r.choices[0].logprobs.content]


def url_part(url):
    return [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Describe."}]


def test_generic_plugin_serves_images_with_mlx_vlm_parity(client, srv, ckpt):
    assert srv.engine.model.family == "generic"
    content = [{"type": "image_url", "image_url": {"url": M.data_url(PNG, "image/png")}},
               {"type": "text", "text": "Describe."}]
    _, ours = ask(client, content)
    prompt = M.vlm_prompt(ckpt, [{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "Describe."}]}])
    img = M.pil_image(PNG)
    assert ours == M.vlm_greedy(ckpt, prompt, max_tokens=8, eos=srv.engine.model.eos_token_ids,
                                image=[img]) and ours


def test_generic_refuses_video_and_audio_naming_the_model(client, srv):
    row = httpx.get(srv.v1 + "/models").json()["data"][0]
    assert (row["vision"], row["audio"], row["video"]) == (True, False, False)
    for part in ({"type": "video", "data": "AAAA"}, {"type": "audio", "data": "AAAA"}):
        with pytest.raises(openai.BadRequestError, match=f"model {srv.engine.model.id} does not"):
            ask(client, [part])


def test_private_image_url_refused_by_default(client, images):
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, url_part(images.url("/a.png")))
    assert ("prompt build failed: image url rejected: 127.0.0.1 is a loopback address"
            in str(info.value))
    with pytest.raises(openai.BadRequestError, match="localhost resolves to .*loopback"):
        ask(client, url_part(f"http://localhost:{images.port}/a.png"))
    assert images.requests == []


def test_allow_private_media_lets_a_lan_image_through(client, images, monkeypatch):
    _, inline = ask(client, url_part(M.data_url(PNG, "image/png")))
    monkeypatch.setattr(fetch.policy, "allow_private", True)
    _, fetched = ask(client, url_part(images.url("/a.png")))
    assert fetched == inline and [p for p, _ in images.requests] == ["/a.png"]


def test_a_slow_fetch_does_not_block_other_requests(client, srv, images, monkeypatch):
    monkeypatch.setattr(fetch.policy, "allow_private", True)
    images.routes["/slow.png"] = slow(2.0, PNG)
    done = {}
    slow_part = url_part(images.url("/slow.png"))
    t = threading.Thread(target=lambda: done.update(r=ask(client, slow_part)))
    t.start()
    deadline = time.monotonic() + 20
    while not images.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert images.requests, "the slow fetch never started"
    started = time.monotonic()
    assert httpx.get(srv.base_url + "/health", timeout=5).status_code == 200
    r, _ = ask(client, [{"type": "text", "text": "quick"}], n=2)
    assert time.monotonic() - started < 1.5 and r.choices[0].finish_reason
    t.join(30)
    assert done["r"][1]


def test_cli_flag_and_environment_turn_on_private_media(monkeypatch):
    monkeypatch.setattr(fetch.policy, "allow_private", False)
    args = cli.build_parser().parse_args(["serve", "--allow-private-media"])
    startup.configure_media(args)
    assert fetch.policy.allow_private is True
    code = "from mlxbun_core.media import fetch; print(fetch.policy.private_allowed())"
    for value, expect in (("1", "True"), ("0", "False")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**__import__("os").environ, "MLXBUN_ALLOW_PRIVATE_MEDIA": value})
        assert out.stdout.strip() == expect


def test_towers_borrow_the_loaded_language_weights(client, srv):
    from mlx.utils import tree_flatten

    ask(client, url_part(M.data_url(PNG, "image/png")), n=1)
    from mlxbun_core.contract import MediaPipeline

    pipe = srv.engine.model.extras["media_pipeline"]
    assert isinstance(pipe, MediaPipeline) and pipe.kinds == {"image"}
    towers = pipe._vlm
    theirs = dict(tree_flatten(towers.parameters()))
    mine = dict(tree_flatten(srv.engine.model.model.parameters()))
    assert mine and all(theirs[k] is v for k, v in mine.items())  # the same arrays, not copies
    assert any(k.startswith("vision_tower.") for k in theirs)


def test_media_hash_keys_the_prompt_cache_namespace(srv):
    import asyncio

    from mlxbun_core.media import parts

    def namespace(content):
        req = srv.engine.parse_chat({"messages": [{"role": "user", "content": content}]})
        if req.media:
            req.media_items = asyncio.run(parts.load(req.media))
        return srv.engine.cache_namespace(req)

    a = namespace(url_part(M.data_url(PNG, "image/png")))
    b = namespace(url_part(M.data_url(M.image_bytes("PNG", size=(64, 48), seed=1), "image/png")))
    text = namespace([{"type": "text", "text": "Describe."}])
    assert len({a, b, text}) == 3 and a == namespace(url_part(M.data_url(PNG, "image/png")))
