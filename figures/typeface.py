"""The fonts every figure embeds, so that it looks the same wherever it is opened.

figures/fonts/ ships subsets of five Noto fonts (SIL OFL 1.1; see figures/fonts/OFL.txt and
figures/fonts/build.py, which regenerates them): Noto Sans CJK SC for Chinese and Latin text,
Noto Sans Mono for monospaced text, and for what the CJK font lacks or draws in a CJK style,
Noto Sans (· – … ᵀ), Noto Sans Math (≤ √ − →) and Noto Sans Symbols 2 (✓ ✗). A figure embeds,
in its <style>, a subset of each font holding just the characters it draws (WOFF2, as a data:
URI), and every text element names those families first. The CJK font is the large one: about
80 kB per weight shipped, 10-25 kB in a figure.

An embedded family is named after its content ("cf-sans-3f2a…", a hash of its faces): the
course lab shows several figures inline in one HTML page, where every @font-face rule is global,
and two figures defining one family name with different subsets would take each other's glyphs
away. Equal names here mean equal fonts.

`advance` gives a character's advance width from the same files, for `figures.kit.text_width`.

Decompressing a shipped font and cutting a subset are the slow part of drawing a figure (fontTools and
brotli): both are kept in a cache folder, content-addressed (`COURSE_CACHE_DIR`, else
`$XDG_CACHE_HOME/course` or `~/.cache/course`), so that a second `course check` draws its figures without
loading fontTools at all. A cache that cannot be written is only slower.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from grader.delivery.files import cache_folder

FONT_DIR = Path(__file__).resolve().parent / "fonts"

SANS = ("sans", "latin", "math", "symbols")
STACKS = {"sans": SANS, "mono": ("mono", *SANS)}
"""The shipped fonts a text element names, in order, by its kind (a browser falls back along them)."""
PREFER = {**dict.fromkeys("·–—…‘’“”′″×°±÷ℓ", "latin"), **dict.fromkeys("≤≥≠≈√∞−∑∏∂∫⊙⊗→←↑↓↔⇒", "math"), **dict.fromkeys("✓✗", "symbols")}
"""Characters the CJK font has but draws full-width or in a CJK style (a wide ·, a slanted ≤, a
radical without its bar), taken from the Latin, math or symbols font instead (one design for ✓ and ✗)."""


def order(ch: str, kind: str) -> list[str]:
    """The fonts that may draw `ch` in text of this kind, best first: the monospaced one for
    monospaced text, then the preferred one, then the sans stack's order."""
    first = ["mono"] if kind == "mono" else []
    preferred = [PREFER[ch]] if ch in PREFER else []
    return first + preferred + [r for r in SANS if r not in preferred]


AVAILABLE = all((FONT_DIR / f"{role}-regular.woff2").is_file() for role in STACKS["mono"]) and all(
    importlib.util.find_spec(m) is not None
    for m in ("fontTools", "brotli")  # brotli: fontTools' WOFF2
)
"""Whether figures embed fonts (both packages are dependencies; without them figures embed none)."""
CACHE_VERSION = b"course-typeface-1"
"""Part of every cache key: change it when what is cached changes shape."""


def cache_dir() -> Path:
    """Where decompressed fonts and subsets are kept between runs."""
    return cache_folder("fonts")


def _cached(key: str, suffix: str, make) -> bytes:
    """The bytes cached under `key`, else `make()`'s, written atomically for the next run (never an error)."""
    path = cache_dir() / f"{key}{suffix}"
    try:
        return path.read_bytes()
    except OSError:
        pass
    data = make()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{os.getpid()}")
        temp.write_bytes(data)
        os.replace(temp, path)
    except OSError:
        pass
    return data


DROP = ["vhea", "vmtx", "VORG", "FFTM", "DSIG", "meta", "BASE", "GDEF", "GPOS", "GSUB"]
"""Tables a figure has no use for: vertical metrics (figures set text horizontally), layout
features (no kerning: a string is as wide as its advances add up to)."""


@dataclass(frozen=True, eq=False)
class Face:
    name: str  # "sans-bold"
    role: str  # "sans"
    weight: int  # 400, 700
    sfnt: bytes  # the shipped subset, decompressed
    advances: dict  # character -> advance width in em


def face(role: str, bold: bool) -> Face | None:
    """A shipped font: the bold one if there is one (the math and symbols fonts have none: the
    browser emboldens their regular one)."""
    if not AVAILABLE:
        return None
    return (_load(f"{role}-bold", 700) if bold else None) or _load(f"{role}-regular", 400)


