"""`course engine run --submission DIR`: somebody else's code generating, the whole engine inside a sandbox.

The grader's process never runs a submission's code (the trust rule). First each chapter's public checks run on the
student's file in a sandbox of their own, as `course check --submission` runs them (`engine.parts.passing_tasks`).
Then one more sandbox runs the engine itself (`engine.inbox`), holding the engine's code, the student's chapter
files for the stages whose task passes and the reference's for the others (so a student's engine can run before
every chapter is done; the hidden checks never enter), and the model: a preset made from its seed in there, or a
model folder seen read-only. Only plain data comes back over the sandbox's pipes (the tokens, the metrics, the trace
and notes), checked here before anything uses it; whose code ran at each stage is what this side decided, never
what the box says. The overview is drawn here from that data.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from engine.core import EngineError, Run, Settings
from engine.model import PRESETS, Model
from engine.parts import REFERENCE, USED, YOURS, PartsUnavailable, _task_of, by_chapter, passing_tasks
from engine.words import sent_words, tr

MODEL_IN_BOX = "/model"
"""Where a model folder is seen in the box (read-only)."""


def run_boxed(
    *,
    model: Model,
    model_name: str,
    seed: int,
    prompts: list[list[int]],
    max_tokens: int,
    settings: Settings,
    submission: Path,
    sandbox: str,
    memory_limit: int,
    time_limit: float,
    on_chapter: Callable[[str], None] | None = None,
) -> Run:
    """Generate with a submission's chapter functions, every one of them run in a sandbox (see the module).

    Raises:
        PartsUnavailable: a stage whose task does not pass, where this installation has no reference for it.
        EngineError: the engine stopped in the sandbox (the student's code raised, ran out of time or memory), or
            what came back is not what an engine run returns.
    """
    from grader import chapters
    from grader.isolation.sandbox import STUDENT_PACKAGES, Box, probe
    from grader.isolation.session import Session, StudentError, StudentRaised
    from grader.isolation.worker import OUTPUT_LIMIT
    from grader.isolation.zygote import Zygote
    from grader.run import read_module

    probe(sandbox)
    folder = Path(submission).resolve()
    order = list(dict.fromkeys(ch for ch, _ in USED))
    checked = {ch: passing_tasks(folder, ch, sandbox=sandbox, on_chapter=on_chapter) for ch in order}
    files: dict[str, bytes] = {}
    chosen: list[dict[str, str]] = []
    notes, missing = [], []
    for chapter_id, (passed, note) in checked.items():
        notes.append(note)
        ch = chapters.find(chapter_id)
        for name in (n for c, n in USED if c == chapter_id):
            task = _task_of(chapter_id, name)
            if task in passed:
                source, file = YOURS, f"yours_{ch.filename}"
                files.setdefault(file, read_module(folder / ch.filename))
            elif (chapters.SOLUTIONS / ch.filename).is_file():
                source, file = REFERENCE, f"reference_{ch.filename}"
                files.setdefault(file, (chapters.SOLUTIONS / ch.filename).read_bytes())
            else:
                missing.append(f"{task} {name}")
                continue
            chosen.append({"chapter": chapter_id, "task": task, "name": name, "file": file, "source": source})
    if missing:
        raise PartsUnavailable(
            tr(
                "the engine runs the submission's own code here (this installation has no reference solutions), and these "
                "tasks do not pass their public checks yet:\n{tasks}\nRun `course check <chapter>` for each.",
                tasks=by_chapter(missing),
            )
        )
    binds = {} if model_name in PRESETS else {os.path.realpath(model_name): MODEL_IN_BOX}
    box = Box(sandbox, files, memory=memory_limit, packages=(*STUDENT_PACKAGES, "safetensors"), code=("engine",), binds=binds)
    config = {
        "stages": [{**stage, "file": str(box.inbox / stage["file"])} for stage in chosen],
        "model": {"name": model_name if model_name in PRESETS else MODEL_IN_BOX, "seed": seed},
        "settings": {k: getattr(settings, k) for k in settings.__dataclass_fields__},
        "prompts": prompts,
        "max_tokens": max_tokens,
        "words": sent_words(),  # the box has no catalogs: the engine's words in this run's language go along
    }
    workdir = Path(tempfile.mkdtemp(prefix="course-engine-"))
    zygote = session = None
    try:
        zygote = Zygote(box=box)
        spawn = functools.partial(zygote.start, workdir=workdir, output_limit=OUTPUT_LIMIT)
        session = Session(box.harness / "engine" / "inbox.py", spawn=spawn, time_limit=time_limit, budget=box.budget)
        session.begin_check(time_limit)
        try:
            value = session.call("run", [config], {}).value
        except StudentRaised as e:
            raise EngineError(tr("the engine stopped in the sandbox: {error}", error=e.explain())) from None
        except StudentError as e:
            raise EngineError(tr("the engine stopped in the sandbox: {error}", error=e)) from None
    finally:
        if session is not None:
            session.close()
        if zygote is not None:
            zygote.close()
        box.close()  # every process of the submission is gone before anything it returned is used
    sources = {f"{s['task']} {s['name']}": s["source"] for s in chosen}
    data = _checked(value, prompts, max_tokens, model.config.vocab_size, set(sources))
    return Run(
        data["outputs"], data["metrics"], sources, data["trace"], notes=notes + data["notes"], model=model.source, calls=data["calls"]
    )


def _checked(value: Any, prompts: list[list[int]], max_tokens: int, vocab: int, labels: set[str]) -> dict[str, Any]:
    """What the box returned, if it has the shape of an engine run's data (never believed further than that: the
    call counts, like the trace, are the box's account of its run, drawn on the overview and graded nowhere)."""

    def fail(why: str) -> EngineError:
        return EngineError(tr("the engine in the sandbox sent back something that is not a run: {why}", why=why))

    if type(value) is not dict or set(value) != {"outputs", "metrics", "sources", "calls", "trace", "notes"}:
        raise fail(tr("not the six parts of a run"))
    outputs = value["outputs"]
    if type(outputs) is not list or len(outputs) != len(prompts):
        raise fail(tr("{n} outputs expected", n=len(prompts)))
    for out in outputs:
        if type(out) is not list or len(out) > max_tokens or not all(type(t) is int and 0 <= t < vocab for t in out):
            raise fail(tr("an output is not a list of at most {n} token ids below {vocab}", n=max_tokens, vocab=vocab))
    metrics = value["metrics"]
    if type(metrics) is not dict or not all(type(k) is str and type(v) in (int, float, type(None)) for k, v in metrics.items()):
        raise fail(tr("metrics are not named numbers"))
    trace = value["trace"]
    if type(trace) is not list or len(trace) > 10_000 or not all(_plain(e) for e in trace):
        raise fail(tr("the trace is not a list of plain records"))
    notes = value["notes"]
    if type(notes) is not list or not all(type(n) is str and len(n) < 2000 for n in notes) or len(notes) > 100:
        raise fail(tr("notes are not short texts"))
    calls = value["calls"]
    if type(calls) is not dict or not all(k in labels and type(v) is int and v >= 0 for k, v in calls.items()):
        raise fail(tr("call counts are not counts of the engine's stages"))
    return {"outputs": outputs, "metrics": metrics, "trace": trace, "notes": notes, "calls": calls}


def _plain(record: Any) -> bool:
    """A trace record: a dict of strings, numbers and lists of them."""
    simple = (str, int, float, bool, type(None))
    return type(record) is dict and all(
        type(k) is str and (type(v) in simple or (type(v) is list and all(type(x) in simple for x in v))) for k, v in record.items()
    )
