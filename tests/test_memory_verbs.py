"""``mlxbun memory toc``, ``section``, ``open`` and ``link``: real ``mlxbun`` subprocesses
over a real vault (files, SQLite history and index)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlxbun_core.memory.vault import Vault

KIWI = """# Kiwi fruit

A fuzzy fruit from New Zealand, often eaten with a spoon.

## Facts

- Rich in vitamin C; grown next to apple orchards.

### Growing

Vines need frost-free springs.

## Recipes

```
kiwi fruit in code stays as it is
```
"""
APPLE = "# Apple\n\nA pome fruit. Kiwi fruit is a different fruit.\n"
VITAMIN = ("# Vitamin C\n\nAn antioxidant; see [[Apple]] for nothing.\n\n## See also\n\n"
           "- [[Apple]]\n")


def memory(*args: str, root: Path, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MLXBUN_WIKI": str(root)}
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-m", "mlxbun_core.cli", "memory", *args], env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.fixture
def root(tmp_path) -> Path:
    v = Vault(tmp_path / "wiki")
    v.setup()
    for name, text in (("Kiwi_fruit", KIWI), ("Apple", APPLE), ("Vitamin_C", VITAMIN)):
        v.write(name, text, "create")
    return v.root


def test_toc_and_section(root):
    toc = memory("toc", "Kiwi_fruit", root=root)
    assert toc.returncode == 0, toc.stderr
    assert toc.stdout.splitlines() == ["Kiwi fruit  (#kiwi-fruit)", "  Facts  (#facts)",
                                       "    Growing  (#growing)", "  Recipes  (#recipes)"]
    facts = memory("section", "Kiwi_fruit", "facts", root=root)
    assert facts.returncode == 0, facts.stderr
    assert facts.stdout.startswith("## Facts") and "Vines need frost-free" in facts.stdout
    assert "Recipes" not in facts.stdout  # stops at the next heading of its level
    missing = memory("section", "Kiwi_fruit", "nope", root=root)
    assert missing.returncode == 1 and "anchors: kiwi-fruit, facts" in missing.stderr


def test_open_prints_the_path_and_hands_it_to_the_opener(root, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "opened.txt"
    opener = bin_dir / ("open" if sys.platform == "darwin" else "xdg-open")
    opener.write_text(f"#!/bin/sh\necho \"$1\" > {seen}\n")
    opener.chmod(0o755)
    run = memory("open", "Apple", root=root, path=f"{bin_dir}:{os.environ['PATH']}")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(root / "articles" / "Apple.md")
    for _ in range(50):  # the opener runs detached
        if seen.exists():
            break
        time.sleep(0.1)
    assert seen.read_text().strip() == str(root / "articles" / "Apple.md")
    assert memory("open", "Nope", root=root).returncode == 1


def test_link_links_first_mentions_rebuilds_see_also_and_is_idempotent(root):
    run = memory("link", root=root)
    assert run.returncode == 0, run.stderr
    v = Vault(root)
    apple = v.read("Apple")
    assert "[[Kiwi_fruit|Kiwi fruit]] is a different fruit" in apple
    assert apple.rstrip().endswith("## See also\n\n- [[Kiwi_fruit]]")
    kiwi = v.read("Kiwi_fruit")
    assert "next to [[Apple|apple]] orchards" in kiwi
    assert "kiwi fruit in code stays as it is" in kiwi and "# Kiwi fruit\n" in kiwi
    assert "[[Vitamin_C|vitamin C]]" in kiwi  # the first mention only, once
    assert kiwi.count("[[Vitamin_C") == 2  # that link and its See also entry
    vit = v.read("Vitamin_C")
    assert vit.count("- [[Apple]]") == 1  # kept, not doubled
    again = memory("link", root=root)
    assert "0 of 3 articles changed" in again.stdout
    assert v.history.log("Apple", 10)[0]["subject"].startswith("link")
