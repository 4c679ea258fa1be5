"""What a graded student gets back: their results as a page, the figures drawn from their code inline.

Two forms of one content, both built from a results document (`course check --json`'s shape,
what `course grade` writes to results.json) and the SVG figures beside it:

- `page`: `OUT/<student>/<chapter>/feedback.html` of `course grade`, one self-contained HTML
  file as nbgrader's feedback is: the score, every public check with its message, the hidden
  checks by name and verdict only (their messages stay in results.json, for the instructor),
  and each figure as an `<img>` whose source is the SVG itself (a data URI: the figure keeps its
  own embedded fonts and ids, and nothing in it can reach the page);
- `gradescope_output`: the top-level `output` of the Gradescope bundle's results.json, with
  `"output_format": "html"`: the same summary, the figures inline as `<svg>` elements.
  Gradescope sanitizes HTML output, and sanitizers of the Rails kind refuse `data:image/svg+xml`
  sources but keep SVG's drawing elements, so the figure goes in as markup, without its
  `<style>` (the embedded fonts: a sanitizer would drop the element and could show its text);
  its text then draws with the reader's own fonts.

Every string that can come from a submission (the student's folder and file names, messages
quoting the student's values, text their code printed) is escaped for HTML here (`grader.delivery.escape.html`:
its control and bidi characters shown as escapes too); the figures
are SVG documents whose text svgwrite escaped when they were drawn, and they are read again
as XML (a file that does not parse is left out) before anything of them is embedded.
"""

from __future__ import annotations

import base64
import html
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping

from grader.delivery import escape
from grader.i18n import choose, tr

SVG_NS = "http://www.w3.org/2000/svg"
VERDICT = {"passed": "✓", "failed": "✗"}
STYLE = """
body { font-family: %(sans)s; max-width: 1000px; margin: 2em auto; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 1.8em; }
.meta { color: #666; margin: 0; } .score { font-size: 1.25em; font-weight: bold; margin: 0.6em 0; }
.error { border-left: 4px solid #c0392b; padding: 0.4em 0.8em; background: #fbeaea; white-space: pre-wrap; }
.check { margin: 0.5em 0; } .check summary { cursor: pointer; }
.check.failed summary, .hidden .failed { color: #b03a2e; } .points { color: #666; margin-left: 0.6em; }
pre { font-family: %(mono)s; white-space: pre-wrap; background: #f6f6f6; padding: 0.6em 0.8em; margin: 0.3em 0 0.8em;
      font-size: 0.9em; }
figure { margin: 1.2em 0; } figure img { max-width: 100%%; border: 1px solid #ddd; }
figcaption { color: #666; font-size: 0.9em; } ul.hidden { padding-left: 1.2em; }
"""


def _e(text: object, *, lines: bool = False) -> str:
    """Text for HTML content or a quoted attribute (`grader.delivery.escape.html`: markup and control characters
    escaped; line breaks kept when `lines`)."""
    return escape.html(text, lines=lines)


def _points(test: Mapping) -> str:
    return f"{float(test.get('score', 0)):g}/{float(test.get('max_score', 0)):g}"


def _parts(doc: Mapping) -> tuple[list[Mapping], list[Mapping]]:
    tests = [t for t in doc.get("tests", []) if isinstance(t, Mapping)]
    hidden = [t for t in tests if "hidden" in (t.get("tags") or [])]
    return [t for t in tests if t not in hidden], hidden


