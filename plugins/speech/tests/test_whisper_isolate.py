"""`serve --isolate --model-pool 2`: POST /v1/audio/transcriptions (a multipart form) naming
a Whisper checkpoint in the library is routed by its `model` part to that model's engine
child, which answers as the in-process server does; the default chat engine keeps serving
and still refuses audio it cannot transcribe."""


import httpx
import mlxbun_whisper
import openai
import pytest

from mlxbun_core import plugins
from mlxbun_core.testing.hub_cache import add_to_hub_cache, library_env, library_hub
from mlxbun_core.testing.process import serve
from mlxbun_core.testing.server import start_server
from mlxbun_core.testing.speech import (
    speechlike,
    tiny_whisper_checkpoint,
    wav_file,
    whisper_plugin_env,
)

CHAT, WHISPER = "acme/Tiny-Llama-Chat", "acme/whisper-tiny"
WAV = wav_file(speechlike(2.0, seed=7))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("iso-speech")
    library_hub(root / "hf" / "hub", {CHAT: ("llama", {"seed": 11})})
    add_to_hub_cache(root / "hf" / "hub", WHISPER, tiny_whisper_checkpoint())
    env = {**whisper_plugin_env(root), **library_env(root)}
    with serve("--isolate", "--model-pool", "2", "Tiny-Llama", env=env, ready="/engine",
               timeout=180) as proc:
        yield proc.base


@pytest.fixture(scope="module")
def in_process():
    plugins.load_plugins()
    if plugins.pm.get_plugin("whisper") is None:  # this tree's plugin, not pip-installed
        plugins.register(mlxbun_whisper, "whisper")
    server = start_server(tiny_whisper_checkpoint())
    yield openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=300)
    server.stop()


def transcribe(client, model, **kw):
    return client.audio.transcriptions.create(model=model, file=("speech.wav", WAV),
                                              temperature=0, **kw)


def test_transcription_is_routed_to_the_named_whisper_engine(base, in_process):
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0,
                           timeout=300)
    got = transcribe(client, WHISPER, response_format="verbose_json",
                     timestamp_granularities=["segment", "word"])
    want = transcribe(in_process, "whisper", response_format="verbose_json",
                      timestamp_granularities=["segment", "word"])
    assert got.segments and got.text == want.text
    assert [(s.start, s.end, s.text, s.tokens) for s in got.segments] == [
        (s.start, s.end, s.text, s.tokens) for s in want.segments]
    assert [(w.word, w.start, w.end) for w in got.words] == [
        (w.word, w.start, w.end) for w in want.words]
    assert transcribe(client, WHISPER, response_format="srt") == transcribe(
        in_process, "whisper", response_format="srt")
    # the chat engine still answers chat, and it cannot transcribe
    chat = client.chat.completions.create(model=CHAT, max_tokens=2,
                                          messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content is not None
    refused = httpx.post(base + "/v1/audio/transcriptions", timeout=180,
                         files={"file": ("a.wav", WAV)}, data={"model": CHAT})
    assert refused.status_code == 400 and "cannot transcribe" in refused.text
