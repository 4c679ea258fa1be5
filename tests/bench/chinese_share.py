"""How much of what a student reads is Chinese, surface by surface (issue 24's measure).

    COURSE_LANG=zh LANG=zh_CN.UTF-8 .venv/bin/python tests/bench/chinese_share.py [--figures]

Each surface is cut into units a reader reads at once (a hint, a report line, a docstring paragraph, a help
line, a notebook paragraph, a lab text, a figure's text element, a README paragraph, a page's text node). A
unit without prose (only code, identifiers, numbers, or one or two words: the terms the course keeps in English,
"token 2", "rank 0", "block table") is left out; a unit is Chinese when it has Chinese
characters and no run of four English words outside code (`tests/test_i18n.py`'s test), English otherwise.
The share is Chinese units over all. It runs on code from before the catalogs too (it then reads the texts as
they were), so the same command measures before and after. --figures adds the figures (a `check all`, a minute).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("COURSE_LANG", "zh")

CJK = re.compile(r"[\u3400-\u9fff]")
REPORTED = ("ch17", "ch20", "ch24", "ch27", "ch31")


def english_runs(text: str) -> list[str]:
    text = re.sub(r"`[^`\n]*`", " ", text)
    words = [w if re.fullmatch(r"[A-Za-z][a-z]+[,;:.]?", w) else "|" for w in text.split()]
    return re.findall(r"(?:[A-Za-z][a-z]+[,;:.]? ){3,}[A-Za-z][a-z]+", " ".join(words))


def kind(unit: str) -> str | None:
    """'zh', 'en', or None for a unit without prose."""
    prose = re.sub(r"`[^`\n]*`", " ", unit)
    words = sum(bool(re.fullmatch(r"[A-Za-z][a-z]+[,;:.!?]?", w)) for w in prose.split())
    if CJK.search(prose):
        return "en" if english_runs(prose) else "zh"
    return "en" if words >= 3 else None  # a label of a term or two ("token 2", "rank 0", "block table") is no prose


def share(units: list[str]) -> tuple[int, int]:
    kinds = [k for k in map(kind, units) if k]
    return sum(k == "zh" for k in kinds), len(kinds)


class Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        self.skip += tag in ("style", "script", "code")

    def handle_endtag(self, tag):
        self.skip -= tag in ("style", "script", "code")

    def handle_data(self, data):
        if not self.skip and data.strip():
            self.parts.append(data.strip())


def html_units(html: str) -> list[str]:
    p = Text()
    p.feed(html)
    return p.parts


def course(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "grader.cli", *args], capture_output=True, text=True, cwd=ROOT)
    return out.stdout + out.stderr


def lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def translated_source(path: Path) -> str:
    source = path.read_text(encoding="utf-8")
    try:
        from grader.i18n import docstrings
    except ImportError:
        return source
    return docstrings.translate_source(source, path.stem, "zh")


def paragraphs_of_docstrings(source: str) -> list[str]:
    import ast
    import inspect

    out = []
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            if isinstance(body[0].value.value, str):
                out += [p for p in re.split(r"\n\s*\n", inspect.cleandoc(body[0].value.value)) if ">>>" not in p]
    return out


def surfaces(with_figures: bool) -> dict[str, list[str]]:
    from grader import chapters
    from grader.authoring.misconceptions import mistakes, table

    chs = chapters.all_chapters()
    got: dict[str, list[str]] = {}
    got["hints (tables of mistakes)"] = [str(mistakes(ch.id).hint(m.id)) for ch in chs for m in table(ch.id)]

    from mutate import mutant

    report: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for cid in REPORTED:
            rows, tasks = [], set()
            for row in table(cid):
                if row.edits and not tasks & set(row.tasks):
                    rows.append(row)
                    tasks |= set(row.tasks)
            try:
                sub = mutant(Path(tmp) / cid, cid, *[e for r in rows for e in r.edits])
            except AssertionError:
                sub = mutant(Path(tmp) / cid, cid, *rows[0].edits)
            report += lines(course("check", cid, "--submission", str(sub), "--no-sandbox", "-v", "--seed", "1"))
    got["check report of wrong answers (5 chapters)"] = report

    exercises = sorted(chapters.EXERCISES.glob("ch*.py"))
    got["exercise docstrings"] = [p for path in exercises for p in paragraphs_of_docstrings(translated_source(path))]

    cli = lines(course("--help")) + lines(course("check", "ch99")) + lines(course("check"))
    for command in ("check", "list", "doctor", "lab", "engine", "grade", "release", "book"):
        cli += lines(course(command, "--help"))
    got["CLI help and errors"] = cli
    got["course doctor"] = lines(course("doctor", "--quick"))

    from grader.delivery import notebook

    nb = []
    for ch in chs:
        for cell in notebook.chapter_notebook(ch)["cells"]:
            if cell["cell_type"] == "markdown":
                nb += [p for p in re.split(r"\n\s*\n", "".join(cell["source"]))]
    got["notebooks (markdown)"] = nb

    from grader import lab

    labs = []
    for exp in lab.catalog().experiments.values():
        doc = exp.to_json()
        labs += [doc["title"], doc["about"], doc.get("varies", "")] + [str(p.get("label", p.get("help", ""))) for p in doc["params"]]
    html = (ROOT / "grader" / "lab" / "static" / "index.html").read_text(encoding="utf-8")
    js = (ROOT / "grader" / "lab" / "static" / "lab.js").read_text(encoding="utf-8")
    try:  # the page as the lab serves it, and lab.js's words as it shows them
        from grader.lab import server

        html, shown = server.localized_page(html, "zh"), server.page_text("zh")
    except (ImportError, AttributeError):
        shown = {}
    labs += html_units(html)
    js = re.sub(r"(?m)^\s*//.*$", "", js)  # comments are for developers
    js = re.sub(r"([\"'])\s*\+\s*\1", "", js)  # "a " + "b": one text
    literals = re.findall(r'"((?:[^"\\\n]|\\.){12,}?)"|\'((?:[^\'\\\n]|\\.){12,}?)\'|`((?:[^`\\]|\\.){12,}?)`', js)
    labs += [shown.get(s, s) for group in literals for s in group if " " in s and "${" not in s]
    got["lab page and experiments"] = labs

    from grader.delivery import release

    got["student release README"] = [p for p in re.split(r"\n\s*\n", release._readme(chs)) if not p.startswith("```")]

    from grader.delivery import book

    got["figure book page"] = html_units(book.page([], "")) + html_units(book.lab_page())

    if with_figures:
        with tempfile.TemporaryDirectory() as tmp:
            course("check", "all", "--solutions", "--figures", tmp, "--seed", "1")
            texts = []
            for svg in sorted(Path(tmp).rglob("*.svg")):
                body = svg.read_text(encoding="utf-8")
                for cls, text in re.findall(r'<text[^>]*?class="([^"]*)"[^>]*>(.*?)</text>', body, re.S):
                    if "caption-en" not in cls:
                        texts.append(re.sub(r"<[^>]+>", "", text))
            got["figures (text elements, English caption left out)"] = texts
    return got


def main() -> None:
    result = {}
    for name, units in surfaces("--figures" in sys.argv).items():
        zh, n = share(units)
        result[name] = {"chinese": zh, "units": n, "share": round(zh / n, 3) if n else None}
        print(f"{name:55s} {zh:5d}/{n:<5d} {100 * zh / max(n, 1):5.1f} %")
    if "--json" in sys.argv:
        print(json.dumps(result, ensure_ascii=False))


if __name__ == "__main__":
    main()
