"""What the approval card shows: names quoted as git quotes them, control characters
escaped, nothing else changed."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from mlxbun_core.webchat.coding import files, shown


def test_plain_names_and_text_pass_unchanged():
    assert shown.name("src/main.py") == "src/main.py"
    assert shown.name("naïve café/日本.txt") == "naïve café/日本.txt"
    assert shown.text("a\n\tb \"quoted\" back\\slash\n") == "a\n\tb \"quoted\" back\\slash\n"


def test_names_with_controls_quotes_or_backslashes_are_quoted():
    assert shown.name("a\nb") == '"a\\nb"'
    assert shown.name('say "hi"') == '"say \\"hi\\""'
    assert shown.name("back\\slash") == '"back\\\\slash"'
    assert shown.name("x\u202ey") == '"x\\u202ey"'  # a bidi override
    assert shown.name("zero\u200bwidth") == '"zero\\u200bwidth"'
    assert shown.name("bell\x07\x7f\x85") == '"bell\\x07\\x7f\\x85"'


def test_text_keeps_lines_and_escapes_what_could_hide_them():
    assert shown.text("a\rb\x1b[31mc\u2028d\u2066e") == "a\\rb\\x1b[31mc\\u2028d\\u2066e"
    assert shown.line("x\ny\tz") == "x\\ny\tz"


def test_a_diff_splits_lines_at_newlines_only_and_escapes_inside_them(tmp_path):
    change = files.Change(tmp_path / "f", "f", "keep\npage\x0cbreak\n", "keep\nnew\u2028line")
    assert change.diff().split("\n")[2:] == [
        "@@ -1,2 +1,2 @@", " keep", "-page\\x0cbreak", "+new\\u2028line",
        "\\ No newline at end of file", ""]


def apply(before: str, diff: str) -> str:
    """``diff`` (a unified diff of the card's format) applied to ``before``."""
    old = files._lines(before)
    out: list[str] = []
    at, last = 0, ""  # lines of old used; the kind of the line before
    for line in diff.split("\n")[2:]:
        if line.startswith("@@ "):
            first = int(line.split()[1][1:].split(",")[0])
            count = line.split()[1].split(",")
            begin = first - 1 if len(count) == 1 or count[1] != "0" else first
            out += old[at:begin]
            at = begin
        elif line.startswith("\\ No newline"):
            if last in " +":  # a removed line's missing newline changes nothing new
                out[-1] = out[-1].removesuffix("\n")
        elif line.startswith(" "):
            assert old[at] == line[1:] + "\n" or old[at] == line[1:]
            out.append(old[at])
            at += 1
        elif line.startswith("-"):
            at += 1
        elif line.startswith("+"):
            out.append(line[1:] + "\n")
        last = line[:1]
    return "".join(out + old[at:])


@settings(max_examples=300, deadline=None)
@given(before=st.lists(st.sampled_from(["a", "b", "c", "", "d e"]), max_size=30),
       after=st.lists(st.sampled_from(["a", "b", "c", "", "d e"]), max_size=30),
       ends=st.booleans(), ends_after=st.booleans())
def test_the_card_diff_turns_the_old_text_into_the_new(before, after, ends, ends_after):
    old = "\n".join(before) + ("\n" if ends and before else "")
    new = "\n".join(after) + ("\n" if ends_after and after else "")
    assert apply(old, files.Change(Path("f"), "f", old, new).diff()) == new


def test_a_change_deep_in_a_long_file_is_numbered_from_the_top(monkeypatch):
    old = "".join(f"{i}\n" for i in range(1, 101))
    new = old.replace("60\n", "sixty\n")
    diff = files.Change(Path("f"), "f", old, new).diff().split("\n")
    assert diff[2] == "@@ -57,7 +57,7 @@" and "-60" in diff and "+sixty" in diff
    monkeypatch.setattr(files, "DIFF_LINES", 5)  # a rewrite larger than difflib is given
    rewrite = files.Change(Path("f"), "f", old, old.upper() + "x\n" * 50).diff()
    assert rewrite.endswith("… (cut)\n") and rewrite.count("\n+") <= 8
