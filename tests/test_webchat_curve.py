"""A chat session's drawn HLG curve over the real /ws/chat: it is kept with the session,
sent as ``hlg.points`` with each turn (so the same seed samples differently), removable,
and a curve that goes down is refused before any turn runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server
from mlxbun_core.testing.wschat import ChatClient
from mlxbun_core.webchat.store import read_entries

STEEP = {"name": "steep", "points": [[-20, -400], [0, 0]]}  # twenty times the diagonal


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start_server(tiny_checkpoint("qwen3"), sessions_dir=tmp_path_factory.mktemp("sessions"))
    s.engine.defaults["logit_bias"] = {str(i): -100 for i in s.engine.model.tokenizer.eos_token_ids}
    yield s
    s.stop()


def answer(c: ChatClient, text: str) -> str:
    items = c.turn(text=text)[-1]["items"]
    return str(items[-1]["content"])


def test_a_curve_rides_with_the_session_and_changes_sampling(server):
    with ChatClient(server.base_url) as c:
        c.hello()
        c.send("set_sampling", max_tokens=12, temperature=1.5, seed=7)
        c.until("settings")
        first = answer(c, "Say something")  # a cold prompt cache: its first answer
        plain = str(c.turn("regenerate")[-1]["items"][-1]["content"])
        assert plain == first  # a regeneration (warm cache, same seed) gives it again
        c.send("new_session")
        assert c.until("settings")[-1]["curve"] is None
        c.send("set_curve", curve=STEEP)
        assert c.until("settings")[-1]["curve"] == STEEP
        curved = answer(c, "Say something")
        path = next(f for f in reversed(c.seen) if f["type"] == "sessions")["activePath"]
        c.send("new_session")
        c.until("settings")
        c.send("set_curve", curve=STEEP)
        c.until("settings")
        again = answer(c, "Say something")
    assert curved != plain  # the seed is the same: only the curve differs
    assert curved == again  # and with the curve the seed still decides
    saved = [e["values"] for e in read_entries(Path(path))
             if e["type"] == "settings"]
    assert any(v.get("curve") == STEEP for v in saved)
    with ChatClient(server.base_url) as c:  # reopened, the chat still has its curve
        c.hello()
        c.send("open_session", path=path)
        assert c.until("settings")[-1]["curve"] == STEEP
        c.send("set_curve", curve=None)
        assert c.until("settings")[-1]["curve"] is None


def test_a_curve_that_goes_down_is_refused(server):
    with ChatClient(server.base_url) as c:
        c.hello()
        for curve, words in (({"points": [[-20, -20], [-10, 2], [0, 0]]}, "not monotone"),
                             ({"points": [[0, 0]]}, "2 to 64 points"), ("x", "object"),
                             ({"name": 5, "points": STEEP["points"]}, "curve.name")):
            c.send("set_curve", curve=curve)
            err = c.recv()
            assert err["type"] == "error" and err["status"] == 400 and words in err["message"]
        c.send("list_sessions")
        c.until("sessions")
        c.send("set_curve", curve=STEEP)
        assert c.until("settings")[-1]["curve"] == STEEP  # the socket is still usable