def checked_svg(text: str) -> str | None:
    """An SVG document as text, when it parses as one (an `<svg>` root); else None."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return None
    return text if root.tag == f"{{{SVG_NS}}}svg" else None


def page(doc: Mapping, figures: Mapping[str, str], *, student: str) -> str:
    """The feedback page of one student's one chapter: `doc` a results document, `figures` its figures
    ({figure id: SVG text}), `student` the name of the student's folder (shown, escaped)."""
    chapter, title = doc.get("chapter", ""), doc.get("title", "")
    public, hidden = _parts(doc)
    body = [f"<h1>{_e(chapter)} · {_e(title)}</h1>" if title else f"<h1>{_e(chapter)}</h1>"]
    meta = [_e(student)]
    if doc.get("answer"):
        graded = (
            tr("graded: {answer} (under another name than the chapter's own)", answer=_e(doc["answer"]))
            if doc.get("renamed")
            else tr("graded: {answer}", answer=_e(doc["answer"]))
        )
        meta.append(graded)
    if doc.get("seed") is not None:
        meta.append(tr("grading seed {seed}", seed=_e(doc["seed"])))
    body.append(f'<p class="meta">{" · ".join(meta)}</p>')
    score = tr("score {score:g}/{max_score:g}", score=float(doc.get("score", 0)), max_score=float(doc.get("max_score", 0)))
    body.append(f'<p class="score">{score}</p>')
    if doc.get("error"):
        error = tr("not graded: {error}", error=_e(doc["error"], lines=True))
        body.append(f'<p class="error">{error}</p>')
    if public and not doc.get("error"):
        body.append("<h2>" + _e(tr("Checks")) + "</h2>")
        for t in public:
            state = "passed" if t.get("status") == "passed" else "failed"
            mark = VERDICT[state]
            out = str(t.get("output") or "")
            summary = f'<summary>{mark} {_e(t.get("name", ""))}<span class="points">{_points(t)}</span></summary>'
            body.append(f'<details class="check {state}"{"" if state == "passed" else " open"}>{summary}')
            if out:
                body.append(f"<pre>{_e(out, lines=True)}</pre>")
            body.append("</details>")
    if hidden:
        count = len(hidden)  # outside tr(): Babel takes `hidden` for the check decorator's keyword
        body.append("<h2>" + _e(tr("Hidden checks ({n}): names and verdicts", n=count)) + "</h2>")
        items = [
            f'<li class="{"passed" if t.get("status") == "passed" else "failed"}">'
            f"{VERDICT['passed' if t.get('status') == 'passed' else 'failed']} {_e(t.get('name', ''))}"
            f'<span class="points">{_points(t)}</span></li>'
            for t in hidden
        ]
        body.append('<ul class="hidden">' + "".join(items) + "</ul>")
    shown = [(fid, svg) for fid, svg in figures.items() if checked_svg(svg) is not None]
    if shown:
        body.append("<h2>" + _e(tr("Figures drawn from your code")) + "</h2>")
        for fid, svg in shown:
            src = "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")
            body.append(f'<figure id="{_e(fid)}"><img alt="{_e(fid)}" src="{src}"><figcaption>{_e(fid)}</figcaption></figure>')
    return _document(f"{chapter} · {student}", "\n".join(body))


def _document(title: str, body: str) -> str:
    """The whole page; its own text draws with the course's shipped fonts, embedded as the figures embed
    theirs (subsets of the characters it holds), so that it reads the same without a CJK font installed."""
    from figures import typeface

    words = html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r'src="data:[^"]*"', "", body))) + title
    css, prefix = typeface.embed([(words, "sans", False), (words, "sans", True), (words, "mono", False)])
    fonts = {
        kind: ", ".join(filter(None, [prefix.get(kind, ""), fallback]))
        for kind, fallback in (("sans", "sans-serif"), ("mono", "monospace"))
    }
    lang = "zh-Hans" if choose.language() == "zh" else "en"
    return (
        f'<!doctype html>\n<html lang="{lang}"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>\n{css}\n{STYLE % fonts}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def inline_svg(svg: str) -> str | None:
    """A figure as markup to put in an HTML page another site sanitizes: re-serialised from the parsed
    document, without an XML declaration and without `<style>` (its embedded fonts)."""
    if checked_svg(svg) is None:
        return None
    ET.register_namespace("", SVG_NS)
    ET.register_namespace("xlink", "http://www.w3.org/1999/xlink")
    root = ET.fromstring(svg)
    for parent in list(root.iter()):
        for child in list(parent):
            if child.tag == f"{{{SVG_NS}}}style":
                parent.remove(child)
    return ET.tostring(root, encoding="unicode")


def gradescope_output(lines: Iterable[str], figures: Mapping[str, str]) -> str:
    """The top-level `output` of a Gradescope results.json in its "html" format: `lines` (plain text, escaped
    here) as paragraphs, then each figure inline."""
    out = [f"<p>{_e(line)}</p>" for line in lines if line]
    drawn = [(fid, inline_svg(svg)) for fid, svg in figures.items()]
    if any(markup for _, markup in drawn):
        out.append("<p><strong>" + _e(tr("Figures drawn from your code")) + "</strong></p>")
        out += [f"<div>{markup}</div>" for _, markup in drawn if markup]
    return "\n".join(out)
