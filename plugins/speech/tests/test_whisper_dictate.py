"""``mlxbun dictate`` in a subprocess: a recording (a file, or a WAV on stdin read as it
arrives) is cut into windows at pauses and each window's segments print as soon as it is
transcribed, equal to what the server answers for the same slice of audio; without a
microphone (no PortAudio here) the verb says so and exits 2."""

import re
import subprocess
import sys
import threading
import time

import mlxbun_whisper
import openai
import pytest

from mlxbun_core import plugins
from mlxbun_core.speech import SAMPLE_RATE
from mlxbun_core.speech.audio import decode_wav
from mlxbun_core.testing.server import start_server
from mlxbun_core.testing.speech import (
    speechlike,
    tiny_whisper_checkpoint,
    wav_file,
    whisper_plugin_env,
)

SECONDS, WINDOW = 4.0, 1.5
WAV = wav_file(speechlike(SECONDS, seed=5))
WINDOW_LINE = re.compile(r"mlxbun dictate: ([\d.]+)-([\d.]+) s · \d+ segments")


@pytest.fixture(scope="module")
def client():
    plugins.load_plugins()
    if plugins.pm.get_plugin("whisper") is None:  # this tree's plugin, not pip-installed
        plugins.register(mlxbun_whisper, "whisper")
    server = start_server(tiny_whisper_checkpoint())
    yield openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=300)
    server.stop()


@pytest.fixture(scope="module")
def cmd(tmp_path_factory):
    root = tmp_path_factory.mktemp("dictate")
    env = whisper_plugin_env(root)
    return env, [sys.executable, "-m", "mlxbun_core.cli", "dictate", "--model",
                 str(tiny_whisper_checkpoint()), "--temperature", "0"]


def dictate(cmd, *args, stdin=None):
    env, argv = cmd
    return subprocess.run([*argv, *args], env=env, input=stdin, capture_output=True,
                          timeout=300)


def expected_lines(client, windows) -> str:
    """What the server says for each window's slice, times moved to the recording's."""
    audio, lines = decode_wav(WAV), []
    for start, end in windows:
        piece = audio[round(start * SAMPLE_RATE):round(end * SAMPLE_RATE)]
        got = client.audio.transcriptions.create(
            model="whisper", file=("w.wav", wav_file(piece)), temperature=0,
            response_format="verbose_json")
        for s in got.segments:
            if s.text.strip():
                lines.append(f"[{clock(start + s.start)} -> {clock(start + s.end)}] "
                             f"{s.text.strip()}\n")
    return "".join(lines)


def clock(seconds: float) -> str:
    minutes, secs = divmod(seconds, 60)
    return f"{int(minutes):02d}:{secs:05.2f}"


def test_a_recording_prints_each_window_as_the_server_transcribes_it(cmd, client, tmp_path):
    wav = tmp_path / "talk.wav"
    wav.write_bytes(WAV)
    run = dictate(cmd, "--from", str(wav), "--window", str(WINDOW), "--timestamps",
                  "--verbose")
    assert run.returncode == 0, run.stderr.decode()
    windows = [(float(a), float(b)) for a, b in WINDOW_LINE.findall(run.stderr.decode())]
    # windows follow each other, cover the recording, none longer than asked
    assert len(windows) == 3 and windows[0][0] == 0 and windows[-1][1] == SECONDS
    assert all(a[1] == b[0] for a, b in zip(windows, windows[1:], strict=False))
    assert all(0 < end - start <= WINDOW for start, end in windows)
    assert run.stdout.decode() and run.stdout.decode() == expected_lines(client, windows)


def test_stdin_is_transcribed_while_it_still_arrives(cmd, tmp_path):
    wav = tmp_path / "talk.wav"
    wav.write_bytes(WAV)
    whole = dictate(cmd, "--from", str(wav), "--window", str(WINDOW))
    env, argv = cmd
    proc = subprocess.Popen([*argv, "--from", "-", "--window", str(WINDOW)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    first: list[bytes] = []
    reader = threading.Thread(target=lambda: first.append(proc.stdout.readline()))
    reader.start()
    half = 44 + int(2.2 * SAMPLE_RATE) * 2  # the header and 2.2 s: one full window
    proc.stdin.write(WAV[:half])
    proc.stdin.flush()
    reader.join(240)
    assert first and first[0], "no line printed while the recording went on"
    assert proc.poll() is None  # it is still waiting for the rest of the audio
    time.sleep(0.1)
    proc.stdin.write(WAV[half:])
    proc.stdin.close()
    rest, err = proc.stdout.read(), proc.stderr.read()
    assert proc.wait(240) == 0, err.decode()
    assert first[0] + rest == whole.stdout  # the same text as the whole file


def test_without_a_microphone_it_says_so_and_exits_2(cmd):
    run = dictate(cmd)
    assert run.returncode == 2
    message = run.stderr.decode()
    assert "mlxbun dictate:" in message and "--from FILE" in message
    assert "Traceback" not in message


def test_stdin_that_is_not_a_wav_is_a_clear_error(cmd):
    run = dictate(cmd, "--from", "-", stdin=b"hello, not audio\n")
    assert run.returncode == 1 and "not a PCM WAV stream" in run.stderr.decode()
