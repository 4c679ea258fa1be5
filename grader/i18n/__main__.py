"""`python -m grader.i18n update | todo DOMAIN | fill DOMAIN FILE.json | stats`: the catalogs, for translators.

update [DOMAIN…]  extract every marked text, mistake and docstring paragraph into the catalogs (of DOMAINs:
                  ch17 course …; all by default)
todo DOMAIN       the messages of DOMAIN (ch17, course) still without Chinese, as JSON with keys
fill DOMAIN FILE  write FILE's {key: Chinese} into DOMAIN's catalogs (keys from `todo`)
stats             messages and untranslated ones per catalog
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grader.i18n import update as u


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    command, *rest = argv
    if command in ("update", "stats"):
        report = u.update(rest or None) if command == "update" else None
        if report is None:
            from babel.messages.pofile import read_po

            report = {}
            for path in sorted(p for d in u.LOCALE_DIRS for p in d.glob("*/LC_MESSAGES/*.po")):
                with path.open("rb") as f:
                    cat = read_po(f)
                report[path] = (len(cat), sum(1 for m in cat if m.id and (not m.string or m.fuzzy)))
        for path, (n, missing) in report.items():
            print(f"{path.relative_to(u.ROOT)}: {n} messages, {missing} untranslated")
        return 0
    if command == "todo" and len(rest) == 1:
        print(json.dumps(u.todo(rest[0]), ensure_ascii=False, indent=1))
        return 0
    if command == "fill" and len(rest) == 2:
        filled, unknown = u.fill(rest[0], json.loads(Path(rest[1]).read_text(encoding="utf-8")))
        print(f"filled {filled}; keys not found: {unknown}")
        return 1 if unknown else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
