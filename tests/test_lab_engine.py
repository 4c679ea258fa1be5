"""The lab's engine panel: `course engine run` as a subprocess of the lab, through POST /api/engine.

The reference (this checkout) continues the default prompt and the answer carries the text, the command
to type and the run's course map; the route refuses what /api/run refuses; a run past the limit is killed,
a newer one replaces a running one; in a student release without passing tasks the message names them."""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET

import pytest
from starlette.testclient import TestClient

from grader.delivery.release import build
from grader.isolation import procs
from grader.lab.access import Session
from grader.lab.engine_panel import DEFAULT_PROMPT, DEFAULT_TOKENS, MAX_PROMPT, EnginePanel
from grader.lab.runner import Lab
from grader.lab.server import MAX_BODY, app

pytestmark = pytest.mark.slow  # runs the engine in subprocesses, builds a release

PORT = 8766
PAGE = {"Content-Type": "application/json", "Origin": f"http://127.0.0.1:{PORT}"}
"""The headers the page's own script sends (its cookie goes by itself)."""


@pytest.fixture(scope="module")
def lab():
    lab = Lab(solutions=True, time_limit=5)
    yield lab
    lab.close()


@pytest.fixture(scope="module")
def served(lab):
    """The lab's app and a client holding its cookie (as the owner's browser after the printed URL)."""
    session = Session(PORT)
    client = TestClient(app(lab, session), base_url=f"http://127.0.0.1:{PORT}")
    client.get(session.url)
    return client


@pytest.fixture(scope="module")
def default_run(served):
    """The panel's answer for the page's defaults."""
    return served.post("/api/engine", json={"params": {}}, headers=PAGE)


def test_the_panel_continues_the_default_prompt_with_the_command_and_the_course_map(served, default_run, tmp_path):
    assert default_run.status_code == 200
    got = default_run.json()
    assert got["status"] == "passed", got["message"]
    assert got["prompt"] == DEFAULT_PROMPT and got["completion"].strip()
    assert got["command"] == shlex.join(["course", "engine", "run", "--prompt", DEFAULT_PROMPT, "--max-tokens", str(DEFAULT_TOKENS)])
    assert served.get("/api/engine").json()["command"] == got["command"]  # what the page shows before a run
    assert "chapters called: 18 of 18" in got["numbers"] and "steps" in got["numbers"] and "drafts accepted" in got["numbers"]
    src = got["figure"]["src"]
    assert src.startswith("data:image/svg+xml;base64,")
    svg = ET.fromstring(base64.b64decode(src.split(",", 1)[1]))
    assert svg.tag.endswith("svg") and svg.get("id") == "overview"
    # The command it shows is the one a student types: run in a terminal, it writes the same text (seeded sampling).
    argv = shlex.split(got["command"])
    assert argv[0] == "course"
    typed = [sys.executable, "-m", "grader.cli", *argv[1:], "--json", "--figures", str(tmp_path)]
    out = subprocess.run(typed, capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout)["texts"][0]["completion"] == got["completion"]
    assert (tmp_path / "engine" / "overview.svg").is_file()


def test_the_panel_refuses_what_a_run_of_an_experiment_refuses(lab, served):
    body = json.dumps({"params": {"prompt": "A block table", "max_tokens": 2}})
    for headers, status in (
        ({**PAGE, "Origin": "http://evil.example"}, 403),
        ({k: v for k, v in PAGE.items() if k != "Origin"}, 403),
        ({**PAGE, "Content-Type": "text/plain"}, 415),
        ({**PAGE, "Content-Type": "application/x-www-form-urlencoded"}, 415),
    ):
        r = served.post("/api/engine", content=body, headers=headers)
        assert r.status_code == status and r.json()["message"], headers
    stranger = TestClient(app(lab, Session(PORT)), base_url=f"http://127.0.0.1:{PORT}")  # never opened the printed URL
    r = stranger.post("/api/engine", content=body, headers=PAGE)
    assert r.status_code == 403 and r.json()["status"] == "refused"
    assert served.post("/api/engine", content=b"not json", headers=PAGE).status_code == 400
    assert served.post("/api/engine", content=b'{"params": [1]}', headers=PAGE).status_code == 400
    r = served.post("/api/engine", content=b'{"params": {"prompt": "' + b"x" * MAX_BODY + b'"}}', headers=PAGE)
    assert r.status_code == 413
    for params, name, reason in (
        ({"prompt": "x" * (MAX_PROMPT + 1)}, "prompt", f"at most {MAX_PROMPT} characters; got {MAX_PROMPT + 1}"),
        ({"prompt": "   "}, "prompt", "a prompt, please"),
        ({"prompt": "two\nlines"}, "prompt", "without control characters"),
        ({"max_tokens": 0}, "max_tokens", "between 1 and 64; got 0"),
        ({"max_tokens": "2.5"}, "max_tokens", "not a whole number"),
        ({"temperature": 2}, "temperature", "no control 'temperature'"),
    ):
        got = served.post("/api/engine", json={"params": params}, headers=PAGE).json()
        assert got["status"] == "invalid" and reason in got["errors"][name] and reason in got["message"], (params, got)


