"""The feedback a graded student gets back (grader.delivery.feedback): a page of their results with the
figures inline, and Gradescope's HTML output; whatever a submission wrote stays text."""

from __future__ import annotations

import base64
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import figures
from grader.delivery.feedback import gradescope_output, inline_svg, page

HOSTILE = '<script>alert(1)</script> & <img src=x onerror="alert(2)"> </pre></details>'


class Parsed(HTMLParser):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def figure() -> str:
    spec = next(s for s in figures.catalog("ch18") if s.id == "ch18-gqa-groups")
    return spec.render({"num_heads": 4, "num_kv_heads": 2, "mapping": [0, 0, 1, 1], "expected": [0, 0, 1, 1]})


def check(name: str, score: int, output: str, *, hidden: bool = False) -> dict:
    status = "passed" if score else "failed"
    return {"name": name, "score": score, "max_score": 1, "status": status, "output": output, "tags": ["ch18.1"] + ["hidden"] * hidden}


def document() -> dict:
    return {
        "chapter": "ch18",
        "title": "分组查询注意力 · GQA",
        "score": 1.0,
        "max_score": 3.0,
        "seed": 5,
        "answer": f"{HOSTILE}/ch18.py",
        "tests": [
            check("ch18.1 kv_head_for: figure instance", 1, ""),
            check("ch18.1 kv_head_for: MQA", 0, f"yours: {HOSTILE}"),
            check("ch18.1 kv_head_for: random shapes", 0, "the hidden instance: 96 heads", hidden=True),
        ],
    }


def unsafe(parsed: Parsed) -> list:
    """Tags or attributes that would run something or fetch something."""
    return [
        (tag, a)
        for tag, a in parsed.tags
        if tag in ("script", "iframe", "object", "link")
        or any(k.startswith("on") for k in a)
        or (tag == "img" and not a.get("src", "").startswith("data:image/svg+xml;base64,"))
    ]


def test_the_page_shows_messages_and_figures_and_keeps_what_a_submission_wrote_as_text():
    svg = figure()
    parsed = Parsed(page(document(), {"ch18-gqa-groups": svg, "broken": "<svg><unclosed"}, student=HOSTILE))
    text = "".join(parsed.text)
    assert not unsafe(parsed)
    assert text.count(HOSTILE) >= 3  # the student's name, the file graded, the message quoting their value
    assert "score 1/3" in text and "ch18.1 kv_head_for: MQA" in text
    assert "ch18.1 kv_head_for: random shapes" in text and "the hidden instance" not in text  # hidden: name and verdict only
    (img,) = [a for tag, a in parsed.tags if tag == "img"]  # the figure that parses, and only it
    assert base64.b64decode(img["src"].split(",", 1)[1]).decode() == svg


def test_gradescope_gets_the_figures_as_markup_without_their_fonts_and_the_lines_as_text():
    svg = figure()
    out = gradescope_output([f"graded {HOSTILE}", "sandbox: bubblewrap"], {"ch18-gqa-groups": svg, "broken": "not svg"})
    parsed = Parsed(out)
    assert not unsafe(parsed) and f"graded {HOSTILE}" in "".join(parsed.text)
    assert [tag for tag, _ in parsed.tags].count("svg") == 1 and "<style" not in out and "@font-face" not in out
    markup = inline_svg(svg)
    assert markup is not None and markup in out
    drawn = ET.fromstring(markup)
    assert {"".join(e.itertext()) for e in drawn.iter() if e.tag.endswith("text")} >= {"Q head 0", "K head 1"}
