"""What the approval card shows: names quoted as git quotes them, control characters
escaped, nothing else changed."""

from __future__ import annotations

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
