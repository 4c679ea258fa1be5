"""Text from a submission, escaped for where it goes (`grader.delivery.escape`): each destination's function, then
the attack: a class whose folder, zip and file names and whose code's printed output and exceptions hold
terminal escapes (OSC, CSI), C1 controls, bidi overrides and isolates, line breaks, a spreadsheet formula,
Markdown and HTML, graded by `course grade` and checked by `course check`, with nothing of it reaching the
terminal, grades.csv, summary.md, feedback.html or results.json as anything but visible text."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from grader import chapters, checks
from grader.delivery import escape
from grader.delivery.grade import results_dir

CH17 = chapters.find("ch17")
SOLUTION17 = (chapters.SOLUTIONS / CH17.filename).read_text()
FULL17 = sum(s.points for s in checks.load("ch17", with_hidden=True))


def _sandbox() -> bool:
    """Whether bubblewrap's sandbox can be made here (the attack runs without one where not: it is about
    what is written, not what the code can reach)."""
    from grader.isolation.sandbox import SandboxUnavailable, probe

    try:
        probe()
        return True
    except SandboxUnavailable:
        return False


SANDBOX = _sandbox()

ATTACK = (
    "\x1b]0;pwned\x07 \x1b[2K\r \x9b31m\x85 \u202egnp.exe\u202c \u2066iso\u2069 \u200b\ufeff new\nline "
    "=cmd|' /C calc'!A0 [x](javascript:alert(1)) | a | b | <img src=x onerror=alert(1)> https://evil.example/"
)
"""Everything at once: a window title (OSC), a row erased and rewritten (CSI, CR), C1's CSI and NEL, a bidi
override and isolate, invisible characters, a line break, a formula, a Markdown link, a table row, HTML, a URL."""
NAMES = [
    "\x1b]0;pwned\x07",
    "\x1b[2K\rrow",
    "c1\x9b31m\x85\u202eevil\u202c\u2066iso\u2069",
    "new\nline",
    "=cmd|' -C calc'!A0",  # a name cannot hold a slash
    "[x](javascript:alert(1))",
    "| a | b |",
    "<img src=x onerror=alert(1)>",
]
"""Student folders, each holding the reference: valid names, graded like any other."""
ZIP = "\x1b]0;zip\x07\u202e"
MISSING = "\x1b[2Kmissing\u2067"
FILER = "filer"
STRAY = "ch17 \x1b]0;f\x07\u202e.md"
"""A file in FILER's folder: no answer, so its error row lists it."""

BAD = (
    {chr(c) for c in range(0x20) if c != 0x0A}
    | {"\x7f"}
    | {chr(c) for c in range(0x80, 0xA0)}
    | {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}
    | {"\u200b", "\u200c", "\u200d", "\u200e", "\u200f", "\u061c", "\ufeff", "\u2028", "\u2029"}
)
"""What must never be written from a submission's text: C0 but the line feed, DEL, C1, bidi overrides and
isolates, zero-width and other invisible format characters, line and paragraph separators. Listed here,
not taken from grader.delivery.escape, so that a gap there fails."""


def bad(text: str, *, keep: str = "\n") -> list[str]:
    """The characters of BAD in `text` (those in `keep` aside), as escapes."""
    return sorted({repr(c) for c in text if c in BAD and c not in keep})


