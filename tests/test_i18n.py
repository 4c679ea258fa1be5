"""The course in Chinese and in English (grader/i18n): every text has both, the catalogs agree with the code and
with Babel, the language is chosen in the documented order, and a Chinese report of wrong answers has no English
sentence outside code."""

from __future__ import annotations

import ast
import io
import os
import re
import string
import subprocess
import sys
from pathlib import Path

import pytest
from babel.messages.pofile import read_po
from mutate import mutant

from grader import chapters
from grader.authoring.misconceptions import table
from grader.delivery import release
from grader.i18n import catalog, choose, commands, docstrings, update

CATALOGS = sorted(p for d in catalog.LOCALE_DIRS for p in d.glob("*/LC_MESSAGES/*.po"))


@pytest.fixture(scope="module")
def extracted():
    return update.extract()


def english(text: str) -> list[str]:
    """The English sentences of `text` outside code: runs of four or more English words, once code spans
    (`…`), identifiers, paths, numbers and formulas are taken out."""
    text = re.sub(r"`[^`\n]*`", " ", text)
    words = [w if re.fullmatch(r"[A-Za-z][a-z]+[,;:.]?", w) else "|" for w in text.split()]
    return [m.strip() for m in re.findall(r"(?:[A-Za-z][a-z]+[,;:.]? ){3,}[A-Za-z][a-z]+", " ".join(words))]


def fields(text: str) -> list[tuple[str, str, str | None]]:
    """A message's placeholders: (name, format spec, conversion), sorted."""
    return sorted((f, spec or "", conv) for _, f, spec, conv in string.Formatter().parse(text) if f is not None)


# -- the catalogs -------------------------------------------------------------------------------------------


def test_every_text_has_its_chinese(extracted):
    """Every marked text, check name, mistake and docstring paragraph has a Chinese translation (not fuzzy)."""
    zh = catalog.table("zh")
    missing = [
        f"{domain}{' (hidden)' if hidden else ''}: {text[:70]!r}"
        for (domain, hidden), found in extracted.items()
        for text in found
        if text not in zh
    ]
    assert not missing, f"{len(missing)} texts without Chinese (python -m grader.i18n todo DOMAIN):\n" + "\n".join(missing[:40])


@pytest.mark.parametrize("path", CATALOGS, ids=lambda p: f"{p.parent.parent.parent.parent.name}/{p.stem}")
def test_a_translation_keeps_the_placeholders(path: Path):
    with path.open("rb") as f:
        cat = read_po(f)
    wrong = []
    for m in cat:
        if not m.id or not m.string or not isinstance(m.id, str) or re.match(r"ch\d{2}_", m.context or ""):
            continue  # a docstring's paragraph is never formatted: its braces are prose
        try:
            same = fields(m.id) == fields(m.string)
        except ValueError as e:  # an unbalanced brace
            same, m.string = False, f"{m.string} ({e})"
        if not same:
            wrong.append(f"{m.context or ''} {m.id[:60]!r}: {fields(m.id)} → {m.string[:60]!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", CATALOGS, ids=lambda p: f"{p.parent.parent.parent.parent.name}/{p.stem}")
def test_the_reader_reads_what_babel_reads(path: Path):
    with path.open("rb") as f:
        cat = read_po(f)
    babel = {(m.context, m.id): m.string for m in cat if m.id and m.string and not m.fuzzy}
    assert catalog.read(path) == babel


def test_a_text_has_one_translation_in_every_catalog():
    """All catalogs make one table: a text written the same way in two chapters is translated the same way (or
    given a context with `tr_in` where it means something else)."""
    seen: dict[tuple[str | None, str], tuple[str, str]] = {}
    differ = []
    for path in CATALOGS:
        for key, text in catalog.read(path).items():
            if key in seen and seen[key][1] != text:
                differ.append(f"{key[1][:50]!r}: {seen[key][0]} {seen[key][1][:40]!r}, {path.stem} {text[:40]!r}")
            seen.setdefault(key, (path.stem, text))
    assert not differ, "\n".join(differ)


def test_catalogs_are_not_stale(extracted):
    """No catalog keeps a text the code no longer has (`python -m grader.i18n update` drops them)."""
    live = {(domain, hidden, key) for (domain, hidden), found in extracted.items() for key in found}
    stale = []
    for (domain, hidden), _found in extracted.items():
        path = update.path_of(domain, hidden, "zh")
        if path.exists():
            stale += [f"{path.name}: {k[1][:60]!r}" for k in catalog.read(path) if (domain, hidden, k) not in live]
    assert not stale, "\n".join(stale[:30])


