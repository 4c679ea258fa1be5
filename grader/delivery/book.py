"""The figure book: every figure of the course on one offline page, `index.html`, with the SVG files beside it.

Laid out as the course's own figure index is: the dimension figures first (each takes one tensor
transformation apart cell by cell), then the overview (the course map, from an engine run), then two or three
figures per chapter, in course order. Each figure shows its id, its title, its Chinese and English captions,
and a thumbnail that opens the full SVG; a last card points to `course lab`.

Figures are drawn by the chapters' public checks (`grader.course.check_all`), from the reference, from a
submission folder (in its sandbox) or, in a student release, from the student's own exercises/: passing tasks
as drawn, wrong values marked as `course check` marks them, and a figure whose task does not yet return an
output of the right shape and type as a placeholder naming the task that draws it. The page embeds the subset
of the shipped fonts its own text needs (`figures.typeface`), as every SVG does: nothing is fetched.

A submission's folder name, the captions that name its values and the notes that say why a figure was not
drawn (an exception's message) are escaped for HTML by `grader.delivery.escape.html`, control characters included; the
placeholders' SVG text by the figure kit.
"""

from __future__ import annotations

import html
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from grader import chapters
from grader.delivery import escape
from grader.delivery.files import Folder
from grader.i18n import choose, tr
from grader.report import Report

LAB_PAGE = "lab.html"


@dataclass
class Entry:
    """One figure of the book: what the page says of it."""

    id: str
    chapter: str
    title: str
    zh: str
    en: str
    status: str
    """"drawn", "marked" (wrong values marked), "placeholder" (not drawn yet) or "reference"."""
    note: str = ""

    @property
    def file(self) -> str:
        return f"{self.id}.svg"

    @property
    def dimension(self) -> bool:
        return "-dim-" in self.id


@dataclass
class Book:
    """What `write_book` wrote: the page, its entries, and the run behind them."""

    index: Path
    entries: list[Entry]
    source: str
    reports: list[Report]

    @property
    def drawn(self) -> int:
        return sum(e.status != "placeholder" for e in self.entries)


def write_book(
    out: Path,
    *,
    submission: Path | None = None,
    sandbox: str | None = None,
    jobs: int | None = None,
    on_report: Callable[[Report], None] | None = None,
) -> Book:
    """Draw every figure of the course into `out` and write `out/index.html`.

    Args:
        out: the folder of the book (made if missing; the book's own files in it are replaced, nothing else).
        submission: a student's folder: its chapter modules draw the figures (in `sandbox`). Without it, the
            reference solutions draw them, or in a student release the student's own exercises/.
        jobs: chapters checked at once (default: one per core).
    """
    from grader.course import check_all

    out = Path(out)
    release = not any(chapters.SOLUTIONS.glob("ch[0-9][0-9]_*.py"))
    folder = submission or (chapters.EXERCISES if release else chapters.SOLUTIONS)
    ids = [ch.id for ch in chapters.all_chapters() if (Path(folder) / ch.filename).is_file()]
    source = (
        tr("the reference solutions")
        if folder == chapters.SOLUTIONS
        else tr("your exercises/")
        if folder == chapters.EXERCISES
        else tr("the submission in {folder}", folder=submission)
    )
    # made if missing; no link followed below out's parent: a planted link is refused, never written through
    with Folder.open(out) as book, tempfile.TemporaryDirectory(prefix="course-book-") as tmp:
        course = check_all(
            solutions=folder == chapters.SOLUTIONS,
            submission=None if folder in (chapters.SOLUTIONS, chapters.EXERCISES) else submission,
            hidden=False,
            jobs=jobs,
            figures_dir=Path(tmp),
            sandbox=sandbox,
            only=ids,
            on_report=on_report,
        )
        entries = _chapter_entries(course.reports, Path(tmp), book, folder)
        entries.insert(0, _overview_entry(book, course.reports, folder, release))
        dims = [e for e in entries if e.dimension]
        ordered = dims + [e for e in entries if not e.dimension]
        index = book.write("index.html", page(ordered, source))
        book.write(LAB_PAGE, lab_page())
    return Book(index, ordered, source, course.reports)


