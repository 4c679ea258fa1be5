"""The fonts a figure embeds, read back from its SVG, for the tests: which characters of its text
no embedded font can draw (test_chapters asks it of every figure drawn from the reference)."""

from __future__ import annotations

import base64
import hashlib
import io
import re
import xml.etree.ElementTree as ET

from fontTools.ttLib import TTFont

SVG = "{http://www.w3.org/2000/svg}"
FACE = re.compile(
    r'@font-face\{font-family:"([^"]+)";src:url\(data:font/woff2;base64,([A-Za-z0-9+/=]+)\) '
    r'format\("woff2"\);font-weight:(\d+);font-style:normal\}'
)
REBUILD = "add it to the shipped fonts: .venv/bin/python figures/fonts/build.py (its docstring says how)"


def embedded(root: ET.Element) -> dict[str, dict[int, TTFont]]:
    """The fonts a figure's <style> embeds: family -> weight -> font."""
    css = "".join(el.text or "" for el in root.iter(f"{SVG}style"))
    faces: dict[str, dict[int, TTFont]] = {}
    data: dict[str, list[bytes]] = {}
    for family, b64, weight in FACE.findall(css):
        raw = base64.b64decode(b64)
        assert raw[:4] == b"wOF2", family
        faces.setdefault(family, {})[int(weight)] = TTFont(io.BytesIO(raw))
        data.setdefault(family, []).append(raw)
    assert css.count("@font-face") == sum(map(len, faces.values())), "an @font-face rule the test cannot read"
    for family, parts in data.items():
        # Named by content: two inline SVGs in one page that name the same family embed the same fonts.
        assert family.rsplit("-", 1)[1] == hashlib.sha256(b"".join(parts)).hexdigest()[:10], family
    return faces


def weight_of(faces: dict[int, TTFont], bold: bool) -> int:
    """The face a browser draws with: the family's face of the text's weight, else the one it has."""
    want = 700 if bold else 400
    return want if want in faces else next(iter(faces))


def undrawable(svg: str) -> list[str]:
    """The characters of the figure's text elements that no embedded font it names can draw."""
    root = ET.fromstring(svg)
    faces = embedded(root)
    cmaps = {(fam, w): set(map(chr, font.getBestCmap())) for fam, ws in faces.items() for w, font in ws.items()}
    problems = []
    for el in root.iter(f"{SVG}text"):
        families = [f.strip().strip('"') for f in el.get("font-family", "").split(",")]
        if not families or families[0] not in faces:
            problems.append(f"{el.get('class')} {''.join(el.itertext())!r} does not name an embedded font first")
            continue
        bold = el.get("font-weight") == "bold"
        for ch in set("".join(el.itertext())):
            if not any(ch in cmaps[(f, weight_of(faces[f], bold))] for f in families if f in faces):
                problems.append(f"{ch} U+{ord(ch):04X} in {el.get('class')} {''.join(el.itertext())[:50]!r}")
    return problems
