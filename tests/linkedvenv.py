"""A venv that has the course's dependencies without unpacking torch again: hard links of what pip
installed in this environment (its folders and its loose files), for the tests that need a real,
non-editable install (tests/test_gradescope.py, tests/test_attacks.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def link_distributions(dists, site: Path) -> None:
    """Hard-link every installed file of `dists` (importlib.metadata distributions) into `site`."""
    for dist in dists:
        files = [f for f in dist.files or () if f.parts[0] != ".."]
        for top in sorted({f.parts[0] for f in files if len(f.parts) > 1 and f.parts[0] != "__pycache__"}):
            if not (site / top).exists():
                subprocess.run(["cp", "-al", str(dist.locate_file(top)), str(site / top)], check=True)
        for f in files:
            if (len(f.parts) == 1 or f.parts[0] == "__pycache__") and Path(dist.locate_file(f)).is_file():
                (site / f).parent.mkdir(exist_ok=True)
                if not (site / f).exists():
                    os.link(dist.locate_file(f), site / f)
