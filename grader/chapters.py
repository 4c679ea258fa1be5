"""Chapters are found by file name: `solutions/chNN_<slug>.py` (or `exercises/` in a
student release). A chapter's title is the first line of its module docstring
("<zh> · <en>"); its tasks are the functions and classes whose docstring says
`Task chNN.k`. Nothing here imports the chapter, so discovery is cheap and safe.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from grader.i18n import tr

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
ANSWERS = ROOT / "grader" / "answers"
"""Only in a student release: per chapter, its description and the reference's public answers."""

FILE_RE = re.compile(r"^(ch\d{2})_(\w+)\.py$")


def has_solutions() -> bool:
    """Whether this installation holds the reference solutions: the instructor's repository, not a student release
    (which `course release` writes without solutions/). The command line shows instructor parts only here."""
    return any(SOLUTIONS.glob("ch[0-9][0-9]_*.py"))


def missing_exercise(chapter: "Chapter") -> str:
    """What a student whose exercises/ lacks the chapter's file is told: how to get it back."""
    rel = f"exercises/{chapter.filename}"
    if has_solutions():
        return tr(
            "{file} is missing (renamed, moved or deleted?): `course stubs {chapter}` writes a fresh stub, "
            "or `git checkout -- {file}` restores the committed one",
            file=rel,
            chapter=chapter.id,
        )
    return tr(
        "{file} is missing (renamed, moved or deleted?): copy it back from the release you were given (the same file "
        "in its exercises/), or, if you keep your work in git, `git checkout -- {file}`",
        file=rel,
    )


TASK_RE = re.compile(r"\bTask (ch\d{2}\.\d+)\b|任务 ?(ch\d{2}\.\d+)。")
"""What marks a task in a docstring: "Task ch25.1", or in a Chinese docstring "任务 ch25.1。" (a sentence of its
own: "（任务 ch19.4 加上 V）" only mentions one)."""


def task_of(docstring: str | None) -> str | None:
    """The task a docstring marks ("ch25.1"), or None."""
    m = TASK_RE.search(docstring or "")
    return (m.group(1) or m.group(2)) if m else None


@dataclass(frozen=True)
class Task:
    """One graded task: `id` is "ch25.1" (everywhere: checks, figures, messages, the CLI); `names` the functions or
    classes it grades (often one)."""

    id: str
    names: tuple[str, ...]
    params: dict[str, tuple[str, ...]]
    """Each graded name's parameter names, for messages about its arguments."""

    @property
    def name(self) -> str:
        return ", ".join(self.names)

    @property
    def number(self) -> tuple[int, int]:
        """(25, 1) for ch25.1: the order of tasks."""
        chapter, _, k = self.id.removeprefix("ch").partition(".")
        return int(chapter), int(k)

    @property
    def label(self) -> str:
        return f"{self.id} {self.name}"


@dataclass(frozen=True)
class Chapter:
    """A chapter as its source file describes it."""

    id: str
    slug: str
    title_zh: str
    title_en: str
    tasks: tuple[Task, ...]

    @property
    def filename(self) -> str:
        return f"{self.id}_{self.slug}.py"

    @property
    def title(self) -> str:
        """The title as a report shows it: Chinese alone in a Chinese run, "中文 · English" otherwise (the
        course's titles are Chinese; an English reader keeps both, as the figure index has them)."""
        from grader.i18n import language

        return self.title_zh if language() == "zh" else f"{self.title_zh} · {self.title_en}"

    def task(self, task_id: str) -> Task:
        """Look a task up by "ch25.1" (also "25.1" or "1"); raise UnknownName otherwise."""
        wanted = task_id if task_id.startswith("ch") else f"ch{task_id}"
        if "." not in wanted:
            wanted = f"{self.id}.{task_id}"
        for t in self.tasks:
            if t.id == wanted or task_id in t.names:
                return t
        known = [t.id for t in self.tasks] + [n for t in self.tasks for n in t.names]
        elsewhere = next(
            ((ch, t) for ch in all_chapters() if ch.id != self.id for t in ch.tasks if t.id == wanted or task_id in t.names), None
        )
        if elsewhere:
            ch, t = elsewhere
            fields = {"task": t.id, "name": task_id, "chapter": ch.id, "title": ch.title_en, "this": self.id}
            if t.id == wanted:
                note = tr("{task} is a task of {chapter} ({title}), not of {this}: run `course check {chapter} --task {task}`.", **fields)
            else:
                note = tr(
                    "{name} is task {task} of {chapter} ({title}), not of {this}: run `course check {chapter} --task {task}`.", **fields
                )
            raise UnknownName("task", task_id, known, note=note)
        raise UnknownName("task", task_id, known)


