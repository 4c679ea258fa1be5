"""The chapter functions the engine is made of, and whose they are: the reference's or the student's.

Every stage of the engine calls one graded function (or class) of a chapter, by the
name its chapter file gives it. `reference_parts()` takes them all from `solutions/`.
`student_parts(folder)` first runs each chapter's public checks on the student's
chapter file (the same `grader.run.check` as `course check`, in its isolated child
process) and then takes a student's function wherever the checks of the task that
grades it all pass, and the reference's elsewhere.

The functions taken from the student's files then run **in this process**, imported
from those files: the engine is for the student's own machine, where their code is
trusted as any script they run is. (Grading never does this: `course check` and
`course grade` keep student code in a sandboxed child process.)

A student release has no `solutions/`: there the engine runs only when every task it
needs passes, and `PartsUnavailable` lists the ones that do not yet.
"""

from __future__ import annotations

import importlib
import importlib.util
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

from engine.words import tr

USED: tuple[tuple[str, str], ...] = (
    ("ch15", "embedding_lookup"),
    ("ch15", "linear"),
    ("ch15", "split_qkv"),
    ("ch16", "split_heads"),
    ("ch16", "merge_heads"),
    ("ch16", "attention_steps"),
    ("ch17", "causal_mask_with_offset"),
    ("ch18", "kv_head_for"),
    ("ch18", "gqa_attention"),
    ("ch19", "qk_norm_rope"),
    ("ch20", "add_rms_norm"),
    ("ch20", "swiglu_mlp"),
    ("ch21", "decode_inputs"),
    ("ch22", "flash_attention"),
    ("ch23", "process_logits"),
    ("ch23", "sample"),
    ("ch24", "Scheduler"),
    ("ch25", "slot_mapping"),
    ("ch25", "store_kv"),
    ("ch25", "BlockManager"),
    ("ch26", "varlen_metadata"),
    ("ch26", "graph_batch_size"),
    ("ch26", "pad_decode_batch"),
    ("ch26", "fill_static_buffers"),
    ("ch27", "EngineCore"),
    ("ch27", "AsyncEngineCore"),
    ("ch27", "schedule_spec"),
    ("ch27", "update_spec"),
    ("ch28", "logits_indices"),
    ("ch29", "prepare_inputs"),
    ("ch29", "latency_metrics"),
    ("ch30", "lower_request"),
    ("ch30", "select_phase"),
    ("ch31", "route_topk"),
    ("ch31", "dispatch"),
    ("ch31", "combine"),
    ("ch31", "rebalance_experts"),
    ("ch31", "balancedness"),
    ("ch31", "record_expert_load"),
    ("ch32", "verify_draft"),
)
"""(chapter, graded name) of every function or class the engine calls, in chapter order."""

PROVIDED = {"Scheduler": "Sequence", "BlockManager": "Sequence"}
"""The course-provided class each graded class works with, taken from the same file."""

REFERENCE, YOURS, OVERRIDE = "reference", "yours", "override"


class PartsUnavailable(RuntimeError):
    """Some stage has neither a passing student function nor a reference (in a student release)."""


@dataclass(frozen=True)
class Part:
    """One stage's function: its chapter, task and name, the callable, and whose it is."""

    chapter: str
    task: str
    name: str
    fn: Callable[..., Any]
    source: str
    companion: Any = None
    """The provided class it works with (Sequence for Scheduler and BlockManager), from the same file."""

    @property
    def label(self) -> str:
        return f"{self.task} {self.name}"


class Parts:
    """The functions of one engine, by graded name."""

    def __init__(self, parts: dict[str, Part], notes: list[str] | None = None) -> None:
        self._parts = parts
        self.notes = notes or []
        """What the gate found (a chapter file missing, a task failing), for the run's report."""

    def __getitem__(self, name: str) -> Part:
        return self._parts[name]

    def __iter__(self):
        return iter(self._parts.values())

    def fn(self, name: str) -> Callable[..., Any]:
        return self._parts[name].fn

    def replaced(self, **fns: Callable[..., Any]) -> Parts:
        """A copy with some functions swapped (marked `override`): how tests plant a wrong one."""
        unknown = set(fns) - set(self._parts)
        if unknown:
            raise KeyError(f"no stage calls {', '.join(sorted(unknown))}; stages: {', '.join(self._parts)}")
        swapped = {n: replace(p, fn=fns[n], source=OVERRIDE) if n in fns else p for n, p in self._parts.items()}
        return Parts(swapped, self.notes)

    def sources(self) -> dict[str, str]:
        """ "ch19.3 qk_norm_rope" → "yours" / "reference" / "override", in chapter order."""
        return {p.label: p.source for p in self}


def _task_of(chapter_id: str, name: str) -> str:
    from grader import chapters  # here, not above: the engine also runs in a sandbox, which has no grader.chapters

    for task in chapters.find(chapter_id).tasks:
        if name in task.names:
            return task.id
    raise LookupError(f"{chapter_id} has no graded {name}")


def _reference_module(chapter_id: str) -> ModuleType | None:
    from grader import chapters

    ch = chapters.find(chapter_id)
    if not (chapters.SOLUTIONS / ch.filename).is_file():
        return None
    return importlib.import_module(f"solutions.{ch.filename[:-3]}")


