"""The course's one visual language: sizes, fonts and a palette by role.

Colours come from the Okabe-Ito set, which stays distinguishable for
colour-blind readers; every colour that carries meaning is also paired with a
label or a pattern (wrong cells are hatched and marked ✗).
"""

WIDTH = 880
MARGIN = 28
CELL = 36

# Every figure embeds subsets of the fonts in figures/fonts/ and names them before these
# (figures.typeface, Figure.svg): these lists matter only to a viewer that ignores @font-face.
# "monospace" marks monospaced text (figures.typeface.kind_of, the lab's width estimate).
FONT = '"Noto Sans CJK SC", "Source Han Sans SC", "PingFang SC", "Microsoft YaHei", "WenQuanYi Micro Hei", sans-serif'
MONO = '"Noto Sans Mono", "DejaVu Sans Mono", "Menlo", "Consolas", "Noto Sans Mono CJK SC", monospace'

TITLE = 21
CAPTION = 14
LABEL = 13
VALUE = 13
SMALL = 10.5
LABEL_SMALL = SMALL + 1  # row and column labels, notes beside a panel, legends

INK = "#1f1f1f"
MUTED = "#5f5f5f"
RULE = "#9a9a9a"
PAPER = "#ffffff"

# Roles: (stroke, fill). The same role has the same colour in every figure.
ROLES = {
    "q": ("#0072B2", "#d6e8f5"),  # queries: blue
    "k": ("#E69F00", "#fbeccc"),  # keys: orange
    "v": ("#009E73", "#cdeee3"),  # values: bluish green
    "token": ("#56B4E9", "#e3f2fb"),  # tokens, positions, logical things: sky blue
    "block": ("#7a5c99", "#ece4f4"),  # physical blocks and slots: purple
    "attend": ("#0072B2", "#9cc8e6"),  # a query may attend this key
    "masked": ("#a8a8a8", "#e6e6e6"),  # masked, padding, unused: grey
    "cached": ("#7a5c99", "#ece4f4"),  # already in the KV cache
    "new": ("#56B4E9", "#e3f2fb"),  # computed this step
    "accent": ("#CC79A7", "#f6e1ec"),  # the traced element, the winner, the current tile
    "wrong": ("#D55E00", "#f8d9c6"),  # the student's wrong value: vermillion, hatched, ✗
    "plain": ("#9a9a9a", "#f7f7f7"),  # numbers without a role
}


def stroke(role: str) -> str:
    return ROLES[role][0]


def fill(role: str) -> str:
    return ROLES[role][1]