def _chapter_entries(reports: list[Report], drawn_in: Path, out: Folder, folder: Path) -> list[Entry]:
    """Every chapter figure, drawn or as a placeholder, written flat into `out`."""
    import figures

    by_chapter = {r.chapter.id: r for r in reports}
    entries = []
    for ch in chapters.all_chapters():
        report = by_chapter.get(ch.id)
        for spec in figures.catalog(ch.id):
            record = report.records.get(spec.id) if report else None
            zh, en = spec.captions(record) if record else _static(spec)
            drawn = drawn_in / ch.id / f"{spec.id}.svg"
            entry = Entry(spec.id, ch.id, spec.title, zh, en, "drawn")
            if drawn.is_file():
                out.write(entry.file, drawn.read_bytes())
                if report and any(p.endswith(f"/{spec.id}.svg") for p in report.marked):
                    entry.status, entry.note = "marked", tr("your wrong values are marked")
            else:
                tasks = list(dict.fromkeys(spec.needs.values()))
                why = (
                    tr("{file} is not in {folder}", file=ch.filename, folder=folder)
                    if report is None
                    else (report.undrawn.get(spec.id) or next((n for n in report.figure_notes if n.startswith(spec.id)), _waits_for(tasks)))
                )
                entry.status, entry.note = "placeholder", why
                out.write(entry.file, placeholder(spec.id, spec.title, zh, en, tasks, why))
            entries.append(entry)
    return entries


def _static(spec: Any) -> tuple[str, str]:
    """A figure's captions without a record (a caption that names the record's values gives its id)."""
    return tuple(c if isinstance(c, str) else spec.title for c in (spec.zh, spec.en))  # type: ignore[return-value]


def _overview_entry(out: Folder, reports: list[Report], folder: Path, release: bool) -> Entry:
    """The course map, from a short engine run: the reference's functions in the instructor's repository and
    for a submission (whose code never runs outside its sandbox: the map then lights the chapters whose
    engine tasks pass its public checks), the student's own functions in a student release."""
    import engine
    import figures

    (spec,) = figures.catalog("overview")
    try:
        if release:
            parts = engine.student_parts(folder)
        else:
            parts = engine.reference_parts()
        model = engine.load("tiny", seed=0)
        settings = engine.Settings(block_size=4, max_num_batched_tokens=4, speculative_tokens=3)  # chunks, drafts: every path
        prompts = [[1, 2, 3, 4, 5, 1, 2, 3], [1, 2, 3, 7]]
        result = engine.run(model=model, prompts=prompts, max_tokens=6, parts=parts, settings=settings)
        record = engine.overview_record(result, model)
        if folder not in (chapters.SOLUTIONS, chapters.EXERCISES):
            _light_passing(record, reports)
        zh, en = spec.captions(record)
        out.write("overview.svg", spec.render(record))
        return Entry("overview", "", spec.title, zh, en, "drawn")
    except Exception as e:  # noqa: BLE001 (the engine needs every task it uses: say which are missing)
        zh, en = _static(spec)
        why = str(e).split(". Run")[0]
        out.write("overview.svg", placeholder("overview", spec.title, zh, en, [], why))
        return Entry("overview", "", spec.title, zh, en, "placeholder", why)


def _light_passing(record: dict, reports: list[Report]) -> None:
    """Mark, on a reference run's course map, the chapters whose tasks pass in a submission's reports."""
    passing = {r.chapter.id: all(x.status == "passed" for x in r.results) for r in reports}
    for entry in record["course"]:
        if entry["part"] is not None:
            entry["part"] = "yours" if passing.get(entry["id"]) else "reference"


def _waits_for(tasks: list[str]) -> str:
    return tr("waits for {tasks}", tasks=", ".join(tasks))


