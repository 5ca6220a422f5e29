"""The whisper plugin and POST /v1/audio/transcriptions: parity with mlx-audio's own
transcribe on the same tiny random checkpoint and WAV file, every response_format through
the openai SDK, the 400s, and the ``mlxbun transcribe`` verb in a subprocess."""

import subprocess
import sys
from importlib.metadata import entry_points

import httpx
import mlxbun_whisper
import openai
import pytest
from mlx_audio.stt import load as mlx_audio_load

from mlxbun_core import plugins
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server
from mlxbun_core.testing.speech import (
    speechlike,
    tiny_whisper_checkpoint,
    wav_file,
    whisper_plugin_env,
)

WAV = wav_file(speechlike(2.0, seed=3))
INSTALLED = any(ep.name == "whisper" for ep in entry_points(group="mlxbun"))


@pytest.fixture(scope="module")
def srv():
    plugins.load_plugins()
    if not INSTALLED:  # this tree's plugin, not pip-installed here
        plugins.register(mlxbun_whisper, "whisper")
    server = start_server(tiny_whisper_checkpoint())
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.v1, api_key="unused", max_retries=0, timeout=300)


def transcribe(client, **kw):
    kw.setdefault("temperature", 0)
    return client.audio.transcriptions.create(model="whisper", file=("speech.wav", WAV), **kw)


def test_verbose_json_equals_mlx_audio_own_transcribe(client, tmp_path):
    wav = tmp_path / "speech.wav"
    wav.write_bytes(WAV)
    ref = mlx_audio_load(str(tiny_whisper_checkpoint())).generate(
        str(wav), temperature=0.0, word_timestamps=True)  # it decodes the file itself
    got = transcribe(client, response_format="verbose_json",
                     timestamp_granularities=["segment", "word"])
    assert ref.segments and got.text == ref.text.strip()
    assert got.language == "english" and got.duration == pytest.approx(2.0)
    assert [(s.start, s.end, s.text, s.tokens) for s in got.segments] == [
        (s["start"], s["end"], s["text"], s["tokens"]) for s in ref.segments]
    assert [(w.word, w.start, w.end) for w in got.words] == [
        (w["word"].strip(), w["start"], w["end"]) for s in ref.segments for w in s["words"]]


def test_json_text_srt_vtt_agree(client):
    plain = transcribe(client, response_format="verbose_json")
    assert transcribe(client).text == plain.text
    assert transcribe(client, response_format="text") == plain.text
    srt = transcribe(client, response_format="srt")
    vtt = transcribe(client, response_format="vtt")
    first = plain.segments[0]
    assert srt.startswith("1\n00:00:0") and " --> " in srt.splitlines()[1]
    assert srt.count(" --> ") == len(plain.segments) == vtt.count(" --> ")
    assert vtt.startswith("WEBVTT\n\n")
    start_ms = round(first.start * 1000)
    assert f"00:00:{start_ms // 1000:02d}.{start_ms % 1000:03d} --> " in vtt
    assert first.text.strip() in srt.split("\n\n")[0]


def test_words_only_leaves_segments_out(client):
    got = transcribe(client, response_format="verbose_json", timestamp_granularities=["word"])
    assert got.words and got.segments is None


def raw_post(srv, files=None, data=None, **kw):
    return httpx.post(srv.v1 + "/audio/transcriptions", files=files, data=data, timeout=300,
                      **kw)


@pytest.mark.parametrize(("files", "data", "param"), [
    (None, {"model": "w"}, "file"),
    ({"file": ("a.wav", WAV)}, {"response_format": "mp3"}, "response_format"),
    ({"file": ("a.wav", b"RIFF not audio at all")}, {}, "file"),
    ({"file": ("a.wav", b"")}, {}, "file"),
    ({"file": ("a.wav", WAV)}, {"language": "de"}, "language"),
    ({"file": ("a.wav", WAV)}, {"language": "klingon"}, "language"),
    ({"file": ("a.wav", WAV)}, {"temperature": "hot"}, "temperature"),
    ({"file": ("a.wav", WAV)}, {"timestamp_granularities[]": "word"}, "timestamp_granularities"),
])
def test_bad_requests_are_400s_and_harm_nothing(srv, client, files, data, param):
    r = raw_post(srv, files=files or {"x": ("x", b"")}, data=data)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["message"]
    assert transcribe(client, response_format="text")  # the next request is served


def test_json_body_is_a_400(srv):
    r = httpx.post(srv.v1 + "/audio/transcriptions", json={"file": "x"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_a_model_that_cannot_transcribe_is_a_400():
    server = start_server(tiny_checkpoint())
    try:
        r = raw_post(server, files={"file": ("a.wav", WAV)})
    finally:
        server.stop()
    assert r.status_code == 400, r.text
    assert "cannot transcribe" in r.json()["error"]["message"]


def test_a_checkpoint_without_its_tokenizer_is_refused_at_load(tmp_path):
    """mlx-audio only warns when the Whisper processor cannot load; the plugin refuses the
    checkpoint then, naming what is missing, and a whole one loads with its tokenizer."""
    import json
    import shutil
    from pathlib import Path

    from mlxbun_core.model import LoadOptions

    whole = Path(tiny_whisper_checkpoint())
    config = json.loads((whole / "config.json").read_text())
    loaded = mlxbun_whisper.load_model(path=whole, config=config, options=LoadOptions())
    ids = loaded.tokenizer.encode(" hello", add_special_tokens=False)
    assert loaded.tokenizer.decode(ids) == " hello"
    bare = tmp_path / "bare"
    shutil.copytree(whole, bare)
    for name in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"):
        (bare / name).unlink()
    with pytest.raises(ValueError, match="no Whisper tokenizer and feature extractor"):
        mlxbun_whisper.load_model(path=bare, config=config, options=LoadOptions())


def test_cli_prints_what_the_server_sends(client, tmp_path):
    wav = tmp_path / "speech.wav"
    wav.write_bytes(WAV)
    env = whisper_plugin_env(tmp_path)
    cmd = [sys.executable, "-m", "mlxbun_core.cli", "transcribe", str(wav), "--model",
           str(tiny_whisper_checkpoint()), "--temperature", "0"]
    srt = subprocess.run([*cmd, "--format", "srt"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert srt.returncode == 0, srt.stderr
    assert srt.stdout == transcribe(client, response_format="srt")
    bad = subprocess.run([*cmd[:4], str(tmp_path / "missing.wav"), *cmd[5:]], env=env,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "missing.wav" in bad.stderr
