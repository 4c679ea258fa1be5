"""The lab's engine panel: `course engine run` on the page's prompt, as a subprocess of the lab.

The page sends a prompt and a number of tokens; the lab runs the command a student would type
(`python -m grader.cli --lang L engine run --prompt TEXT --max-tokens N`, with `--json --figures TMP` so
that it can read the answer back, and `--submission DIR` when the lab runs a submission) in the project
folder, never in the server's own process. One run at a time: a newer request stops the running one (its
whole process tree is killed) and replaces it, as the experiments' lanes do; a run past the time limit is
killed and reported. What comes back is plain data: the completion as text (escaped as `runner.shown`
does), the command line to type in a terminal, a line of the run's numbers, and the overview figure as a
`data:` image. The figure is drawn by the process that ran the student's code (in a student release, their
own exercises/), so the page shows it in an `<img>`, where an SVG runs no script, never as inline markup.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unicodedata
from pathlib import Path
from typing import Any

from grader import chapters
from grader.delivery import escape
from grader.i18n import language, tr
from grader.isolation import procs
from grader.lab import ParamError, _number

DEFAULT_PROMPT = "The KV cache"
MAX_PROMPT = 300
"""Characters of a prompt at most: one line of text (the shipped model's context is short anyway)."""
DEFAULT_TOKENS, MIN_TOKENS, MAX_TOKENS = 32, 1, 64
TIME_LIMIT = 120.0
"""Seconds a run may take, checks of the student's chapters included, before it is killed."""
SVG_LIMIT = 4 << 20
"""Bytes of the overview figure at most (the shipped model's is about 0.2 MB)."""
OUTPUT_LIMIT = 8 << 20
"""Bytes of what the command prints that are read back at most (its JSON is its last line)."""
MESSAGE_LIMIT = 4000
CLICK_ERROR = re.compile(r"^(Error: |错误：)")
"""click's prefix of a ClickException's message (`Error: {message}`, in English or as its catalog has it)."""


def parse(raw: dict | None) -> tuple[str, int]:
    """(prompt, max_tokens) from the page's values (defaults for missing ones); raises ParamError."""
    raw = raw or {}
    errors: dict[str, str] = {}
    prompt: str = DEFAULT_PROMPT
    tokens: int = DEFAULT_TOKENS
    if "prompt" in raw:
        text = raw["prompt"]
        if not isinstance(text, str) or not text.strip():
            errors["prompt"] = tr("a prompt, please: some text for the model to continue")
        elif len(text) > MAX_PROMPT:
            errors["prompt"] = tr("at most {limit} characters; got {n}", limit=MAX_PROMPT, n=len(text))
        elif any(unicodedata.category(c) in ("Cc", "Cf") for c in text):
            errors["prompt"] = tr("one line of text, without control characters")
        else:
            prompt = text
    if "max_tokens" in raw:
        try:
            tokens = _number(raw["max_tokens"], integer=True)
            if not MIN_TOKENS <= tokens <= MAX_TOKENS:
                errors["max_tokens"] = tr("between {low} and {high}; got {value}", low=MIN_TOKENS, high=MAX_TOKENS, value=tokens)
        except ValueError as e:
            errors["max_tokens"] = str(e)
    unknown = sorted(set(raw) - {"prompt", "max_tokens"})
    if unknown:
        errors[unknown[0]] = tr("the engine panel has no control {name}", name=repr(unknown[0]))
    if errors:
        raise ParamError(errors)
    return prompt, tokens


class EnginePanel:
    """`course engine run` for the page, one run at a time, in the project folder (`root`, the one holding exercises/)."""

    def __init__(
        self,
        *,
        submission: Path | None = None,
        sandboxed: bool = True,
        root: Path = chapters.ROOT,
        time_limit: float = TIME_LIMIT,
        env: dict[str, str] | None = None,
    ) -> None:
        """`submission`: the lab's submission folder (the engine then runs it, in a sandbox unless not `sandboxed`,
        as `course lab --no-sandbox` asked); `env`: the command's environment (default: the lab's)."""
        self.submission, self.sandboxed, self.root = submission, sandboxed, Path(root)
        self.time_limit = time_limit
        self.env = dict(os.environ if env is None else env, PYTHONIOENCODING="utf-8")
        self._seq = itertools.count(1)
        self._turn = threading.Lock()  # one engine at a time
        self._state = threading.Lock()  # guards the fields below
        self._latest = 0
        self._proc: subprocess.Popen | None = None
        self._replaced = False
        self._killed: list[int] = []  # the descendants of the command last killed

    # -- what the page shows ----------------------------------------------------------------------
    def describe(self) -> dict:
        """The panel's controls and the command it runs at their defaults."""
        return {
            "prompt": DEFAULT_PROMPT,
            "max_prompt": MAX_PROMPT,
            "max_tokens": {"default": DEFAULT_TOKENS, "min": MIN_TOKENS, "max": MAX_TOKENS},
            "command": escape.plain(self.command(DEFAULT_PROMPT, DEFAULT_TOKENS)),
            "time_limit": self.time_limit,
        }

    def options(self, prompt: str, max_tokens: int) -> list[str]:
        """The options of `course engine run` for this prompt (and the lab's submission)."""
        out = ["--prompt", prompt, "--max-tokens", str(max_tokens)]
        if self.submission is not None:
            out += ["--submission", str(self.submission)] + ([] if self.sandboxed else ["--no-sandbox"])
        return out

    def command(self, prompt: str, max_tokens: int) -> str:
        """The command line a student types in a terminal for the same run (its figure then goes to course-figures/)."""
        return shlex.join(["course", "engine", "run", *self.options(prompt, max_tokens)])

    def argv(self, prompt: str, max_tokens: int, figures: Path) -> list[str]:
        """What the lab runs: that command through this Python, in the page's language, answering in JSON."""
        course = [sys.executable, "-m", "grader.cli", "--lang", language()]
        return [*course, "engine", "run", *self.options(prompt, max_tokens), "--json", "--figures", str(figures)]

    # -- running ------------------------------------------------------------------------------------
    def run(self, raw: dict | None) -> dict:
        """Validate the page's values, run the engine on them and read its answer back (never raises)."""
        started = time.monotonic()
        try:
            prompt, max_tokens = parse(raw)
        except ParamError as e:
            return {"status": "invalid", "message": tr("the engine cannot run this: {error}", error=e), "errors": e.errors}
        seq = next(self._seq)
        with self._state:
            self._latest = seq
            self._stop_running(replaced=True)
        with self._turn:
            result = self._execute(seq, prompt, max_tokens)
        result["elapsed"] = round(time.monotonic() - started, 3)
        return result

    def stop(self) -> None:
        """Kill the running engine, if any (the lab stops)."""
        with self._state:
            self._latest = next(self._seq)
            self._stop_running(replaced=True)

    def _stop_running(self, *, replaced: bool) -> None:
        """Kill the running command and everything it started (the caller holds `_state`)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        self._replaced = replaced
        self._killed = tree = procs.descendants(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own process group (start_new_session)
        except OSError:
            pass
        for pid in tree:  # those that left its group (a sandbox, a student process)
            procs.kill(pid)

    def _execute(self, seq: int, prompt: str, max_tokens: int) -> dict:
        superseded = {"status": "superseded", "message": "a newer request replaced this one"}
        command = self.command(prompt, max_tokens)
        scratch = Path(tempfile.mkdtemp(prefix="course-lab-engine-"))
        try:
            with open(scratch / "stdout", "wb") as out, open(scratch / "stderr", "wb") as err:
                with self._state:
                    if seq != self._latest:
                        return superseded
                    self._replaced = False
                    self._proc = proc = subprocess.Popen(
                        self.argv(prompt, max_tokens, scratch),
                        cwd=self.root,
                        env=self.env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                        start_new_session=True,
                    )
                timed_out = False
                try:
                    proc.wait(timeout=self.time_limit)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    with self._state:
                        self._stop_running(replaced=False)
                    proc.wait()
                with self._state:
                    self._proc, killed, self._killed, replaced = None, self._killed, [], self._replaced
                _reap(killed)
                if replaced:
                    return superseded
            base = {"command": escape.plain(command), "prompt": escape.plain(prompt)}
            if timed_out:
                message = tr("the engine did not finish in {limit:g} s and was stopped", limit=self.time_limit)
                return {**base, "status": "timeout", "message": message}
            stdout, stderr = _tail(scratch / "stdout"), _tail(scratch / "stderr")
            if proc.returncode != 0:
                return {**base, "status": "error", "message": _failure(stderr, proc.returncode)}
            doc = _last_json(stdout)
            if doc is None:
                message = tr("the engine printed no result; what it said:") + "\n" + _failure(stderr, proc.returncode)
                return {**base, "status": "error", "message": message}
            return {**base, **answer(doc), "status": "passed", "message": "", "figure": _figure(scratch / "engine" / "overview.svg")}
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _reap(pids: list[int], wait: float = 2.0) -> None:
    """Reap the killed descendants this process adopted (the lab is a subreaper: `procs.become_subreaper`)."""
    deadline = time.monotonic() + wait
    for pid in pids:
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not adopted by us, or reaped already
                break
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.01)


def answer(doc: dict) -> dict:
    """What the page shows of `course engine run --json`'s document: the completion, the numbers, the notes."""
    texts = doc.get("texts") or []
    first = texts[0] if texts and isinstance(texts[0], dict) else {}
    completion = first.get("completion")
    if not isinstance(completion, str):  # a model without a tokenizer: token ids
        outputs = doc.get("outputs") or [[]]
        completion = " ".join(str(t) for t in outputs[0])
    notes = [escape.plain(n, lines=True) for n in doc.get("notes") or [] if isinstance(n, str)]
    return {"completion": escape.plain(completion, lines=True), "numbers": numbers(doc), "notes": notes}


def numbers(doc: dict) -> str:
    """One line of the run's numbers: steps, prefix hits, drafts accepted, experts' balance, whose code ran."""
    m = doc.get("metrics") or {}
    parts = [
        tr(
            "{steps} steps ({prefill} prefill, {decode} decode)",
            steps=m.get("steps", 0),
            prefill=m.get("prefill_steps", 0),
            decode=m.get("decode_steps", 0),
        ),
        tr("prefix-cache hits {hits} ({cached} tokens)", hits=m.get("prefix_cache_hits", 0), cached=m.get("prefix_cached_tokens", 0)),
    ]
    if m.get("draft_tokens"):
        parts.append(tr("drafts accepted {accepted} of {drafts}", accepted=m.get("accepted_tokens", 0), drafts=m["draft_tokens"]))
    if m.get("moe_ep_ranks"):
        before = m.get("moe_balancedness_before") or m.get("moe_balancedness") or 0.0
        after = m.get("moe_balancedness_after") or m.get("moe_balancedness") or 0.0
        parts.append(tr("experts' balancedness {before:.2f} → {after:.2f}", before=before, after=after))
    calls = doc.get("calls") or {}
    called = {str(label)[:4] for label, n in calls.items() if n}
    if calls:
        parts.append(tr("chapters called: {n} of {total}", n=len(called), total=len(chapters.all_chapters())))
    sources = doc.get("parts") or {}
    if sources:
        yours = sum(1 for s in sources.values() if s == "yours")
        parts.append(tr("your code in {n} of {total} functions", n=yours, total=len(sources)))
    return escape.plain(" · ".join(parts))


def _tail(path: Path) -> str:
    """The last OUTPUT_LIMIT bytes a command wrote to `path`, as text."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - OUTPUT_LIMIT))
        return f.read().decode("utf-8", errors="replace")


def _last_json(stdout: str) -> dict | None:
    """The JSON document `--json` prints as its last line (the student's code may have printed before it)."""
    for line in reversed(stdout.splitlines()):
        if line.strip():
            try:
                doc = json.loads(line)
            except ValueError:
                return None
            return doc if isinstance(doc, dict) else None
    return None


def _failure(stderr: str, returncode: int) -> str:
    """What the page says of a failed run: click's message without its prefix, or a traceback's last line."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    if any(line.startswith("Traceback (most recent call last)") for line in lines):
        said = tr("the engine stopped with an error: {error}", error=lines[-1])
    elif lines:
        said = "\n".join([CLICK_ERROR.sub("", lines[0]), *lines[1:]])
    else:
        said = tr("the engine stopped (exit status {code}) without a message", code=returncode)
    if len(said) > MESSAGE_LIMIT:
        said = said[: MESSAGE_LIMIT - 1] + "…"
    return escape.plain(said, lines=True)


def _figure(path: Path) -> dict[str, Any] | None:
    """The overview figure as a `data:` URL for an `<img>` (None if absent or over SVG_LIMIT)."""
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > SVG_LIMIT:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if data.lstrip()[:5] not in (b"<svg ", b"<?xml"):
        return None
    return {"src": "data:image/svg+xml;base64," + base64.b64encode(data).decode("ascii"), "bytes": len(data)}
