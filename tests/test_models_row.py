"""/v1/models describes the served model as it is: its name, and tools only when its
chat template shows tools to the model."""

import httpx
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import running_server

TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


def row(srv) -> dict:
    """The served model's row: the first (local library rows follow it)."""
    data = httpx.get(srv.v1 + "/models", timeout=30).json()["data"]
    assert data[0]["id"] == srv.engine.model.id
    assert [r["id"] for r in data].count(data[0]["id"]) == 1  # never listed twice
    return data[0]


@pytest.mark.parametrize("template,expected", [(None, False), (TOOLS_TEMPLATE, True)],
                         ids=["template-ignores-tools", "template-renders-tools"])
def test_tools_capability_follows_the_template(template, expected):
    with running_server(tiny_checkpoint("llama", seed=3, chat_template=template)) as srv:
        r = row(srv)
    assert r["tools"] is expected and r["capabilities"]["tools"] is expected
    assert r["capabilities"]["chat_completions"] is True


def test_embedded_default_is_listed_by_its_name(smollm2_path, monkeypatch):
    """Served from its converted directory (``<file stem>-<hash>``), the default keeps its
    name, and the local library (which holds that conversion) does not list it again."""
    assert smollm2_path.name.startswith("SmolLM2-135M-Instruct.Q4_1-")
    monkeypatch.setenv("MLXBUN_HOME", str(smollm2_path.parent.parent))
    with running_server(smollm2_path) as srv:
        r = row(srv)
        ids = [m["id"] for m in httpx.get(srv.v1 + "/models", timeout=30).json()["data"]]
        assert httpx.get(srv.v1 + "/models/SmolLM2-135M-Instruct", timeout=30).status_code == 200
    assert ids.count("SmolLM2-135M-Instruct") == 1
    assert not [i for i in ids if i.startswith("SmolLM2-135M-Instruct.")], ids
    assert r["id"] == "SmolLM2-135M-Instruct"
    assert r["tools"] is False  # SmolLM2's template never mentions tools