def test_a_run_past_the_limit_is_killed_and_reported():
    before = procs.children()
    panel = EnginePanel(time_limit=0.3)  # the interpreter and torch alone take longer
    started = time.monotonic()
    got = panel.run({"max_tokens": 4})
    assert got["status"] == "timeout" and "did not finish in 0.3 s and was stopped" in got["message"], got
    assert time.monotonic() - started < 10
    assert procs.children() <= before  # nothing of it is left


def test_a_newer_request_replaces_a_running_one():
    panel = EnginePanel()
    first: dict = {}
    second: dict = {}

    def started(other: object = None) -> object:
        """The panel's running engine once it is not `other`."""
        deadline = time.monotonic() + 30
        while (panel._proc is None or panel._proc is other) and time.monotonic() < deadline:
            time.sleep(0.02)
        return panel._proc

    older = threading.Thread(target=lambda: first.update(panel.run({"prompt": "A block table", "max_tokens": 64})))
    older.start()
    running = started()
    assert running is not None
    newer = threading.Thread(target=lambda: second.update(panel.run({"prompt": "The scheduler", "max_tokens": 3})))
    newer.start()
    replacing = started(running)
    assert replacing is not None and running.returncode is not None  # the older engine was gone before the newer began
    older.join(timeout=30)
    newer.join(timeout=60)
    assert first["status"] == "superseded"
    assert second["status"] == "passed" and second["prompt"] == "The scheduler", second


def test_in_a_student_release_the_message_names_the_tasks_still_missing(tmp_path):
    release = build(tmp_path / "release", nbgrader=False)
    panel = EnginePanel(root=release.student, env=dict(os.environ, PYTHONPATH=str(release.student)))
    got = panel.run({"max_tokens": 2})
    assert got["status"] == "error", got
    message = got["message"]
    missing = "do not pass their public checks yet:\n  ch15: ch15.1 embedding_lookup, ch15.2 linear, ch15.3 split_qkv\n  ch16: "
    assert missing in message, message  # a line per chapter
    assert "course check" in message and "Traceback" not in message and not message.startswith("Error")
    assert got["command"] == shlex.join(["course", "engine", "run", "--prompt", DEFAULT_PROMPT, "--max-tokens", "2"])
    # Stopped while it checks the student's chapters (a warm process and its student processes): nothing is left.
    procs.become_subreaper()  # as the lab is: the killed orphans come to this process, which must reap them
    before = procs.children()
    panel.time_limit = 2.0
    got = panel.run({"max_tokens": 2})
    assert got["status"] == "timeout", got
    assert procs.children() <= before


def test_a_lab_on_a_submission_runs_the_engine_on_it_sandboxed_as_the_lab_is(tmp_path):
    boxed, unboxed = EnginePanel(submission=tmp_path), EnginePanel(submission=tmp_path, sandboxed=False)
    assert boxed.command("The KV cache", 8).endswith(f"--max-tokens 8 --submission {tmp_path}")
    assert unboxed.command("The KV cache", 8).endswith(f"--submission {tmp_path} --no-sandbox")
    argv = boxed.argv("The KV cache", 8, tmp_path / "figures")
    assert argv[:4] == [sys.executable, "-m", "grader.cli", "--lang"] and argv[-3:] == ["--json", "--figures", str(tmp_path / "figures")]


def test_what_the_engine_printed_reaches_the_page_as_escaped_text_and_a_traceback_as_its_last_line():
    from grader.lab.engine_panel import _failure, _last_json, answer

    doc = {"texts": [{"prompt": "p", "completion": "\x1b[31m<b>red</b>\u202e\nnext"}], "notes": ["a\x07note"], "metrics": {"steps": 3}}
    shown = answer(doc)
    assert "\x1b" not in shown["completion"] and "\u202e" not in shown["completion"] and "\x07" not in shown["notes"][0]
    assert "<b>red</b>" in shown["completion"] and "\nnext" in shown["completion"]  # text (the page sets textContent)
    assert shown["numbers"].startswith("3 steps")
    assert _last_json('printed by the student\n{"metrics": {}}\n') == {"metrics": {}}
    assert _last_json("no json at all\n") is None
    crash = 'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: boom\n'
    assert _failure(crash, 1) == "the engine stopped with an error: RuntimeError: boom"
    assert _failure("Error: these tasks do not pass\n", 1) == "these tasks do not pass"
    assert "exit status -9" in _failure("", -9)