def test_a_translation_falls_back_to_the_english():
    choose.set_language("zh")
    try:
        assert catalog.tr("a text nobody translated, {n} times", n=3) == "a text nobody translated, 3 times"
        assert catalog.tr("a number, please") != "a number, please", "a translated one is translated"
    finally:
        choose.set_language("en")


# -- choosing the language ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, want",
    [
        ({"COURSE_LANG": "en", "LANG": "zh_CN.UTF-8"}, "en"),
        ({"LANG": "zh_CN.UTF-8"}, "zh"),
        ({"LANGUAGE": "zh_TW:en", "LANG": "en_US.UTF-8"}, "zh"),
        ({"LANGUAGE": "", "LC_ALL": "en_US.UTF-8", "LANG": "zh_CN.UTF-8"}, "en"),
        ({"LC_MESSAGES": "zh_CN.UTF-8", "LANG": "C.UTF-8"}, "zh"),
        ({"LANG": "C.UTF-8"}, "en"),
        ({"LANG": "fr_FR.UTF-8"}, "en"),
        ({}, "en"),
    ],
)
def test_the_repository_follows_the_locale_as_gettext_reads_it(env, want, monkeypatch):
    monkeypatch.setattr(choose, "SETTING", Path("/nonexistent/course.json"))
    assert choose.resolve(env) == want


def test_a_release_speaks_its_setting_and_grading_never_reads_the_locale(tmp_path, monkeypatch):
    monkeypatch.setattr(choose, "SETTING", tmp_path / "course.json")
    assert choose.resolve({"LANG": "C.UTF-8"}, grading=True) == "zh", "the course's language by default"
    choose.write_setting(tmp_path, "en")
    assert choose.resolve({"LANG": "zh_CN.UTF-8"}) == "en", "the release's setting before the locale"
    assert choose.resolve({"LANG": "zh_CN.UTF-8", "COURSE_LANG": "zh"}) == "zh", "COURSE_LANG first"
    with pytest.raises(choose.UnknownLanguage, match="zh .* or en"):
        choose.normalize("fr")


def test_a_language_the_course_does_not_speak_is_refused_naming_both():
    out = course("list", env={"COURSE_LANG": "fr"})
    assert out.returncode == 2 and "COURSE_LANG" in out.stderr and "zh" in out.stderr and "en" in out.stderr, out.stderr
    bad = course("list", "--lang", "fr")
    assert bad.returncode == 2 and "zh" in bad.stderr, bad.stderr


def test_lang_is_read_anywhere_on_the_command_line():
    assert commands.scan(["check", "ch17", "--lang", "en", "-v"]) == "en"
    assert commands.scan(["--lang=zh", "list"]) == "zh"
    assert commands.scan(["check", "--", "--lang", "en"]) is None


def course(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("COURSE_LANG", "LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")}
    return subprocess.run(
        [sys.executable, "-m", "grader.cli", *args], capture_output=True, text=True, env={**base, **(env or {})}, cwd=chapters.ROOT
    )


def test_the_command_line_speaks_both(tmp_path):
    zh = course("--help", env={"LANG": "zh_CN.UTF-8"})
    en = course("--help", "--lang", "en", env={"LANG": "zh_CN.UTF-8"})
    assert zh.returncode == en.returncode == 0
    assert re.search(r"[\u4e00-\u9fff]{4}", zh.stdout) and not english(zh.stdout.split("\n", 1)[1]), zh.stdout
    assert not re.search(r"[\u4e00-\u9fff]{4}", en.stdout.replace("中文", "")), en.stdout
    bad = course("check", "ch99", "--lang", "zh")
    assert bad.returncode == 2 and re.search(r"[\u4e00-\u9fff]", bad.stderr), bad.stderr


# -- docstrings and the release ---------------------------------------------------------------------------------