class Tags(HTMLParser):
    """An HTML document's tags (name, attributes) and its text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


# -- each destination --------------------------------------------------------------------------------------------
def test_the_terminal_gets_no_control_character_and_sees_each_one():
    shown = escape.terminal(ATTACK + "\ttab")
    assert not bad(shown, keep="")
    assert shown.startswith("\\x1b]0;pwned\\x07 \\x1b[2K\\r \\x9b31m\\x85 \\u202egnp.exe\\u202c \\u2066iso\\u2069 ")
    assert "\\u200b\\ufeff new\\nline" in shown
    assert shown.endswith("tab") and "    tab" in shown
    assert escape.terminal("ü 名 é ∞ −1") == "ü 名 é ∞ −1"  # text is left as it is
    assert escape.terminal_lines("a\r\nb\rc\x85d\u2028e\nf") == ["a", "b\\rc\\x85d\\u2028e", "f"]  # only line feeds break
    assert escape.terminal(escape.terminal(ATTACK)) == escape.terminal(ATTACK)  # twice is once


def test_a_csv_cell_holds_no_control_character_and_runs_no_formula():
    for value in ("=cmd|' /C calc'!A0", "+1", "-2+3", "@SUM(A1)", "\t=1", "\r=1", "\n=1"):
        cell = escape.csv_cell(value)
        assert isinstance(cell, str) and not bad(cell, keep="") and not cell.startswith(("=", "+", "-", "@")), value
    assert escape.csv_cell("=1") == "'=1" and escape.csv_cell("a\r\nb") == "a\\r\\nb"
    assert escape.csv_cell(2.5) == 2.5 and escape.csv_cell("ok") == "ok"


def markdown_html(md: str) -> str:
    """`md` rendered as CommonMark with GFM tables and raw HTML on."""
    markdown_it = pytest.importorskip("markdown_it")
    return markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table").render(md)


def test_markdown_prose_and_code_spans_are_text_only():
    for md in (f"- {escape.markdown(ATTACK)}", f"- {escape.markdown_code(ATTACK)}"):
        page = Tags(markdown_html(md))
        assert {tag for tag, _ in page.tags} <= {"ul", "li", "code"}, page.tags
        assert "".join(page.text).strip() == escape.visible(ATTACK)  # shown as it is, controls as escapes
        assert not bad(md, keep="")
    mistune = pytest.importorskip("mistune")
    autolinked = mistune.create_markdown(plugins=["table", "url"], escape=False)(escape.markdown(ATTACK + " www.evil.example"))
    assert "<a" not in autolinked and "<img" not in autolinked
    assert escape.markdown_code("a `b` c") == "``a `b` c``" and escape.markdown_code("`x`") == "`` `x` ``"


def test_a_code_span_in_a_table_cell_keeps_its_row():
    cell = escape.markdown_code(ATTACK + " x\\|y", table=True)  # a pipe the student escaped, too
    row = f"| {cell} | 1 | {escape.markdown(ATTACK)} |"
    page = Tags(markdown_html("| diagnosis | n | more |\n|---|---:|---|\n" + row))
    assert [tag for tag, _ in page.tags].count("td") == 3
    assert {tag for tag, _ in page.tags} <= {"table", "thead", "tbody", "tr", "th", "td", "code"}


def test_html_text_and_attributes_hold_no_markup_and_no_control_character():
    page = Tags(f'<p title="{escape.html(ATTACK)}">{escape.html(ATTACK)}</p><pre>{escape.html(ATTACK, lines=True)}</pre>')
    assert [tag for tag, _ in page.tags] == ["p", "pre"] and page.tags[0][1]["title"] == escape.visible(ATTACK)
    assert "".join(page.text) == escape.visible(ATTACK) + escape.visible(ATTACK, keep="\n")
    assert "new\nline" in escape.html(ATTACK, lines=True) and not bad(escape.html(ATTACK, lines=True))


def test_a_json_document_keeps_its_data_and_writes_no_control_character():
    doc = {"name": ATTACK + "\U000e0001\udcff", "ok": "名"}
    text = escape.json_document(json.dumps(doc, ensure_ascii=False, indent=1))
    assert json.loads(text) == doc and not bad(text) and "名" in text


def test_svg_text_from_a_submission_parses_and_shows_its_controls_escaped():
    from figures.kit import Figure

    f = Figure("escape-test", title="a value " + ATTACK, zh="", en="caption " + ATTACK)
    f.text(10, f.y, ATTACK, cls="value")
    svg = f.svg()
    root = ET.fromstring(svg)  # XML has no place for most controls: unescaped, this would not parse
    texts = ["".join(el.itertext()) for el in root.iter() if el.tag.endswith(("}text", "}title", "}desc"))]
    assert escape.visible(ATTACK, keep="") in texts and not bad(svg)


def test_the_lab_book_notebook_and_gradescope_texts_are_escaped():
    from grader.delivery import book
    from grader.delivery.gradebook import task_report
    from grader.delivery.gradescope import _output
    from grader.lab.runner import shown

    result = shown({"status": "error", "message": ATTACK, "printed": ATTACK, "notes": [ATTACK]})
    assert not any(bad(result[k]) for k in ("message", "printed")) and not bad(result["notes"][0])
    entry = book.Entry("ch17-causal-mask", "ch17", "t", "zh " + ATTACK, "en " + ATTACK, "placeholder", note=ATTACK)
    page = book.page([entry], f"the submission in subs/{ATTACK}")
    assert not bad(page) and not [a for _, a in Tags(page).tags if any(k.startswith("on") for k in a)]
    assert "img" not in [t for t, a in Tags(page).tags if a.get("src") == "x"]
    test = {"name": "ch17.1 causal_mask: x", "status": "failed", "output": ATTACK, "score": 0, "max_score": 1}
    doc = {"status": "failed", "tests": [test]}
    assert not bad(task_report(doc, "ch17.1", hidden=False))
    out = _output([f"could not grade this submission: {ATTACK}"])
    assert not bad(out["extra_data"]["summary"]) and not bad(out["output"])
    assert [t for t, _ in Tags(out["output"]).tags] == ["p"]


# -- the attack ---------------------------------------------------------------------------------------------------
def hostile_module() -> str:
    """ch17 whose causal_mask prints ATTACK and raises it, and whose causal_mask_with_offset prints it and
    returns it (a message then quotes the student's value)."""
    text = SOLUTION17.replace("import torch\n", f"import torch\n\nATTACK = {ATTACK!r}\n", 1)
    for old, new in (
        ("    return torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()", "    print(ATTACK)\n    raise ValueError(ATTACK)"),
        (
            "    return torch.ones(num_new, num_cached + num_new, dtype=torch.bool).tril(diagonal=num_cached)",
            "    print(ATTACK, flush=True)\n    return ATTACK",
        ),
    ):
        assert old in text
        text = text.replace(old, new)
    return text


def attack_class(root: Path) -> Path:
    """Honest ada, the hostile names (each with the reference), a hostile zip name, a hostile name with no
    answer, a folder whose only file has a hostile name, mallory's hostile code and a notebook whose cell
    does not parse and quotes ATTACK."""
    import zipfile

    from grader.delivery.notebook import chapter_notebook

    subs = root / "subs"
    subs.mkdir()
    for name in ["ada", *NAMES]:
        (subs / name).mkdir()
        (subs / name / CH17.filename).write_text(SOLUTION17)
    with zipfile.ZipFile(subs / f"{ZIP}.zip", "w") as z:
        z.writestr(CH17.filename, SOLUTION17)
    (subs / MISSING).mkdir()
    (subs / FILER).mkdir()
    (subs / FILER / STRAY).write_text("notes")
    (subs / "mallory").mkdir()
    (subs / "mallory" / CH17.filename).write_text(hostile_module())
    nb = chapter_notebook(CH17)
    answer = next(c for c in nb["cells"] if c["cell_type"] == "code" and "def causal_mask(" in "".join(c["source"]))
    answer["source"] = "def causal_mask(num_tokens):\n    return '" + ATTACK.replace("\n", " ") + "' +\n"  # its raw characters
    (subs / "nb").mkdir()
    (subs / "nb" / "ch17.ipynb").write_text(json.dumps(nb))
    return subs


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """`course grade` (the command, its output captured) over the attack class."""
    root = tmp_path_factory.mktemp("attack")
    subs, out = attack_class(root), root / "out"
    command = [sys.executable, "-m", "grader.cli", "grade", str(subs), "--chapter", "ch17", "--out", str(out), "--jobs", "2", "--seed", "5"]
    command += [] if SANDBOX else ["--no-sandbox"]
    done = subprocess.run(command, capture_output=True, timeout=900, env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    return subs, out, done.stdout.decode("utf-8"), done.stderr.decode("utf-8")


STUDENTS = ["ada", *NAMES, ZIP, MISSING, FILER, "mallory", "nb"]


@pytest.mark.slow
def test_nothing_of_the_attack_reaches_the_terminal(attacked):
    _, _, stdout, stderr = attacked
    assert not bad(stdout) and not bad(stderr), (bad(stdout), bad(stderr))
    rows = [line for line in stdout.splitlines() if "  ch17  " in line]
    assert len(rows) == len(STUDENTS)  # a name's line break starts no row of its own
    for name in STUDENTS:
        assert sum(line.startswith(escape.terminal(name) + "  ch17  ") for line in rows) == 1, name
    assert "\\x1b]0;pwned\\x07  ch17  " in stdout  # the name, visible


@pytest.mark.slow
def test_every_student_is_graded_whatever_the_name_and_the_honest_keep_full_marks(attacked):
    _, out, _, _ = attacked
    for name in ["ada", *NAMES, ZIP]:
        doc = json.loads((results_dir(out, name, "ch17") / "results.json").read_text(encoding="utf-8"))
        assert (doc["score"], doc["status"]) == (FULL17, "passed"), name  # findable under its own name
    mallory = json.loads((out / "mallory" / "ch17" / "results.json").read_text(encoding="utf-8"))
    assert mallory["status"] == "failed" and mallory["score"] < FULL17
    outputs = "\n".join(t["output"] for t in mallory["tests"])
    assert "raised ValueError: \\x1b]0;pwned\\x07 \\x1b[2K\\r \\x9b31m\\x85 \\u202egnp.exe" in outputs  # the exception, visible
    assert "(your code printed: " in outputs
    for name in (MISSING, FILER, "nb"):
        doc = json.loads((results_dir(out, name, "ch17") / "results.json").read_text(encoding="utf-8"))
        assert doc["status"] in ("error", "failed") and doc["score"] < FULL17, name
    assert "\\x1b]0;f\\x07\\u202e.md" in json.loads((out / FILER / "ch17" / "results.json").read_text(encoding="utf-8"))["error"]


@pytest.mark.slow
def test_results_json_holds_no_control_character(attacked):
    _, out, _, _ = attacked
    for path in out.glob("*/ch17/results.json"):
        text = path.read_text(encoding="utf-8")
        assert not bad(text), (path, bad(text))
        doc = json.loads(text)
        for test in doc["tests"]:
            assert not bad(test["output"]), (path, test["name"])
        assert not bad(doc.get("error", ""))
    assert not bad((out / "summary.json").read_text(encoding="utf-8"))


@pytest.mark.slow
def test_grades_csv_holds_no_control_character_and_no_formula(attacked):
    _, out, _, _ = attacked
    data = (out / "grades.csv").read_bytes().decode("utf-8")
    assert not bad(data.replace("\r\n", "\n"))  # only the rows' own CRLF
    table = list(csv.DictReader(io.StringIO(data, newline="")))
    assert len(table) == len(STUDENTS)
    assert sorted(r["student"] for r in table) == sorted(escape.csv_cell(n) for n in STUDENTS)
    for r in table:
        for value in r.values():
            assert not value.startswith(("=", "+", "-", "@")), r
    assert "'=cmd|' -C calc'!A0" in [r["student"] for r in table]


@pytest.mark.slow
def test_summary_md_shows_the_names_and_messages_as_text(attacked):
    _, out, _, _ = attacked
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert not bad(md)
    page = Tags(markdown_html(md))
    tags = [tag for tag, _ in page.tags]
    assert set(tags) <= {"h1", "h2", "h3", "p", "ul", "li", "code", "strong", "img", "table", "thead", "tbody", "tr", "th", "td"}, set(tags)
    assert [a["src"] for t, a in page.tags if t == "img"] == ["summary-histogram.svg"] and "a" not in tags
    html = markdown_html(md)
    for table in re.findall(r"<table>.*?</table>", html, re.S):
        rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)
        assert len({len(re.findall(r"<t[hd][ >]", row)) for row in rows}) == 1, "a message's pipes made a cell"
    text = "".join(page.text)
    assert escape.visible(MISSING) in text  # not graded: the name and the reason, visible
    assert "raised ValueError: \\x1b]0;pwned\\x07" in text  # mallory's diagnosis
    mistune = pytest.importorskip("mistune")
    assert "<a" not in mistune.create_markdown(plugins=["table", "url"], escape=False)(md)


@pytest.mark.slow
def test_feedback_pages_and_the_histogram_carry_no_live_markup(attacked):
    _, out, _, _ = attacked
    for name in STUDENTS:
        folder = results_dir(out, name, "ch17")
        text = (folder / "feedback.html").read_text(encoding="utf-8")
        assert not bad(text), name
        page = Tags(text)
        figures = json.loads((folder / "results.json").read_text(encoding="utf-8"))["figures"]
        assert [t for t, _ in page.tags if t in ("script", "img", "a", "iframe")] == ["img"] * len(figures), name
        assert not [a for _, a in page.tags if any(k.startswith("on") for k in a)], name
        assert escape.visible(name) in "".join(page.text), name
    mallory = "".join(Tags((out / "mallory" / "ch17" / "feedback.html").read_text(encoding="utf-8")).text)
    assert "<img src=x onerror=alert(1)>" in mallory and "\\u202egnp.exe" in mallory  # as text
    svg = (out / "summary-histogram.svg").read_text(encoding="utf-8")
    ET.fromstring(svg)
    assert not bad(svg)


@pytest.mark.slow
def test_course_check_of_a_hostile_submission_prints_nothing_it_chose(tmp_path, monkeypatch):
    """`course check --submission` and `course check all --submission` of a folder with a hostile name and
    hostile code: the report (styles kept, as on a terminal) shows the folder, the exception and what the
    code printed with every control character escaped; --json writes none either."""
    from grader.cli import main

    folder = tmp_path / NAMES[0]
    folder.mkdir()
    (folder / CH17.filename).write_text(hostile_module())
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    env = {"COLUMNS": None}
    styles = re.compile(r"\x1b\[[0-9;]*m")  # the report's own colours
    unsafe = [] if SANDBOX else ["--no-sandbox"]
    given = ["--submission", str(folder), "--seed", "1", *unsafe]
    for args in (["check", "ch17", *given], ["check", "all", *given]):
        result = runner.invoke(main, args, color=True, env=env, catch_exceptions=False)
        assert result.exit_code == 1, result.output
        shown = styles.sub("", result.output)
        assert not bad(shown), (args, bad(shown))
        assert escape.terminal(NAMES[0]) in shown, args
        if args[1] == "ch17":
            assert "raised ValueError: \\x1b]0;pwned\\x07 \\x1b[2K\\r \\x9b31m\\x85 \\u202egnp.exe\\u202c" in shown
            assert "your code printed:" in shown
    result = runner.invoke(main, ["check", "ch17", *given, "--json"], env=env, catch_exceptions=False)
    assert not bad(result.stdout) and json.loads(result.stdout)["score"] == 0