def _student_module(path: Path) -> ModuleType:
    """Import a student's chapter file in this process, under a name of its own."""
    spec = importlib.util.spec_from_file_location(f"course_student_{path.stem}", path)
    assert spec is not None and spec.loader is not None  # a .py file always has both
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _part(chapter_id: str, name: str, module: ModuleType, source: str) -> Part:
    companion = getattr(module, PROVIDED[name]) if name in PROVIDED else None
    return Part(chapter_id, _task_of(chapter_id, name), name, getattr(module, name), source, companion)


def reference_parts() -> Parts:
    """Every stage from the reference solutions.

    Raises:
        PartsUnavailable: in a student release, which carries no solutions.
    """
    parts = {}
    for chapter_id, name in USED:
        module = _reference_module(chapter_id)
        if module is None:
            raise PartsUnavailable(
                tr(
                    "this installation has no reference solutions (a student release): the engine runs your own chapter "
                    "functions; pass --submission or run it from your checkout"
                )
            )
        parts[name] = _part(chapter_id, name, module, REFERENCE)
    return Parts(parts)


def by_chapter(tasks: list[str]) -> str:
    """Tasks ("ch15.1 embedding_lookup", …) as lines, one per chapter: "  ch15: ch15.1 embedding_lookup, …"."""
    chapters: dict[str, list[str]] = {}
    for task in tasks:
        chapters.setdefault(task.split(".", 1)[0], []).append(task)
    return "\n".join(f"  {chapter}: {', '.join(names)}" for chapter, names in chapters.items())


def passing_tasks(
    folder: Path,
    chapter_id: str,
    *,
    launcher: Callable[..., Any] | None = None,
    on_chapter: Callable[[str], None] | None = None,
    sandbox: str | None = None,
) -> tuple[set[str], str]:
    """The tasks of a student's chapter file whose public checks all pass, and a note on the rest (the checks run in
    a sandbox of `sandbox`'s kind when given: somebody else's code)."""
    from grader import chapters
    from grader.run import check

    ch = chapters.find(chapter_id)
    if not (folder / ch.filename).is_file():
        return set(), tr("{chapter}: no {file} in {folder}", chapter=chapter_id, file=ch.filename, folder=folder)
    if on_chapter:
        on_chapter(chapter_id)
    report = check(chapter_id, submission=folder, hidden=False, figures_dir=None, launcher=launcher, sandbox=sandbox)
    failing = {r.task for r in report.results if r.status != "passed"}
    passed = {r.task for r in report.results} - failing
    if failing:
        note = tr("{chapter}: {tasks} not passing yet", chapter=chapter_id, tasks=", ".join(sorted(failing)))
    else:
        note = tr("{chapter}: every task passes", chapter=chapter_id)
    return passed, note


@contextmanager
def _warm_processes() -> Iterator[Callable[..., Any] | None]:
    """A launcher forking the checks' student processes from one warm process (grader.isolation.zygote): ten chapters'
    checks then cost about a second in all, not one interpreter start each. None (fresh interpreters) if it
    cannot start."""
    from grader.isolation import portable
    from grader.isolation.zygote import Zygote, ZygoteError

    if not portable.can_fork():  # macOS, Windows, COURSE_PORTABLE=1: fresh interpreters
        yield None
        return
    try:
        zygote = Zygote()
    except (ZygoteError, OSError):
        yield None
        return
    try:
        yield zygote.start
    finally:
        zygote.close()


def student_parts(folder: Path, *, on_chapter: Callable[[str], None] | None = None) -> Parts:
    """The student's function wherever its task's public checks pass, the reference's elsewhere.

    Args:
        folder: the student's chapter files, under the names of `exercises/`.
        on_chapter: called with each chapter id before its checks run (a progress display).

    Raises:
        PartsUnavailable: a stage whose task does not pass, in a release without reference solutions.
    """
    from grader import chapters

    folder = Path(folder).resolve()
    absent = sorted({ch for ch, _ in USED} - {ch.id for ch in chapters.all_chapters()})
    if absent:
        raise PartsUnavailable(tr("this installation has no {chapters}, which the engine needs", chapters=", ".join(absent)))
    parts, notes, missing = {}, [], []
    with _warm_processes() as launcher:
        checked = {ch: passing_tasks(folder, ch, launcher=launcher, on_chapter=on_chapter) for ch in dict.fromkeys(ch for ch, _ in USED)}
    for chapter_id, (passed, note) in checked.items():
        notes.append(note)
        module = _student_module(folder / chapters.find(chapter_id).filename) if passed else None
        reference = None
        for name in (n for ch, n in USED if ch == chapter_id):
            if module is not None and _task_of(chapter_id, name) in passed:
                parts[name] = _part(chapter_id, name, module, YOURS)
                continue
            reference = reference or _reference_module(chapter_id)
            if reference is None:
                missing.append(f"{_task_of(chapter_id, name)} {name}")
            else:
                parts[name] = _part(chapter_id, name, reference, REFERENCE)
    if missing:
        raise PartsUnavailable(
            tr(
                "the engine runs your own code here (this installation has no reference solutions), and these tasks do not "
                "pass their public checks yet:\n{tasks}\nRun `course check <chapter>` for each.",
                tasks=by_chapter(missing),
            )
        )
    return Parts(parts, notes)