def placeholder(figure_id: str, title: str, zh: str, en: str, tasks: list[str], why: str) -> str:
    """A figure not drawn yet: its header, and a dashed frame saying which task draws it."""
    from figures.kit import Figure, wrap
    from figures.style import LABEL, MARGIN

    f = Figure(figure_id, title=title, zh=zh, en=en)
    lines = [tr("drawn by {tasks} once it returns an output of the right shape and type", tasks=", ".join(tasks))] if tasks else []
    if why and why != _waits_for(tasks):
        lines.append(why)
    width = f.width - 2 * MARGIN - 40
    wrapped = [piece for line in lines for piece in wrap(line, width, LABEL)]
    height = 34 + 26 + 20 * len(wrapped) + 16
    f.box(MARGIN, f.y, f.width - 2 * MARGIN, height, role="masked", dashed=True)
    y = f.y + 34
    f.text(f.width / 2, y, tr("not drawn yet"), size=LABEL + 3, anchor="middle", weight="bold", cls="placeholder")
    for k, line in enumerate(wrapped):
        f.text(f.width / 2, y + 28 + 20 * k, line, size=LABEL, anchor="middle", cls="note")
    f.y += height + 8
    return f.svg()


# -- the page --------------------------------------------------------------------------------------------------
STYLE = """
:root { --ink: #1f1f1f; --muted: #5f5f5f; --rule: #d8d8d8; --accent: #0072B2; --wrong: #D55E00; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1240px; padding: 24px 20px 64px; color: var(--ink); font: 15px/1.55 %(sans)s; }
header h1 { font-size: 28px; margin: 0 0 4px; }
header p { margin: 2px 0; color: var(--muted); }
h2 { font-size: 20px; margin: 40px 0 4px; padding-top: 12px; border-top: 1px solid var(--rule); }
h2 small, .id, code { font: 12.5px/1.4 %(mono)s; color: var(--muted); }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%%, 380px), 1fr)); gap: 18px; margin-top: 14px; }
.card { border: 1px solid var(--rule); border-radius: 8px; padding: 12px 14px 14px; background: #fff; min-width: 0; }
.card.wide { grid-column: 1 / -1; }
.card h3 { font-size: 16px; margin: 2px 0 6px; }
.card img { display: block; width: 100%%; height: auto; border: 1px solid #eee; border-radius: 4px; margin: 8px 0; }
.card .zh { margin: 4px 0; }
.card .en { margin: 4px 0; color: var(--muted); font-size: 13.5px; }
.card a.open { font-size: 13.5px; color: var(--accent); text-decoration: none; }
.status { display: inline-block; font-size: 12px; padding: 1px 8px; border-radius: 10px; margin-left: 6px;
          background: #eef4fa; color: var(--accent); }
.status.marked { background: #fbe7dc; color: var(--wrong); }
.status.placeholder { background: #eee; color: var(--muted); }
.lab { background: #f7f9fb; }
"""


def page(entries: list[Entry], source: str) -> str:
    """The book's index.html: sections of cards, the embedded fonts, nothing fetched."""
    titles = {ch.id: ch for ch in chapters.all_chapters()}
    drawn = sum(e.status != "placeholder" for e in entries)
    zh = choose.language() == "zh"
    head = [
        tr("Figure index · {n} offline SVG figures", n=len(entries)),
        tr("First the elements and their coordinates, then the whole computation."),
        tr("Drawn from {source}: {drawn} of {total} figures so far.", source=source, drawn=drawn, total=len(entries)),
    ]
    sections: list[tuple[str, str, list[Entry]]] = [
        (tr("Dimensions, cell by cell"), "dimensions-cell-by-cell", [e for e in entries if e.dimension]),
        (tr("The course map"), "the-course-map", [e for e in entries if e.id == "overview"]),
    ]
    for ch_id, ch in titles.items():
        own = [e for e in entries if e.chapter == ch_id and not e.dimension]
        if own:
            sections.append((f"{int(ch_id[2:])} · {ch.title_zh if zh else ch.title_en}", ch_id, own))
    body = ["<header>", f"<h1>{escape.html(head[0])}</h1>"] + [f"<p>{escape.html(s)}</p>" for s in head[1:]]
    lab_link = escape.html(tr("The interactive experiments (course lab) →"))
    body += [f'<p><a class="open" href="{LAB_PAGE}">{lab_link}</a></p>', "</header>"]
    for title, anchor, items in sections:
        body.append(f'<h2 id="{anchor or _slug(title)}">{escape.html(title)}</h2>')
        body.append('<div class="grid">')
        body += [_card(e, wide=e.id == "overview") for e in items]
        body.append("</div>")
    lab_heading = escape.html(tr("Interactive experiments"))
    lab_text = tr(
        "Run {command}: it opens the experiments in your browser, where you change an instance and the figure is drawn "
        "again from your functions.",
        command="<code>course lab</code>",
    )
    holds = escape.html(tr("What the lab holds →"))
    body.append(
        f'<h2 id="lab">{lab_heading}</h2><div class="grid"><div class="card lab wide">'
        f'<p>{lab_text} <a class="open" href="{LAB_PAGE}">{holds}</a></p></div></div>'
    )
    text = "\n".join(body)
    return _document(tr("Course figures"), text)


