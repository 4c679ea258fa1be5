"""The engine as it runs inside a sandbox, for `course engine run --submission DIR` (see `engine.boxed`).

The sandbox's harness loads this file as its module (the grader never imports it to run it): `run(config)`
imports the chapter files the trusted side put in the box (the student's, and the reference's for the stages
whose task does not pass), builds the engine's parts from them, makes or loads the model (a preset from its
seed, or a folder seen read-only), generates, and returns plain data only: the tokens, the metrics, whose
code ran at each stage, the trace and the notes. Nothing else leaves the box.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any


def run(config: dict[str, Any]) -> dict[str, Any]:
    """Generate as `config` says (stages, model, settings, prompts, max_tokens) and return what the run produced."""
    from engine.core import Engine, Settings
    from engine.model import load
    from engine.parts import PROVIDED, Part, Parts
    from engine.words import use

    use(config.get("words") or {})  # the engine's words in the run's language (the box has no catalogs)

    modules: dict[str, ModuleType] = {}
    parts = {}
    for stage in config["stages"]:  # {"chapter", "task", "name", "file", "source"}
        path = stage["file"]
        if path not in modules:
            modules[path] = _import(Path(path), f"engine_{stage['source']}_{stage['chapter']}")
        module = modules[path]
        name = stage["name"]
        companion = getattr(module, PROVIDED[name]) if name in PROVIDED else None
        parts[name] = Part(stage["chapter"], stage["task"], name, getattr(module, name), stage["source"], companion)
    spec = config["model"]
    model = load(spec["name"], seed=spec["seed"])
    result = Engine(model, Parts(parts), Settings(**config["settings"])).generate(config["prompts"], config["max_tokens"])
    return {
        "outputs": result.outputs,
        "metrics": result.metrics,
        "sources": result.sources,
        "calls": result.calls,
        "trace": result.trace,
        "notes": result.notes,
    }


def _import(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a .py file always has both
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
