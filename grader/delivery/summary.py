"""The class summary `course grade` writes beside grades.csv: summary.json, summary.md and a
score histogram, summary-histogram.svg.

Per chapter it gives:

- every student counted, in a count line that adds up (`8 students = 1 passed + 4 failed + 1 not
  implemented + 2 not graded`): one who could not be graded (no answer, a file that does not parse,
  a broken zip) scores 0 and is listed by name with the reason. The mean and the median are
  over all the chapter's students, those at 0 included, as grades.csv has them (and the mean
  over the graded alone beside them). A folder whose name starts with a dot (`.DS_Store_dir`,
  `.ipynb_checkpoints`) is no student: it is listed as skipped and counted nowhere;
- the wrong answers, one row per diagnosis: a diagnosis is a message's hint line (`hint: ...`)
  when it has one, else its first line with its numbers left out, since the numbers are each
  student's own. Each row says how many graded students had it and which checks it covers, each
  with how many graded students failed that check; a message is cut at a word boundary. So a
  mistake that fails ten checks is one row, not ten. summary.json also keeps, per check, the
  share failing it, how many met the stub's NotImplementedError ("not implemented") and its
  most common wrong answer;
- the students whose answer was found under another name (`grader.delivery.layout`, rung 3), so that
  they can be told to rename it;
- a histogram of the scores in ten bands of the chapter's points (summary-histogram.svg, drawn
  with the course's figure kit), students not graded and not implemented shown apart.

Names and messages come from the submissions: in summary.md each is a code span or escaped prose
(`grader.delivery.escape`), so that no markup, link, image, table cell or HTML comes of it, and no control
character of it is written.
"""

from __future__ import annotations

import collections
import math
import re
import statistics
from typing import Any

from grader.chapters import Chapter
from grader.delivery import escape
from grader.i18n import language, mark, tr, tr_in
from grader.report import is_hint_line

