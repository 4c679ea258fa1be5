"""The figures embed their fonts: every character a figure draws is in a font it carries, so it
looks the same on a machine without any CJK font (no tofu, no serif fallback)."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET

import pytest
from figure_fonts import REBUILD, SVG, embedded, undrawable, weight_of
from fontTools.ttLib import TTFont

import figures
from figures import typeface
from figures.kit import Figure, text_width
from figures.style import LABEL, MONO
from grader import chapters


def test_the_shipped_fonts_draw_every_character_the_figure_code_holds():
    build = importlib.import_module("figures.fonts.build")
    lacking = [
        f"{c} U+{ord(c):04X}"
        for c in sorted(build.course_characters(extra=False))
        for kind in ("sans", "mono")
        for bold in (False, True)
        if typeface.pick(c, kind, bold) is None
    ]
    assert not lacking, f"figures/*.py or a chapter's title uses characters the shipped fonts lack: {sorted(set(lacking))}; {REBUILD}"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_overview_draws_every_character_from_the_fonts_it_embeds(tmp_path, lang):
    """In Chinese too: the engine's trace details and the model's description are drawn in the run's language."""
    import engine
    from engine.core import Settings
    from engine.model import load
    from grader.i18n import set_language

    for name in ("ch15_token_to_logits.py", "ch25_paged_kv.py"):
        shutil.copy(chapters.SOLUTIONS / name, tmp_path)
    set_language(lang)
    try:
        model = load("tiny")
        run = engine.Engine(
            model, engine.student_parts(tmp_path), Settings(block_size=4, num_blocks=9, max_num_seqs=2, max_num_batched_tokens=8)
        )
        (spec,) = figures.catalog("overview")
        svg = spec.render(engine.overview_record(run.generate([[1, 2, 3, 4, 5], [1, 2, 9]], 4), model))
    finally:
        set_language("en")
    assert not undrawable(svg), undrawable(svg)
    assert (lang == "zh") == ("随机权重" in svg)


def drawn(fig: Figure) -> tuple[ET.Element, dict[str, dict[int, TTFont]]]:
    root = ET.fromstring(fig.svg())
    return root, embedded(root)


def test_text_width_is_the_width_the_embedded_fonts_draw():
    fig = Figure("fonts-test", title="字体 · fonts", zh="每个图都带着自己的字体:≤ √ − → ✓ ✗", en="Kᵀ · q·k / √d ≤ 1 — “x”")
    samples = [
        ("q0 · pos 3: k0–k3 ≤ √2 → Kᵀ ✓", False, "normal"),
        ("你的 mask · yours", False, "bold"),
        ("0.557 −∞ [8, 64] → ✗ 中", True, "normal"),
        ("−0.033", True, "bold"),
    ]
    for s, mono, weight in samples:
        fig.text(40, 300, s, size=LABEL, mono=mono, weight=weight, cls="sample")
    root, faces = drawn(fig)
    for el, (s, mono, weight) in zip([e for e in root.iter(f"{SVG}text") if e.get("class") == "sample"], samples):
        bold = weight == "bold"
        families = [f.strip().strip('"') for f in el.get("font-family").split(",") if f.strip() in faces]
        width = 0.0
        for ch in s:
            for fam in families:
                font = faces[fam][weight_of(faces[fam], bold)]
                glyph = font.getBestCmap().get(ord(ch))
                if glyph is not None:
                    width += font["hmtx"][glyph][0] / font["head"].unitsPerEm * LABEL
                    break
            else:
                pytest.fail(f"{ch!r} is in no embedded font")
        assert text_width(s, LABEL, mono=mono, bold=bold) == pytest.approx(width), s
    for ws in faces.values():
        for font in ws.values():
            assert not {"GPOS", "GSUB", "kern"} & set(font.keys()), "no kerning: widths add up"


def test_monospaced_text_names_the_monospaced_font_first():
    fig = Figure("fonts-test", title="t", zh="中", en="e")
    fig.text(10, 200, "k0–k3 中", mono=True, cls="sample")
    root, faces = drawn(fig)
    (el,) = [e for e in root.iter(f"{SVG}text") if e.get("class") == "sample"]
    families = [f.strip() for f in el.get("font-family").split(",")]
    assert families[0].startswith("cf-mono-") and families[1].startswith("cf-sans-")  # 中 comes from the sans
    assert el.get("font-family").endswith(MONO) and "monospace" in el.get("font-family")


def test_a_figure_is_the_same_document_however_often_it_is_drawn():
    fig = Figure("fonts-test", title="完整序列的因果遮罩", zh="上三角被屏蔽", en="masked")
    first = fig.svg()
    assert fig.svg() == first and first.count("<style") == 1 and first.count('font-family="cf-') == first.count("<text")
    again = Figure("fonts-test", title="完整序列的因果遮罩", zh="上三角被屏蔽", en="masked")
    assert again.svg() == first


def test_the_fonts_ship_as_package_data_with_their_license():
    tool = tomllib.loads((chapters.ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]
    patterns = tool["setuptools"]["package-data"]["figures"]
    folder = chapters.ROOT / "figures"
    shipped = {p.name for pattern in patterns for p in folder.glob(pattern)}
    assert shipped == {p.name for p in (folder / "fonts").iterdir() if p.suffix in (".woff2", ".txt")}
    assert {f"{face}.woff2" for face in ("sans-regular", "sans-bold", "mono-regular", "mono-bold")} <= shipped
    license_text = (folder / "fonts" / "OFL.txt").read_text(encoding="utf-8")
    assert "SIL OPEN FONT LICENSE" in license_text and "Version 1.1" in license_text
    for path in (folder / "fonts").glob("*.woff2"):
        names = TTFont(path)["name"]
        assert names.getDebugName(1).startswith("Course ") and "Source" not in names.getDebugName(1)
        assert "Open Font License" in names.getDebugName(13), path.name


def test_a_second_run_draws_the_same_figure_from_the_cache_without_fonttools(tmp_path):
    """Decompressed fonts and subsets are cached on disk: a warm run draws byte for byte the same SVG, and never
    imports fontTools (its import and the WOFF2 work were most of a chapter's figure time)."""
    script = (
        "import sys\n"
        "from figures.kit import Figure\n"
        "fig = Figure('cache-test', title='因果遮罩 causal mask', zh='逻辑块 → 物理块', en='logical → physical ≤ √')\n"
        "fig.text(20, fig.y, 'slot = block_table[t // B] · B + t % B', mono=True)\n"
        "sys.stdout.write(fig.svg())\n"
        "sys.stderr.write('fontTools' if 'fontTools' in sys.modules else 'none')\n"
    )
    env = {**os.environ, "COURSE_CACHE_DIR": str(tmp_path)}
    cold = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=chapters.ROOT)
    warm = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=chapters.ROOT)
    assert cold.returncode == warm.returncode == 0, cold.stderr[-2000:] + warm.stderr[-2000:]
    assert cold.stderr.endswith("fontTools") and warm.stderr.endswith("none"), (cold.stderr[-200:], warm.stderr[-200:])
    assert cold.stdout == warm.stdout and "@font-face" in warm.stdout
    assert list((tmp_path / "fonts").glob("*.woff2")), "the subsets are in the cache"