def _code_only(source: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body[0].value.value = ""
    return ast.dump(tree)


@pytest.mark.parametrize("path", sorted(chapters.EXERCISES.glob("ch*.py")), ids=lambda p: p.stem)
def test_a_chinese_exercise_keeps_its_code_and_translates_its_prose(path: Path):
    source = path.read_text(encoding="utf-8")
    zh = docstrings.translate_source(source, path.stem, "zh")
    assert _code_only(zh) == _code_only(source), "only the docstrings change"
    assert docstrings.translate_source(source, path.stem, "en") == source
    left = [p for _, p, _ in docstrings.messages(zh, path.stem) if english(p)]
    assert not left, f"{len(left)} English paragraphs left: {left[0][:200]!r}"


def test_a_translated_docstring_keeps_what_the_grader_reads_in_it(extracted):
    """`Task chNN.k` marks a task (grader/chapters.py; "任务 chNN.k" in Chinese) and code is in backticks: a
    translation keeps both."""
    zh = catalog.table("zh")
    wrong = []
    for (domain, _hidden), found in extracted.items():
        for context, text in found:
            if context and context.startswith(domain + "_") and (context, text) in zh:
                got = zh[(context, text)]
                if chapters.task_of(text) != chapters.task_of(got):
                    wrong.append(f"{context}: {chapters.task_of(text)} marked, {chapters.task_of(got)} kept")
                flat = lambda t: re.sub(r"\s+", " ", t)  # a code span may wrap at another place
                wrong += [f"{context}: {w!r} lost" for w in sorted(set(re.findall(r"`[^`]+`", text))) if flat(w) not in flat(got)]
    assert not wrong, "\n".join(wrong[:30])


def test_the_release_writes_its_language(tmp_path):
    for lang in ("zh", "en"):
        dest = tmp_path / lang
        release._copy_package(chapters.EXERCISES, dest, {"ch17"}, lang)
        text = (dest / "ch17_causal_masks.py").read_text(encoding="utf-8")
        chinese = len(re.findall(r"[\u4e00-\u9fff]", text))
        assert (chinese > 400) == (lang == "zh"), (lang, chinese)
        choose.write_setting(dest, lang)
        assert choose.course_setting(dest / "course.json") == lang


# -- a Chinese report of wrong answers ---------------------------------------------------------------------------------

REPORTED = ("ch17", "ch20", "ch24", "ch27", "ch31")


@pytest.mark.slow
@pytest.mark.parametrize("chapter_id", REPORTED)
def test_a_chinese_report_of_wrong_answers_has_no_english_sentence(tmp_path, chapter_id: str):
    """One mistake per task, from the chapter's table, graded in Chinese: every line outside code is Chinese."""
    rows, tasks = [], set()
    for row in table(chapter_id):
        if row.edits and not tasks & set(row.tasks):
            rows.append(row)
            tasks |= set(row.tasks)
    edits = [e for row in rows for e in row.edits]
    try:
        submission = mutant(tmp_path / "sub", chapter_id, *edits)
    except AssertionError:  # two rows edit the same line: one per task is enough
        submission = mutant(tmp_path / "sub", chapter_id, *rows[0].edits)
    out = course(  # unwrapped lines, so the student's own words are told apart line by line
        "check", chapter_id, "--submission", str(submission), "--no-sandbox", "-v", "--seed", "1", "--lang", "zh", env={"COLUMNS": "1000"}
    )
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert len(re.findall(r"[\u4e00-\u9fff]", text)) > 100, text[-2000:]
    # What the student's own code says is theirs: its exception's message, the lines of code it names, and the
    # warnings Python or torch print while it runs.
    theirs = re.sub(r"(抛出了 \w+[:：]).*", r"\1", text)
    theirs = re.sub(r"(?m)^\s*(位置：|位于 \S+:\d+，).*$", "", theirs)
    theirs = re.sub(r"(?m)^\s*\S+:\d+: \w*Warning: .*$", "", theirs)
    found = english(theirs)
    assert not found, f"English in the Chinese report of {chapter_id}:\n" + "\n".join(found[:20]) + "\n---\n" + text[-4000:]


def test_babel_and_the_reader_agree_on_a_tricky_catalog(tmp_path):
    po = tmp_path / "x.po"
    po.write_text(
        'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
        '#: a.py\nmsgctxt "ch17.topleft"\nmsgid "a \\"quoted\\" {n}"\nmsgstr ""\n"第一行\\n"\n"第二行 {n}"\n\n'
        '#, fuzzy\nmsgid "old"\nmsgstr "旧"\n\n'
        'msgid "empty"\nmsgstr ""\n\n'
        '#~ msgid "gone"\n#~ msgstr "没了"\n',
        encoding="utf-8",
    )
    with po.open("rb") as f:
        cat = read_po(io.BytesIO(f.read()))
    assert catalog.read(po) == {(m.context, m.id): m.string for m in cat if m.id and m.string and not m.fuzzy}
    assert catalog.read(po) == {("ch17.topleft", 'a "quoted" {n}'): "第一行\n第二行 {n}"}
