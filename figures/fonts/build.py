"""Regenerate the fonts shipped in figures/fonts/ from the system's Noto fonts (all SIL OFL 1.1).

    apt-get install -y fonts-noto-cjk fonts-noto-mono fonts-noto-core
    .venv/bin/python figures/fonts/build.py

or, without installing them system-wide (the machine keeps its own fonts):

    apt-get download fonts-noto-cjk fonts-noto-mono fonts-noto-core
    for d in fonts-noto-*.deb; do dpkg-deb -x "$d" /tmp/noto; done
    .venv/bin/python figures/fonts/build.py --root /tmp/noto

Each shipped file is a subset holding the characters the course's figures, the lab's page and the
figure book can draw: every character of a string literal in figures/*.py, grader/lab/*.py and
grader/delivery/book.py and of the lab's static files, of the translations of texts written there and in
engine/ (`drawn_translations`: the catalogs, grader/locale/), the chapters' titles, printable ASCII and
`EXTRA` (what the figure code builds at run time: minus signs, infinities, subscripts, arrows).
`figures.typeface` subsets these files again per figure, to what that figure uses, and embeds
the result in the SVG.

The subsets are renamed ("Course Sans" ...): the OFL reserves the name "Source" of the CJK
fonts' upstream for modified versions. OFL.txt beside this file (the fonts' copyright lines and
the license) is kept by hand: update it when a source font changes. Hinting and OpenType layout features are dropped (no
kerning), so a string's width is the sum of its advance widths, which `figures.kit.text_width`
reads from these same files.
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

# (shipped name, source file under the root, face name inside a collection, family name given)
SOURCES = {
    "sans-regular": ("usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc", "Noto Sans CJK SC", "Course Sans"),
    "sans-bold": ("usr/share/fonts/opentype/noto/NotoSansCJK-Bold.ttc", "Noto Sans CJK SC", "Course Sans"),
    "mono-regular": ("usr/share/fonts/truetype/noto/NotoSansMono-Regular.ttf", None, "Course Mono"),
    "mono-bold": ("usr/share/fonts/truetype/noto/NotoSansMono-Bold.ttf", None, "Course Mono"),
    "latin-regular": ("usr/share/fonts/truetype/noto/NotoSans-Regular.ttf", None, "Course Latin"),
    "latin-bold": ("usr/share/fonts/truetype/noto/NotoSans-Bold.ttf", None, "Course Latin"),
    "math-regular": ("usr/share/fonts/truetype/noto/NotoSansMath-Regular.ttf", None, "Course Math"),
    "symbols-regular": ("usr/share/fonts/truetype/noto/NotoSansSymbols2-Regular.ttf", None, "Course Symbols"),
}
DEBIAN = {
    "sans": "fonts-noto-cjk",
    "mono": "fonts-noto-mono",
    "latin": "fonts-noto-core",
    "math": "fonts-noto-core",
    "symbols": "fonts-noto-core",
}

EXTRA = (
    "−∞…·×÷±≈≠≤≥√∑∏∂∫⊙⊗→←↑↓↔⇒✓✗✔✘①②③④⑤⑥⑦⑧⑨⑩°′″§¶•–—‘’“”«»"
    "αβγδεζηθικλμνξπρστυφχψωΔΘΛΞΠΣΦΨΩ"
    "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁽⁾ⁿⁱ₀₁₂₃₄₅₆₇₈₉₊₋₍₎ₐₑₒₓₕₖₗₘₙₚₛₜᵢⱼᵀᵗ"
    "■□▲△▼▽◆◇●○★☆ℓ"
    "\u00a0\u3000，。、；：？！（）【】《》「」“”‘’…—"
)


def course_characters(extra: bool = True) -> set[str]:
    """Every character the figures, the lab's page and the figure book can draw: the string literals (not
    docstrings) of figures/*.py, grader/lab/*.py and grader/delivery/book.py, the text of the lab's static
    files, the chapters' titles,
    printable ASCII, and `EXTRA` unless `extra` is false."""
    chars = {chr(c) for c in range(0x20, 0x7F)} | (set(EXTRA) if extra else set())
    for path in (
        sorted((ROOT / "figures").glob("*.py"))
        + sorted((ROOT / "grader" / "lab").glob("*.py"))
        + [ROOT / "grader" / "delivery" / "book.py"]
    ):
        chars |= _literals(path)
    for path in sorted((ROOT / "grader" / "lab" / "static").iterdir()):
        chars |= set(path.read_text(encoding="utf-8"))
    sys.path.insert(0, str(ROOT))
    from grader import chapters

    for ch in chapters.all_chapters():
        chars |= set(ch.title)  # the overview draws the chapters' titles
    chars |= drawn_translations()
    return {c for c in chars if c.isprintable() or c in "\u00a0\u3000"}


DRAWN_FROM = ("figures/", "grader/lab/", "grader/delivery/book.py", "grader/delivery/summary.py", "engine/")
"""Where the texts a figure or a page draws are written: their translations need glyphs too (engine/: the overview
draws the details the engine's trace records and the model's description; its catalog is small, its errors included)."""


def drawn_translations() -> set[str]:
    """The characters of every translation (grader/locale/*/LC_MESSAGES/*.po) of a text written in `DRAWN_FROM`."""
    from babel.messages.pofile import read_po

    chars: set[str] = set()
    for path in sorted((ROOT / "grader" / "locale").glob("*/LC_MESSAGES/*.po")):
        with path.open("rb") as f:
            for m in read_po(f):
                if isinstance(m.string, str) and any(p.startswith(DRAWN_FROM) for p, _ in m.locations):
                    chars |= set(m.string)
    return chars


def _literals(path: Path) -> set[str]:
    """The characters of a module's string literals, its docstrings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return {
        c
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
        for c in node.value
    }


def _open(path: Path, face: str | None):
    from fontTools.ttLib import TTCollection, TTFont

    if face is None:
        return TTFont(path, recalcTimestamp=False)  # the same sources give the same bytes
    for font in TTCollection(path, recalcTimestamp=False).fonts:
        if font["name"].getDebugName(1) == face:
            return font
    raise SystemExit(f"{path} has no face {face!r}")


def _shipped(name: str, font, chars: set[str], family: str) -> bytes:
    from fontTools import subset

    from figures.typeface import DROP

    options = subset.Options()
    options.layout_features = []  # no kerning or ligatures: widths are the sum of advances
    options.hinting = False
    options.desubroutinize = True  # compresses better in WOFF2
    options.name_IDs = [0, 1, 2, 3, 4, 5, 6, 13, 14]
    options.notdef_outline = True
    options.drop_tables += DROP
    cmap = font.getBestCmap()
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=sorted(ord(c) for c in chars if ord(c) in cmap))
    subsetter.subset(font)
    _rename(font, family, "Bold" if name.endswith("bold") else "Regular")
    out = io.BytesIO()
    font.flavor = "woff2"
    font.save(out)
    return out.getvalue()


def _rename(font, family: str, style: str) -> None:
    table = font["name"]
    ps = f"{family.replace(' ', '')}-{style}"
    for rec in list(table.names):
        if rec.nameID in (1, 2, 3, 4, 6, 16, 17):
            table.removeNames(nameID=rec.nameID)
    for nid, value in ((1, family), (2, style), (3, f"{ps};course"), (4, f"{family} {style}"), (6, ps)):
        table.setName(value, nid, 3, 1, 0x409)
        table.setName(value, nid, 1, 0, 0)
    if "CFF " in font:
        cff = font["CFF "].cff
        cff.fontNames = [ps]
        top = cff.topDictIndex[0]
        for key, value in (("FullName", f"{family} {style}"), ("FamilyName", family)):
            if hasattr(top, key):
                setattr(top, key, value)


def _claims(chars: set[str], fonts: dict) -> dict[str, set[str]]:
    """Which characters each shipped file holds: those it is the first to draw, in sans or in
    monospaced text, regular or bold, by `figures.typeface.order` (the order the figures name them)."""
    from figures.typeface import order

    cmaps = {name: set(map(chr, font.getBestCmap())) for name, font in fonts.items()}
    out = {name: {" "} for name in fonts}
    for c in chars:
        for kind in ("sans", "mono"):
            for weight in ("regular", "bold"):
                for role in order(c, kind):
                    name = f"{role}-{weight}" if f"{role}-{weight}" in fonts else f"{role}-regular"
                    if c in cmaps[name]:
                        out[name].add(c)
                        break
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path("/"), help="where the Debian packages' files are (default /)")
    parser.add_argument("--out", type=Path, default=HERE, help="where the subsets go (default: this folder)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    fonts = {}
    for name, (rel, face, _) in SOURCES.items():
        path = args.root / rel
        if not path.is_file():
            raise SystemExit(f"{path} is missing: apt-get install {DEBIAN[name.split('-')[0]]} (or extract it and pass --root)")
        fonts[name] = _open(path, face)
    chars = course_characters()
    claims = _claims(chars, fonts)
    lacking = sorted(c for c in chars if c.strip() and not any(c in claims[k] for k in claims))
    for name, (rel, face, family) in SOURCES.items():
        data = _shipped(name, fonts[name], claims[name], family)
        (args.out / f"{name}.woff2").write_bytes(data)
        print(f"{name}.woff2: {len(claims[name])} characters, {len(data) / 1024:.1f} KiB")
    ofl = (HERE / "OFL.txt").read_text(encoding="utf-8") if (HERE / "OFL.txt").is_file() else ""
    if args.out != HERE and ofl:
        (args.out / "OFL.txt").write_text(ofl, encoding="utf-8")
    if lacking:
        print("no shipped font has: " + " ".join(f"{c} U+{ord(c):04X}" for c in lacking))
    return 0


if __name__ == "__main__":
    sys.exit(main())