def lab_page() -> str:
    """lab.html: what `course lab` offers, and how to start it (the lab itself runs only while served)."""
    from grader.lab import of_chapter

    items = []
    for ch in chapters.all_chapters():
        for exp in of_chapter(ch.id):
            items.append(f"<li><b>{escape.html(ch.id)}</b> · {escape.html(tr(exp.title))}: {escape.html(tr(exp.about))}</li>")
    heading = escape.html(tr("Interactive experiments (course lab)"))
    start = escape.html(tr("The experiments run your own functions: start them with"))
    serves = escape.html(tr("which serves them on {address} and opens your browser (Ctrl-C stops it).", address="http://127.0.0.1"))
    back = escape.html(tr("← Back to the figures"))
    body = (
        f"<header><h1>{heading}</h1><p>{start}</p>"
        f"<p><code>course lab</code></p><p>{serves}</p></header><ul>" + "\n".join(items) + '</ul><p><a class="open" href="index.html">'
        f"{back}</a></p>"
    )
    return _document("course lab", body)


def _card(e: Entry, *, wide: bool = False) -> str:
    label = escape.html(
        {"drawn": tr("drawn"), "marked": tr("wrong values marked"), "placeholder": tr("not drawn yet"), "reference": tr("reference")}[
            e.status
        ]
    )
    note = f'<p class="en">{escape.html(e.note)}</p>' if e.note and e.status == "placeholder" else ""
    alt = escape.html(f"{e.title} · {e.en}")
    return (
        f'<div class="card{" wide" if wide else ""}" id="{e.id}"><div class="id">{e.id}'
        f'<span class="status {e.status}">{label}</span></div><h3>{escape.html(e.title)}</h3>'
        f'<a href="{e.file}"><img src="{e.file}" alt="{alt}" loading="lazy"></a>'
        f'<p class="zh">{escape.html(e.zh)}</p><p class="en">{escape.html(e.en)}</p>{note}'
        f'<a class="open" href="{e.file}">{escape.html(tr("Open the full figure ↗"))}</a></div>'
    )


def _document(title: str, body: str) -> str:
    """A whole page whose text draws with the shipped fonts, embedded as the figures embed theirs."""
    import re

    from figures import typeface

    words = re.sub(r"<[^>]+>", " ", body)
    css, prefix = typeface.embed(
        [(html.unescape(words) + title, "sans", False), (html.unescape(words), "sans", True), (html.unescape(words), "mono", False)]
    )
    sans = ", ".join(filter(None, [prefix.get("sans", ""), "sans-serif"]))
    mono = ", ".join(filter(None, [prefix.get("mono", ""), "monospace"]))
    return (
        f'<!doctype html>\n<html lang="{"zh-Hans" if choose.language() == "zh" else "en"}"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape.html(title)}</title>\n<style>\n{css}\n{STYLE % {'sans': sans, 'mono': mono}}</style>"
        f"</head>\n<body>\n{body}\n</body></html>\n"
    )


def _slug(text: str) -> str:
    import re

    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