class UnknownName(LookupError):
    """A chapter or task name that does not exist, with the closest real ones."""

    def __init__(self, kind: str, name: str, known: list[str], *, suggestions: list[str] | None = None, note: str = "") -> None:
        self.kind, self.name = kind, name
        self.suggestions = difflib.get_close_matches(name, known, n=3, cutoff=0.6) if suggestions is None else suggestions
        if len(self.suggestions) > 1:
            options = tr("{some} or {last}", some=", ".join(self.suggestions[:-1]), last=self.suggestions[-1])
        else:
            options = "".join(self.suggestions)
        hint = note if note else tr("Did you mean {options}?", options=options) if self.suggestions else ""
        fields = {"name": repr(name), "known": ", ".join(known), "hint": hint}
        if kind == "task":
            message = tr("No task {name}. {hint} Known: {known}.", **fields) if hint else tr("No task {name}. Known: {known}.", **fields)
        elif kind == "experiment":
            message = (
                tr("No experiment {name}. {hint} Known: {known}.", **fields)
                if hint
                else tr("No experiment {name}. Known: {known}.", **fields)
            )
        else:
            message = (
                tr("No chapter {name}. {hint} Known: {known}.", **fields) if hint else tr("No chapter {name}. Known: {known}.", **fields)
            )
        super().__init__(message)


@cache
def all_chapters() -> tuple[Chapter, ...]:
    """Every chapter, in course order: from solutions/, or in a student release from its
    recorded description (never from exercises/, which students edit)."""
    found = []
    for path in sorted(SOLUTIONS.glob("ch[0-9][0-9]_*.py")):
        m = FILE_RE.match(path.name)
        if m:
            found.append(parse(path.read_text(encoding="utf-8"), m.group(1), m.group(2)))
    if not found:
        for path in sorted(ANSWERS.glob("ch[0-9][0-9].json")):
            found.append(from_record(json.loads(path.read_text(encoding="utf-8"))["chapter"]))
    return tuple(found)


def to_record(ch: Chapter) -> dict:
    """A chapter as plain data (what a student release stores)."""
    return {
        "id": ch.id,
        "slug": ch.slug,
        "title_zh": ch.title_zh,
        "title_en": ch.title_en,
        "tasks": [[t.id, list(t.names), {n: list(p) for n, p in t.params.items()}] for t in ch.tasks],
    }


def from_record(r: dict) -> Chapter:
    tasks = tuple(Task(tid, tuple(names), {n: tuple(p) for n, p in params.items()}) for tid, names, params in r["tasks"])
    return Chapter(r["id"], r["slug"], r["title_zh"], r["title_en"], tasks)


def find(name: str) -> Chapter:
    """Resolve "ch25", "25", "paged_kv", "ch25_paged_kv", a word of its slug or English title ("paged") or a
    function it grades ("slot_mapping") to a chapter. A word several chapters share names them all."""
    key = name.strip().lower().removesuffix(".py")
    for ch in all_chapters():
        if key in (ch.id, ch.id[2:], str(int(ch.id[2:])), ch.slug, f"{ch.id}_{ch.slug}"):
            return ch
    known = [ch.id for ch in all_chapters()]
    matches = [ch for ch in all_chapters() if key in _words(ch) or key in {n.lower() for t in ch.tasks for n in t.names}]
    if len(matches) == 1:
        return matches[0]
    if matches:
        fits = ", ".join(f"{ch.id} ({ch.title_en})" for ch in matches)
        raise UnknownName("chapter", name, known, note=tr("{name} fits {chapters}: name one of them.", name=repr(name), chapters=fits))
    raise UnknownName("chapter", name, known)


_NOT_A_NAME = {"the", "and", "its", "from", "into", "with", "step", "vs"}


def _words(ch: Chapter) -> set[str]:
    """The words a chapter can be called by: its slug's and its English title's (without filler words)."""
    words = set(ch.slug.split("_")) | set(re.findall(r"[a-z0-9]+", ch.title_en.lower()))
    return {w for w in words if len(w) > 2 and w not in _NOT_A_NAME}


def parse(source: str, chapter_id: str, slug: str) -> Chapter:
    """Read a chapter's title and tasks from its source text."""
    tree = ast.parse(source)
    title = (ast.get_docstring(tree) or slug).splitlines()[0].rstrip(".")
    zh, _, en = title.partition(" · ")
    graded: dict[str, dict[str, tuple[str, ...]]] = {}  # task id -> {name: params}, in source order
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            task = task_of(ast.get_docstring(node))
            if task:
                if not task.startswith(chapter_id + "."):
                    raise ValueError(f"{node.name} in {chapter_id} is marked as task {task}")
                graded.setdefault(task, {})[node.name] = _params(node)
    tasks = tuple(Task(tid, tuple(fns), fns) for tid, fns in graded.items())
    return Chapter(chapter_id, slug, zh.strip(), (en or zh).strip(), tasks)


def _params(node: ast.FunctionDef | ast.ClassDef) -> tuple[str, ...]:
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        return _params(init)[1:] if init else ()
    a = node.args
    return tuple(p.arg for p in a.posonlyargs + a.args + a.kwonlyargs)