@lru_cache(maxsize=None)
def _load(name: str, weight: int) -> Face | None:
    path = FONT_DIR / f"{name}.woff2"
    if not path.is_file():
        return None
    shipped = path.read_bytes()
    key = hashlib.sha256(CACHE_VERSION + shipped).hexdigest()
    fonts: dict = {}

    def font():  # the shipped WOFF2, decompressed once, and only on a cache miss
        if not fonts:
            from fontTools.ttLib import TTFont

            fonts["font"] = TTFont(io.BytesIO(shipped), recalcBBoxes=False, recalcTimestamp=False)
        return fonts["font"]

    def advances() -> bytes:
        upm, hmtx = font()["head"].unitsPerEm, font()["hmtx"].metrics
        return json.dumps({chr(u): hmtx[g][0] / upm for u, g in font().getBestCmap().items()}).encode()

    def sfnt() -> bytes:
        font().flavor = None
        raw = io.BytesIO()
        font().save(raw)
        return raw.getvalue()

    widths = json.loads(_cached(key, ".advances.json", advances))
    return Face(name, name.partition("-")[0], weight, _cached(key, ".ttf", sfnt), widths)


@lru_cache(maxsize=4096)
def pick(ch: str, kind: str, bold: bool) -> Face | None:
    """The shipped font that draws `ch` in text of this kind ("sans" or "mono") and weight."""
    for role in order(ch, kind):
        f = face(role, bold)
        if f is not None and ch in f.advances:
            return f
    return None


def advance(ch: str, *, mono: bool = False, bold: bool = False) -> float | None:
    """The advance width of `ch` in em as the figures draw it, or None when no shipped font has it."""
    f = pick(ch, "mono" if mono else "sans", bold)
    return None if f is None else f.advances[ch]


def kind_of(family: str) -> str:
    return "mono" if "monospace" in family else "sans"


def embed(texts: Iterable[tuple[str, str, bool]]) -> tuple[str, dict[str, str]]:
    """The @font-face rules for texts given as (text, kind, bold), and the family-name prefix
    (to put before its own families) for each kind. Both empty when the fonts are unavailable."""
    if not AVAILABLE:
        return "", {}
    used: dict[Face, set[str]] = {}
    for text, kind, bold in texts:
        for ch in set(text):
            f = pick(ch, kind, bold)
            if f is not None:
                used.setdefault(f, {" "}).add(ch)
    by_role: dict[str, list[tuple[Face, bytes]]] = {}
    for f in sorted(used, key=lambda f: f.name):
        by_role.setdefault(f.role, []).append((f, _subset_of(f, frozenset(used[f]))))
    names, rules = {}, []
    for role, faces in by_role.items():
        digest = hashlib.sha256(b"".join(data for _, data in faces)).hexdigest()[:10]
        names[role] = family = f"cf-{role}-{digest}"
        for f, data in faces:
            uri = f"data:font/woff2;base64,{base64.b64encode(data).decode('ascii')}"
            rules.append(f'@font-face{{font-family:"{family}";src:url({uri}) format("woff2");font-weight:{f.weight};font-style:normal}}')
    prefix = {kind: ", ".join(names[r] for r in roles if r in names) for kind, roles in STACKS.items()}
    return "\n".join(rules), prefix


@lru_cache(maxsize=512)
def _subset_of(f: Face, chars: frozenset[str]) -> bytes:
    """The shipped font cut down to `chars`, as WOFF2 (cached here and on disk: the lab redraws a figure
    often, and a chapter's figures draw the same characters run after run)."""
    key = hashlib.sha256(CACHE_VERSION + hashlib.sha256(f.sfnt).digest() + "".join(sorted(chars)).encode()).hexdigest()
    return _cached(key, ".woff2", lambda: _cut(f, chars))


def _cut(f: Face, chars: frozenset[str]) -> bytes:
    from fontTools import subset as _subset
    from fontTools.ttLib import TTFont

    font = TTFont(io.BytesIO(f.sfnt), recalcBBoxes=False, recalcTimestamp=False)
    options = _subset.Options()
    options.layout_features = []
    options.hinting = True  # nothing to remove: the shipped files have no hints, nor subroutines (build.py),
    options.desubroutinize = False  # and leaving them be spares decompiling every glyph program
    options.name_IDs = [0, 1, 2, 3, 4, 5, 6, 13]  # the copyright and the license stay in the font
    options.notdef_outline = True
    options.recalc_bounds = False
    options.drop_tables += DROP
    subsetter = _subset.Subsetter(options)
    subsetter.populate(unicodes=[ord(c) for c in chars])
    subsetter.subset(font)
    font.flavor = "woff2"
    out = io.BytesIO()
    font.save(out)
    return out.getvalue()
