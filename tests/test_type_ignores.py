"""Every ``# type: ignore`` in the type-checked code names its error code and says why
(on its line, or in the comment just above), and docs/development.md counts them truly:
an ignore added or removed fails here until the doc says so."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = [ROOT / "mlxbun_core", *sorted((ROOT / "plugins").glob("*/mlxbun_*"))]  # what mypy reads
IGNORE = re.compile(r"#\s*type:\s*ignore(\[[\w\-, ]+\])?(.*)$")
NUMBERS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
           "fourteen fifteen sixteen seventeen eighteen nineteen twenty").split() + [
    f"twenty-{n}" for n in "one two three four five six seven eight nine".split()]


def ignores() -> list[tuple[str, int, str, str]]:
    """(file, line, code, the reason) of every ignore in the checked code."""
    out = []
    for package in CHECKED:
        for path in sorted(package.rglob("*.py")):
            lines = path.read_text().splitlines()
            for i, line in enumerate(lines):
                m = IGNORE.search(line)
                if m is None:
                    continue
                above = lines[i - 1].strip() if i else ""
                reason = m[2].lstrip("# ").strip() or (above[1:].strip()
                                                       if above.startswith("#") else "")
                out.append((str(path.relative_to(ROOT)), i + 1, m[1] or "", reason))
    return out


def test_every_ignore_names_its_code_and_says_why():
    found = ignores()
    assert len(found) > 5  # the scan reads the code
    assert [f"{f}:{n}" for f, n, code, _ in found if not code] == []
    assert [f"{f}:{n}" for f, n, _, reason in found if not reason] == []


def test_the_development_doc_counts_them():
    doc = (ROOT / "docs" / "development.md").read_text()
    said = re.search(r"\(([\w-]+)\s+in\s+all:", doc)
    assert said, "docs/development.md no longer says how many ignores there are"
    assert said[1] == NUMBERS[len(ignores())], (
        f"docs/development.md says {said[1]}; there are {len(ignores())}: {ignores()}")