HISTOGRAM = "summary-histogram.svg"
"""The histogram's file in OUT, beside summary.md."""
BANDS = 10
"""Score bands of the histogram, each a tenth of the chapter's points (full marks in the last)."""
MESSAGE_CHARS = 160
"""A message in summary.md is cut at the last word boundary before this many characters."""
REASON_CHARS = 300
"""So is the reason a student could not be graded."""
DIAGNOSES = 25
"""Rows of the table of wrong answers in summary.md (the rest, each of fewer students, in summary.json)."""
NAMED_CHECKS = 3
"""Checks of one task a diagnosis names in its row; more are counted."""
CHECK_CHARS = 48
"""A check's name in that row is cut at a word boundary before this many characters."""
KINDS = (
    ("graded", "q", mark("graded")),
    ("not_implemented", "k", mark("not implemented (the stub as given)")),
    ("not_graded", "masked", mark("not graded: 0 points")),
)
"""The histogram's stacked segments: summary key, figure role (colour), legend (marked: `tr` it where drawn)."""
STATUS_COUNTS = {
    "passed": mark("{n} passed"),
    "incomplete": mark("{n} incomplete"),
    "failed": mark("{n} failed"),
    "not implemented": mark("{n} not implemented"),
    "blocked": mark("{n} blocked"),
    "not graded": mark("{n} not graded"),
}
"""How the count line of summary.md names the students of each status (marked: `tr` it where written)."""
_NUMBER = re.compile(r"[-−]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def summarize(items: list, chosen: list[Chapter], docs: list[dict]) -> dict:
    """The summary of each chapter (summary.json) from the class's items (`grader.delivery.grade.Item`)
    and their results documents, in the same order."""
    summary = {}
    for ch in chosen:
        everyone = [(i, d) for i, d in zip(items, docs) if i.chapter == ch.id]
        mine = [(i, d) for i, d in everyone if i.recorded]  # a dot folder's row is no student's
        max_score = mine[0][1]["max_score"] if mine else 0
        graded = [(i, d) for i, d in mine if d["status"] != "error"]
        scores = [float(d["score"]) for _, d in mine]
        statuses = collections.Counter("not graded" if d["status"] == "error" else d["status"] for _, d in mine)
        summary[ch.id] = {
            "title": ch.title,
            "students": len(mine),
            "errors": len(mine) - len(graded),
            "graded": len(graded),
            "statuses": dict(statuses),
            "max_score": max_score,
            "mean_score": round(statistics.fmean(scores), 2) if scores else 0.0,
            "median_score": round(statistics.median(scores), 2) if scores else 0.0,
            "mean_score_graded": round(statistics.fmean([float(d["score"]) for _, d in graded]), 2) if graded else 0.0,
            "not_graded": [{"student": i.student, "reason": d.get("error", "")} for i, d in mine if d["status"] == "error"],
            "renamed": [{"student": i.student, "answer": d.get("answer") or i.where} for i, d in graded if i.renamed],
            "skipped": [{"student": i.student, "reason": d.get("error", "")} for i, d in everyone if not i.recorded],
            "checks": _checks([d for _, d in graded]),
            "diagnoses": _diagnoses([d for _, d in graded]),
            "not_implemented": _not_implemented([d for _, d in graded]),
            "histogram": _bands(mine, max_score),
        }
    return summary


def _checks(graded: list[dict]) -> list[dict]:
    """Per check, over the graded documents: how many failed it, how many of those had not
    implemented it, and the wrong answers' messages in groups, most common first."""
    order: dict[str, int] = {}
    failing: dict[str, int] = collections.Counter()
    todo: dict[str, int] = collections.Counter()
    groups: dict[str, dict[str, list[str]]] = collections.defaultdict(dict)
    for doc in graded:
        for test in doc["tests"]:
            name = test["name"]
            order.setdefault(name, len(order))
            if test["status"] == "passed":
                continue
            failing[name] += 1
            if test.get("todo"):
                todo[name] += 1
                continue
            kind, key, shown = message_group(test.get("output", ""))
            groups[name].setdefault(key, []).append(shown)
    result: list[dict[str, Any]] = []
    for name in order:
        ranked = sorted(groups[name].values(), key=len, reverse=True)  # stable: the first seen wins a tie
        wrong = failing[name] - todo[name]
        result.append(
            {
                "check": name,
                "failed": failing[name],
                "not_implemented": todo[name],
                "wrong": wrong,
                "graded": len(graded),
                "percent_failing": round(100 * failing[name] / len(graded)) if graded else 0,
                "most_common_message": ranked[0][0] if ranked else "",
                "students_with_it": len(ranked[0]) if ranked else 0,
                "kinds_of_message": len(ranked),
            }
        )
    result.sort(key=lambda c: (-c["failed"], order[c["check"]]))
    return result


def _diagnoses(graded: list[dict]) -> list[dict]:
    """The wrong answers (not the stub's NotImplementedError) grouped by diagnosis (`message_group`), over
    the graded documents: each group's first message, how many students had it, and the checks it covers
    with how many of the graded failed each (for any reason); most students first."""
    failing: dict[str, int] = collections.Counter()
    groups: dict[str, dict[str, Any]] = {}
    for n, doc in enumerate(graded):
        for test in doc["tests"]:
            if test["status"] == "passed":
                continue
            failing[test["name"]] += 1
            if test.get("todo"):
                continue
            kind, key, shown = message_group(test.get("output", ""))
            group = groups.setdefault(key, {"diagnosis": shown, "kind": kind, "students": set(), "checks": {}})
            group["students"].add(n)
            group["checks"][test["name"]] = group["checks"].get(test["name"], 0) + 1
    result = [
        {
            "diagnosis": g["diagnosis"],
            "kind": g["kind"],
            "students": len(g["students"]),
            "checks": [{"check": name, "with_it": k, "failed": failing[name]} for name, k in g["checks"].items()],
        }
        for g in groups.values()
    ]
    return sorted(result, key=lambda g: -g["students"])  # stable: the first seen wins a tie


def _not_implemented(graded: list[dict]) -> list[dict]:
    """Per task (a check name's part before its colon, `ch25.1 slot_mapping`), how many graded
    students left it as the stub gave it (a check of it met the stub's NotImplementedError)."""
    students: dict[str, int] = collections.Counter()
    for doc in graded:
        for task in dict.fromkeys(t["name"].split(":", 1)[0] for t in doc["tests"] if t.get("todo")):
            students[task] += 1
    return [{"task": task, "students": n} for task, n in students.items()]


def message_group(output: str) -> tuple[str, str, str]:
    """Which group a failing check's message falls in: ("hint" or "first line", the key that groups
    it, the line to show). The key is the hint line, else the first line, with numbers left out;
    a leading `inputs: ...` line (the checks' way of stating the case, the same for every student)
    does not count as the first, and neither does what the student's code printed."""
    printed = tr("(your code printed: {printed})", printed="\0").split("\0")[0]
    text = output.split("\n(your code printed")[0].split("\n" + printed)[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    hint = next((line for line in lines if is_hint_line(line) or line.casefold().startswith("hint:")), None)
    inputs = ("inputs:", tr("inputs:"))  # a check's statement of its case, in English or the run's language
    first = next((line for line in lines if not line.startswith(inputs)), lines[0] if lines else tr("(no message)"))
    kind, line = ("hint", hint) if hint else ("first line", first)
    return kind, f"{kind}: {_NUMBER.sub('#', line)}", line


def clip(text: str, limit: int) -> str:
    """`text` at most `limit` characters, cut at the last word boundary (never inside a word
    unless it is one word longer than the limit), an ellipsis marking the cut."""
    if len(text) <= limit:
        return text
    room = limit - 1
    cuts = [i for i in range(1, room + 1) if not (text[i - 1].isalnum() and text[i].isalnum())]
    at = max((i for i in cuts if i > room // 3), default=room)
    return text[:at].rstrip(" ,;:(") + "…"


def _bands(mine: list, max_score: float) -> list[dict]:
    bands = [
        {"from": 100 * b // BANDS, "to": 100 * (b + 1) // BANDS, "graded": 0, "not_implemented": 0, "not_graded": 0} for b in range(BANDS)
    ]
    for _, doc in mine:
        share = float(doc["score"]) / max_score if max_score else 0.0
        band = bands[min(BANDS - 1, max(0, math.floor(share * BANDS + 1e-9)))]
        key = {"error": "not_graded", "not implemented": "not_implemented"}.get(doc["status"], "graded")
        band[key] += 1
    return bands


# -- summary.md -------------------------------------------------------------------------------------------------
def summary_markdown(summary: dict, *, histogram: str | None = HISTOGRAM) -> str:
    """summary.md: per chapter, the counts, mean and median over all students, who was not
    graded and why, and the checks students fail with their most common wrong answer (in the run's language)."""
    lines = [
        "# " + tr("Class summary"),
        "",
        tr("A student who could not be graded scores 0, and means and medians are over all of a chapter's students, as in grades.csv."),
        "",
    ]
    if histogram:
        lines += ["![" + tr("Scores of each chapter, in bands of a tenth of its points") + f"]({histogram})", ""]
    for cid, s in summary.items():
        n, max_score = s["students"], s["max_score"]
        counts = " + ".join(_status_count(k, v) for k, v in sorted(s["statuses"].items(), key=lambda kv: _status_rank(kv[0])))
        lines += [f"## {cid} · {s['title']}", "", _count_line(n, counts), ""]
        if s.get("skipped"):
            names = ", ".join(_code(r["student"] + "/") for r in s["skipped"])
            lines += [tr("Not students, skipped: {names} (a name starting with a dot).", names=names), ""]
        fields = {
            "mean": s["mean_score"],
            "max_score": max_score,
            "n": n,
            "median": s["median_score"],
            "errors": s["errors"],
            "mean_graded": s["mean_score_graded"],
            "graded": s["graded"],
        }
        if s["errors"]:
            mean = tr(
                "Mean **{mean:g}** / {max_score:g} over all {n} students (the {errors} not graded count as 0), "
                "median **{median:g}**; mean {mean_graded:g} over the {graded} graded.",
                **fields,
            )
        else:
            mean = tr("Mean **{mean:g}** / {max_score:g} over all {n} students, median **{median:g}**.", **fields)
        lines += [mean, ""]
        if s["not_graded"]:
            lines += ["### " + tr("Not graded ({n}, 0 points each)", n=len(s["not_graded"])), ""]
            lines += [f"- {_code(r['student'])}: {escape.markdown(clip(r['reason'], REASON_CHARS))}" for r in s["not_graded"]]
            lines.append("")
        if s["renamed"]:
            lines += ["### " + tr("Graded under another name (ask them to rename the file)"), ""]
            lines += [
                f"- {_code(r['student'])}: " + tr("{answer} graded as the chapter's module", answer=_code(r["answer"]))
                for r in s["renamed"]
            ]
            lines.append("")
        wrong = [c for c in s["checks"] if c["wrong"]]
        only_todo = [c for c in s["checks"] if c["failed"] and not c["wrong"]]
        diagnoses = s.get("diagnoses", [])
        if diagnoses:
            g = s["graded"]
            heading = (
                tr("Wrong answers, one row per diagnosis ({g} graded student)", g=g)
                if g == 1
                else tr("Wrong answers, one row per diagnosis ({g} graded students)", g=g)
            )
            lines += [
                "### " + heading,
                "",
                tr(
                    "A diagnosis is a wrong answer's hint line, or else its first line with its numbers left out. Each check "
                    "it covers is followed by how many of the {g} graded students failed that check, for any reason.",
                    g=g,
                ),
                "",
                "| " + tr("diagnosis") + " | " + tr("students") + " | " + tr("checks it covers (failing)") + " |",
                "|---|---:|---|",
            ]
            for d in diagnoses[:DIAGNOSES]:
                lines.append(f"| {_code(clip(d['diagnosis'], MESSAGE_CHARS), table=True)} | {d['students']} | {_covers(d['checks'])} |")
            if len(diagnoses) > DIAGNOSES:
                more = tr("({n} more, each of fewer students: summary.json)", n=len(diagnoses) - DIAGNOSES)
                lines.append(f"| {more} | | |")
            lines.append("")
        if s["not_implemented"]:
            tasks = tr_in("list", ", ").join(_task_students(t["task"], t["students"]) for t in s["not_implemented"])
            lines.append(
                tr(
                    "Not implemented (the stub's NotImplementedError): {tasks}; {n} checks failed for no other reason.",
                    tasks=tasks,
                    n=len(only_todo),
                )
                if only_todo
                else tr("Not implemented (the stub's NotImplementedError): {tasks}.", tasks=tasks)
            )
            lines.append("")
        passed = len(s["checks"]) - len(wrong) - len(only_todo)
        if s["graded"] and passed:
            lines += [
                tr("All {n} checks passed for every graded student.", n=passed)
                if passed == len(s["checks"])
                else tr("The other {n} checks passed for every graded student.", n=passed),
                "",
            ]
    return "\n".join(lines)


def _status_count(status: str, n: int) -> str:
    """One term of the count line: `4 failed`."""
    return tr(STATUS_COUNTS[status], n=n) if status in STATUS_COUNTS else f"{n} {status}"


def _count_line(n: int, counts: str) -> str:
    """`8 students = 1 passed + 4 failed + 1 not implemented + 2 not graded.`"""
    if not counts:
        return tr("{n} student.", n=n) if n == 1 else tr("{n} students.", n=n)
    return tr("{n} student = {counts}.", n=n, counts=counts) if n == 1 else tr("{n} students = {counts}.", n=n, counts=counts)


def _task_students(task: str, n: int) -> str:
    """`ch25.1 slot_mapping by 3 students`, in the line of tasks left as the stub gave them."""
    fields = {"task": _cell(task), "n": n}
    return tr("{task} by {n} student", **fields) if n == 1 else tr("{task} by {n} students", **fields)


def _covers(checks: list[dict]) -> str:
    """The checks a diagnosis covers, by task: `ch25.3 BlockManager: figure instance… (3), nano-vllm's
    example… (3) and 8 more`; the number is how many graded students failed the check."""
    tasks: dict[str, list[tuple[str, int]]] = {}
    for c in checks:
        task, sep, name = c["check"].partition(":")
        task, name = (task, name.strip()) if sep else ("", task)
        tasks.setdefault(task, []).append((name, c["failed"]))
    parts = []
    for task, mine in tasks.items():
        named = tr_in("list", ", ").join(f"{_cell(clip(name, CHECK_CHARS))} ({failed})" for name, failed in mine[:NAMED_CHECKS])
        if len(mine) > NAMED_CHECKS:
            named = tr("{checks} and {n} more", checks=named, n=len(mine) - NAMED_CHECKS)
        parts.append((f"{_cell(task)}: " if task else "") + named)
    return tr_in("list", "; ").join(parts)


def _status_rank(status: str) -> tuple[int, str]:
    known = ["passed", "incomplete", "failed", "not implemented", "blocked", "not graded"]
    return (known.index(status) if status in known else len(known), status)


def _code(text: str, *, table: bool = False) -> str:
    """Text a submission chose (a student's name, a file name, a message quoting their values) as a
    Markdown code span: shown as it is, nothing in it read as markup (`grader.delivery.escape.markdown_code`)."""
    return escape.markdown_code(text, table=table)


def _cell(text: str) -> str:
    """The course's own text (a check's name) in a table cell: one line, no bare pipe."""
    return re.sub(r"[\r\n\t]+", " ", text).replace("|", "\\|")


# -- the histogram -------------------------------------------------------------------------------------------
def histogram_svg(summary: dict) -> str:
    """summary-histogram.svg: one panel per chapter, students per band of a tenth of its points,
    stacked by graded / not implemented / not graded, with the mean (dashed) and median (solid)."""
    from figures.kit import Figure

    caption = tr(
        "Students in each band of a tenth of the chapter's points (full marks in the last band); a "
        "student who could not be graded counts as 0. Dashed line: the mean; solid line: the median."
    )
    zh = language() == "zh"  # one caption, in the run's language
    fig = Figure("summary-histogram", title=tr("Class scores"), zh=caption if zh else "", en="" if zh else caption)
    for cid, s in summary.items():
        _panel(fig, cid, s)
    return fig.svg()


def _panel(fig, cid: str, s: dict) -> None:
    from figures.kit import text_width
    from figures.style import LABEL, MARGIN, MUTED, RULE, SMALL, fill, stroke

    title = s["title"].split(" · ", 1)[-1]  # one language: the English half of "中文 · English", else the Chinese
    chapter = f"{cid} · {title}"
    fig.heading(tr("{chapter}: {n} students, {points:g} points", chapter=chapter, n=s["students"], points=s["max_score"]))
    bar_w, gap, height = 64, 12, 150
    x0 = MARGIN + 12
    top_y = fig.y + 52
    base = top_y + height
    width = BANDS * (bar_w + gap) - gap
    marks = []  # (x, name, value, dash); drawn first, so that the bars cover them
    for name, value, dash in (("mean", s["mean_score"], "4,3"), ("median", s["median_score"], None)):
        share = value / s["max_score"] if s["max_score"] else 0.0
        marks.append((x0 + min(max(share * BANDS * (bar_w + gap) - gap / 2, 0), width), name, value, dash))
    marks.sort()
    said = {"mean": mark("mean {value:g}"), "median": mark("median {value:g}")}
    labels = [tr(said[name], value=value) for _, name, value, _ in marks]
    wide = [text_width(label, LABEL - 1) for label in labels]
    (xl, *_), (xr, *_) = marks
    if xr - xl >= (wide[0] + wide[1]) / 2 + 8:  # apart: each label centred over its line
        placed = [(xl, "middle"), (xr, "middle")]
    elif xl - 4 - wide[0] < 2:  # close, at the left edge: both to the right of the lines
        placed = [(xl + 4, "start"), (max(xr + 4, xl + wide[0] + 14), "start")]
    elif xr + 4 + wide[1] > fig.width - 2:  # close, at the right edge: both to the left
        placed = [(min(xl - 4, xr - wide[1] - 14), "end"), (xr - 4, "end")]
    else:  # close: one on either side
        placed = [(xl - 4, "end"), (xr + 4, "start")]
    for (x, name, _, dash), label, (at, anchor) in zip(marks, labels, placed):
        line = fig.dwg.line((x, top_y - 18), (x, base), stroke=stroke("accent"), stroke_width=1.6, class_=f"mark {name}")
        if dash:
            line["stroke-dasharray"] = dash
        fig.dwg.add(line)
        fig.text(at, top_y - 22, label, size=LABEL - 1, anchor=anchor, color=stroke("accent"), cls=f"mark-label {name}")
    tallest = max([sum(b[k] for k, _, _ in KINDS) for b in s["histogram"]] + [1])
    for i, band in enumerate(s["histogram"]):
        x, y = x0 + i * (bar_w + gap), base
        for key, role, _ in KINDS:
            n = band[key]
            if not n:
                continue
            h = height * n / tallest
            fig.dwg.add(
                fig.dwg.rect(
                    (x, y - h), (bar_w, h), fill=fill(role), stroke=stroke(role), stroke_width=1, class_=f"bar {key.replace('_', '-')}"
                )
            )
            if h >= 18 and any(band[k] for k, _, _ in KINDS if k != key):
                fig.text(x + bar_w / 2, y - h / 2 + 4, str(n), size=SMALL, anchor="middle", color=MUTED, cls="segment-count")
            y -= h
        total = sum(band[k] for k, _, _ in KINDS)
        if total:
            fig.text(x + bar_w / 2, y - 6, str(total), size=LABEL, anchor="middle", weight="bold", cls="count")
        fig.text(x + bar_w / 2, base + 17, f"{band['from']}–{band['to']}%", size=LABEL - 1, anchor="middle", color=MUTED, cls="label")
    fig.dwg.add(fig.dwg.line((x0 - 4, base), (x0 + width + 4, base), stroke=RULE, stroke_width=1))
    fig.text(
        x0 + width / 2,
        base + 37,
        tr("score, as a share of the {points:g} points", points=s["max_score"]),
        size=LABEL - 1,
        anchor="middle",
        color=MUTED,
        cls="label",
    )
    fig.y = base + 62
    fig.legend([(role, tr(label)) for _, role, label in KINDS])
    fig.y += 26
