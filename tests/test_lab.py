"""`course lab` without a browser: bounds, every experiment on the reference, wrong and hanging students,
newer requests replacing older ones, edits picked up, the server's routes and defences, and the student release."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from contextlib import closing
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from grader import chapters
from grader.cli import main
from grader.lab import Float, Int, Numbers, ParamError, catalog
from grader.lab.access import Session
from grader.lab.runner import Lab
from grader.lab.server import MAX_BODY, app, bind
from tests.mutate import mutant, row

pytestmark = pytest.mark.slow  # grades submissions, builds releases or runs real tools: not in the fast loop

EXPERIMENTS = list(catalog().experiments.values())
HANG = ("    return weight[ids.long()]", "    while ids.numel() > 3:\n        pass\n    return weight[ids.long()]")
WRONG_SLOTS = ("    return table[logical] * block_size + pos % block_size", "    return logical * block_size + pos % block_size")


@pytest.fixture(scope="module")
def reference_lab():
    lab = Lab(solutions=True, time_limit=5)
    yield lab
    lab.close()


@pytest.fixture(scope="module")
def student_lab(tmp_path_factory):
    folder = tmp_path_factory.mktemp("student")
    mutant(folder, "ch15", HANG)
    mutant(folder, "ch25", WRONG_SLOTS)
    lab = Lab(submission=folder, time_limit=1)
    yield lab
    lab.close()


def cells(svg: str, cls: str) -> list[ET.Element]:
    return [e for e in ET.fromstring(svg).iter() if cls in (e.get("class") or "").split()]


def values(svg: str) -> list[str]:
    return ["".join(e.itertext()) for e in cells(svg, "value")]


def random_instance(exp, rng: random.Random) -> dict:
    raw = {}
    for p in exp.params:
        if isinstance(p, Int):
            raw[p.name] = rng.randint(p.low, p.high)
        elif isinstance(p, Float):
            raw[p.name] = round(rng.uniform(p.low, p.high), 2)
        elif isinstance(p, Numbers):
            n = rng.randint(p.min_len, p.max_len)
            raw[p.name] = ", ".join(
                str(rng.randint(int(p.low), int(p.high))) if p.integer else f"{rng.uniform(p.low, p.high):.2f}" for _ in range(n)
            )
        else:
            raw[p.name] = rng.random() < 0.5
    return raw


def test_every_chapter_lab_module_defines_experiments_that_draw_catalog_figures():
    import figures

    assert {"ch15-embedding", "ch16-heads", "ch26-varlen", "ch25-paged-kv"} <= {e.id for e in EXPERIMENTS}
    for exp in EXPERIMENTS:
        known = {s.id for s in figures.catalog(exp.chapter)}
        assert set(exp.figures) <= known, exp.id
        ch = chapters.find(exp.chapter)
        assert set(exp.calls) <= {n for t in ch.tasks for n in t.names}, exp.id


@pytest.mark.parametrize("exp", EXPERIMENTS, ids=[e.id for e in EXPERIMENTS])
def test_the_reference_passes_and_draws_at_the_defaults_and_at_random_instances(exp, reference_lab):
    rng, drawn = random.Random(exp.id), 0
    instances = [{}] + [random_instance(exp, rng) for _ in range(400)]
    for raw in instances:
        try:
            exp.parse(raw)
        except ParamError:
            continue
        result = reference_lab.run(exp.id, raw)
        assert result["status"] == "passed", (raw, result["message"], result.get("notes"))
        assert [f["id"] for f in result["figures"]] == list(exp.figures), (raw, result["notes"])
        for f in result["figures"]:
            root = ET.fromstring(f["svg"])
            assert int(root.get("width")) <= 1400 and not cells(f["svg"], "wrong")
        drawn += 1
        if drawn == 6:
            break
    assert drawn >= 4, f"{exp.id}: the bounds admit too few drawable instances"


@pytest.fixture(scope="module")
def answerless_lab():
    """The reference's code with no expected values at all: what a student release has off its recorded instances."""
    lab = Lab(solutions=True, time_limit=5, reference=lambda exp: None)
    yield lab
    lab.close()


@pytest.mark.parametrize("exp", EXPERIMENTS, ids=[e.id for e in EXPERIMENTS])
def test_the_rules_that_need_no_answer_hold_for_the_reference_and_its_figures_say_they_were_not_compared(exp, answerless_lab):
    rng, drawn = random.Random(exp.id + " rules"), 0
    for raw in [{}] + [random_instance(exp, rng) for _ in range(400)]:
        try:
            exp.parse(raw)
        except ParamError:
            continue
        result = answerless_lab.run(exp.id, raw)
        assert result["status"] in ("passed", "unchecked"), (raw, result["message"])
        assert (result["status"] == "passed") is result["compared"]
        for f in result["figures"]:
            assert not cells(f["svg"], "wrong")
        if not result["compared"]:
            assert any(cells(f["svg"], "unchecked") for f in result["figures"]), raw
        drawn += 1
        if drawn == 4:
            break
    assert drawn == 4


@pytest.mark.parametrize(
    "chapter, mistake_id, experiment",
    [
        ("ch15", "reshape", "ch15-embedding"),
        ("ch16", "reshape_no_transpose", "ch16-heads"),
        ("ch17", "topleft", "ch17-masks"),
        ("ch18", "interleaved", "ch18-groups"),
    ],
)
def test_without_an_answer_a_common_mistake_breaks_a_rule_and_nothing_is_marked(tmp_path, chapter, mistake_id, experiment):
    folder = mutant(tmp_path, chapter, *row(chapter, mistake_id).edits)
    lab = Lab(submission=folder, time_limit=5, reference=lambda exp: None)
    try:
        result = lab.run(experiment, {})
    finally:
        lab.close()
    assert result["status"] == "failed", result["message"]
    assert "hint: " in result["message"], result["message"]
    if not result["compared"]:  # ch16's numbered instance knows its answer: there the cells are marked
        assert result["figures"] and all(cells(f["svg"], "unchecked") and not cells(f["svg"], "wrong") for f in result["figures"])


def test_an_instance_changes_the_drawing(reference_lab):
    result = reference_lab.run("ch15-embedding", {"V": "7", "H": "3", "ids": "6, 1"})
    (fig,) = result["figures"]
    assert "ids = [6, 1]" in fig["svg"] and "X[1, 2, 3]" in fig["svg"]
    assert {"71", "72", "73", "21", "22", "23"} <= set(values(fig["svg"]))
    slots = reference_lab.run("ch25-paged-kv", {"T": 3, "block_size": 1, "block_table": "4, 2, 0", "num_blocks": 5})
    assert slots["status"] == "passed" and "block_size = 1" in slots["figures"][0]["svg"]


def test_out_of_bounds_instances_are_refused_with_the_reason(reference_lab):
    r = reference_lab.run("ch25-paged-kv", {"T": "60"})
    assert r["status"] == "invalid" and "between 1 and 10" in r["errors"]["T"]
    r = reference_lab.run("ch25-paged-kv", {"T": 7, "block_table": "3, 0, 4"})
    assert "need 4 blocks" in r["errors"]["block_table"]
    r = reference_lab.run("ch15-embedding", {"ids": "2, x"})
    assert "is not a whole number" in r["errors"]["ids"]
    r = reference_lab.run("ch15-embedding", {"V": 4, "ids": "5"})
    assert "not a row of E" in r["errors"]["ids"]
    r = reference_lab.run("ch18-groups", {"num_heads": 5, "num_kv_heads": 2})
    assert "must divide" in r["errors"]["num_kv_heads"]
    assert reference_lab.run("ch99-nothing", {})["status"] == "invalid"
    assert reference_lab.run("ch25-paged-kv", {"nonsense": 1})["status"] == "invalid"


def test_a_wrong_function_shows_the_teaching_message_and_marked_cells(student_lab):
    r = student_lab.run("ch25-paged-kv", {})
    assert r["status"] == "failed"
    assert "block_table[0] = 3, so its slot is 3·2 + 0 = 6; yours: 0" in r["message"]
    assert "hint: the slot uses the physical block from the table" in r["message"]
    (fig,) = r["figures"]
    assert len(cells(fig["svg"], "wrong")) >= 3


def test_a_hang_times_out_and_the_experiment_recovers(student_lab):
    t0 = time.monotonic()
    r = student_lab.run("ch15-embedding", {"ids": "1, 2, 3, 4", "V": 8})
    assert r["status"] == "timeout" and "did not finish within 1 s" in r["message"]
    assert time.monotonic() - t0 < 5
    r = student_lab.run("ch15-embedding", {"ids": "1, 2"})
    assert r["status"] == "passed" and r["figures"]


def test_a_newer_request_replaces_a_hanging_one_at_once(student_lab):
    results = {}

    def request(name: str, ids: str) -> None:
        results[name] = (student_lab.run("ch15-embedding", {"ids": ids, "V": 8}), time.monotonic())

    older = threading.Thread(target=request, args=("older", "1, 2, 3, 4"))
    t0 = time.monotonic()
    older.start()
    time.sleep(0.3)  # the older one is now spinning in the student's process
    request("newer", "0, 1")
    older.join()
    assert results["older"][0]["status"] == "superseded"
    assert results["newer"][0]["status"] == "passed"
    assert results["newer"][1] - t0 < 0.95, "the newer request did not wait for the older one's time limit"


def test_other_experiments_answer_while_one_hangs(student_lab):
    hang = threading.Thread(target=student_lab.run, args=("ch15-embedding", {"ids": "1, 2, 3, 4", "V": 8}))
    hang.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    r = student_lab.run("ch25-paged-kv", {})
    assert r["status"] == "failed" and time.monotonic() - t0 < 0.9
    hang.join()


def test_an_edited_file_is_loaded_again(tmp_path):
    folder = tmp_path / "sub"
    folder.mkdir()
    ch = chapters.find("ch25")
    shutil.copy(chapters.SOLUTIONS / ch.filename, folder / ch.filename)
    lab = Lab(submission=folder, time_limit=2)
    try:
        assert lab.run("ch25-paged-kv", {})["status"] == "passed"
        mutant(folder, "ch25", WRONG_SLOTS)
        assert lab.run("ch25-paged-kv", {})["status"] == "failed"
        (folder / ch.filename).write_text("def slot_mapping(:\n", encoding="utf-8")
        broken = lab.run("ch25-paged-kv", {})
        assert broken["status"] == "error" and "SyntaxError" in broken["message"]
    finally:
        lab.close()


def start_lab(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """`course lab --no-open ARGS` as the CLI starts it (`env`: its environment); the process and the URL it
    printed, which carries the session's token."""
    argv = [sys.executable, "-m", "grader.cli", "lab", *(() if env and "BROWSER" in env else ("--no-open",)), *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    line = proc.stdout.readline()
    if not line.startswith("course lab: http://127.0.0.1:"):  # a lab that printed something else runs on: stop it first
        proc.kill()
        pytest.fail(f"course lab printed {line!r} first, then:\n{proc.communicate(timeout=15)[0]}")
    url = line.split()[2]
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[\w-]{40,}", url), line
    return proc, url


def stop_lab(proc: subprocess.Popen) -> str:
    """Ctrl-C to a lab of `start_lab`: it stops cleanly; everything it printed after its first line."""
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0 and "course lab stopped" in out, out
    return out


@dataclass
class Served:
    """A running `course lab` and the URL it printed on its terminal (with the session's token)."""

    proc: subprocess.Popen
    url: str

    @property
    def port(self) -> int:
        return int(urlsplit(self.url).port or 0)

    @property
    def token(self) -> str:
        return parse_qs(urlsplit(self.url).query)["token"][0]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def owner(self, host: str = "127.0.0.1") -> httpx.Client:
        """A client that opened the printed URL at `host`: it holds the lab's cookie, as its owner's browser does."""
        client = httpx.Client(base_url=f"http://{host}:{self.port}", timeout=30)
        opened = client.get(f"/?token={self.token}")
        assert opened.status_code == 303 and opened.headers["location"] == "/", opened
        assert f"course-lab-{self.port}" in client.cookies, opened.headers
        return client

    def cookie(self) -> str:
        """The value of the cookie the printed URL buys."""
        return self.owner().cookies[f"course-lab-{self.port}"]


@pytest.fixture(scope="module")
def served():
    """A `course lab --solutions` server."""
    proc, url = start_lab("--solutions", "--time-limit", "5")
    yield Served(proc, url)
    stop_lab(proc)


def honest(origin: str) -> dict[str, str]:
    """The headers the page's own script sends with a run (its cookie goes by itself): JSON and its Origin."""
    return {"Content-Type": "application/json", "Origin": origin}


def raw(port: int, head: str, first: bytes = b"", *more: bytes) -> bytes:
    """Send a request head with the `first` bytes of its body, then `more`, one write each, over a socket;
    what the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + first)
        for data in more:
            sock.sendall(data)
        answer = b""
        while data := sock.recv(1 << 16):
            answer += data
    return answer


def test_the_server_serves_its_page_and_nothing_outside_the_package(reference_lab):
    session = Session(8765)
    client = TestClient(app(reference_lab, session), base_url="http://127.0.0.1:8765")
    page = client.get(session.url).text  # redirected to the bare URL, with the cookie
    assert "course lab" in page
    assert client.get("/static/lab.js").status_code == 200
    for path in (
        "/static/../../pyproject.toml",
        "/static/%2e%2e/%2e%2e/pyproject.toml",
        "/static/../runner.py",
        "/pyproject.toml",
        "/static//etc/passwd",
    ):
        assert client.get(path).status_code == 404, path
    css = client.get("/static/lab.css").text
    for font in re.findall(r'url\("(/fonts/[^"]+)"\)', css) or ["lab.css names no font"]:
        got = client.get(font)
        assert got.status_code == 200 and got.content[:4] == b"wOF2", f"{font}: the page draws with the shipped fonts"
    for path in ("/fonts/build.py", "/fonts/OFL.txt", "/fonts/..%2f..%2fpyproject.toml", "/fonts/x.woff2"):
        assert client.get(path).status_code == 404, path
    info = client.get("/api/experiments").json()
    assert info["checked"] and {c["id"] for c in info["chapters"]} >= {"ch15", "ch16", "ch25", "ch26"}
    headers = honest("http://127.0.0.1:8765")
    for body in (b"not json", b"[1]", b'{"params": 3}'):
        assert client.post("/api/run/ch25-paged-kv", content=body, headers=headers).status_code == 400, body
    run = client.post("/api/run/ch25-paged-kv", json={"params": {"T": 6}}, headers=headers)
    assert run.json()["status"] == "passed"
    assert TestClient(app(reference_lab, session)).get(f"/?token={session.token}").status_code == 403  # Host: testserver
    sock = bind(0)
    assert sock.getsockname()[0] == "127.0.0.1"
    sock.close()


def test_the_server_answers_only_for_its_own_host_and_port(served):
    port, cookie = served.port, {f"course-lab-{served.port}": served.cookie()}
    for host in (
        f"evil.example:{port}",
        "evil.example",
        f"127.0.0.1:{port + 1}",
        "localhost",
        f"127.0.0.1.evil.example:{port}",
        f"[::1]:{port}",
    ):
        for path in ("/", "/api/experiments", "/static/lab.js", f"/?token={served.token}"):
            r = httpx.get(served.base + path, headers={"Host": host}, cookies=cookie)
            assert r.status_code == 403 and "forbidden" in r.text and "token" not in r.text, (host, path)
            assert "set-cookie" not in r.headers, (host, path)
        r = httpx.post(served.base + "/api/run/ch25-paged-kv", headers={"Host": host}, json={}, cookies=cookie)
        assert r.status_code == 403 and "forbidden" in r.text, host
    assert raw(port, "GET / HTTP/1.0\n").startswith(b"HTTP/1.1 403 ")  # no Host at all
    for host in ("127.0.0.1", "localhost"):
        with closing(served.owner(host)) as client:
            page = client.get("/")
            assert page.status_code == 200 and "course lab" in page.text
            assert client.get("/static/lab.js").status_code == 200
            assert client.get("/api/experiments").json()["checked"]
            r = client.post("/api/run/ch15-embedding", json={"params": {"ids": "2, 0"}}, headers=honest(f"http://{host}:{port}"))
            assert r.status_code == 200 and r.json()["status"] == "passed"


def refused(served: Served, status: int, *changes: dict[str, str | None]) -> None:
    """The page's own run passes; with each of `changes` to its headers (None: left out) it is refused."""
    with closing(served.owner()) as client:
        url, good, body = "/api/run/ch25-paged-kv", honest(served.base), b'{"params": {"T": 6}}'
        assert client.post(url, content=body, headers=good).json()["status"] == "passed"
        for change in changes:
            headers = {k: v for k, v in {**good, **change}.items() if v is not None}
            if "Cookie" in change:
                client.cookies.clear()
            r = client.post(url, content=body, headers=headers)
            assert r.status_code == status, change
            assert r.json()["status"] in ("invalid", "refused") and r.json()["errors"] == {} and r.json()["message"], change


def test_a_run_must_be_sent_as_json(served):
    refused(
        served,
        415,
        {"Content-Type": "text/plain"},
        {"Content-Type": "application/x-www-form-urlencoded"},
        {"Content-Type": "multipart/form-data; boundary=x"},
        {"Content-Type": ""},
        {"Content-Type": None},
    )


def test_a_run_must_come_from_the_page_s_own_origin(served):
    refused(
        served,
        403,
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": None},
        {"Origin": f"http://127.0.0.1:{served.port + 1}"},
        {"Origin": f"https://127.0.0.1:{served.port}"},
    )


def test_a_run_must_carry_the_lab_s_cookie(served):
    name, cookie = f"course-lab-{served.port}", served.cookie()
    refused(
        served,
        403,
        {"Cookie": None},
        {"Cookie": ""},
        {"Cookie": f"{name}="},
        {"Cookie": f"{name}=not-the-cookie"},
        {"Cookie": f"{name}={cookie[:-1]}"},
        {"Cookie": f"{name}={cookie}x"},
        {"Cookie": f"course-lab-{served.port + 1}={cookie}"},  # its value, under another lab's name
        {"Cookie": f"{name}={served.token}"},  # the token is not the cookie
    )


def test_a_refusal_reaches_a_client_whose_body_was_not_wanted(served):
    """A request refused for its missing cookie, with a body (a page of a lab that restarted): the client reads the
    whole 403 and its message, never a reset (a socket closed with unread data resets the connection)."""
    body = json.dumps({"params": {"T": 6}, "pad": "x" * (48 << 10)}).encode()
    head = (
        f"POST /api/run/ch25-paged-kv HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\nOrigin: http://127.0.0.1:{served.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", served.port), timeout=30) as s:
            s.sendall(head)
            time.sleep(0.3)  # the body comes later, as from a loaded client: a server that closed at once resets it
            s.sendall(body)
            reply = b""
            while chunk := s.recv(65536):  # a reset raises here
                reply += chunk
        status, _, rest = reply.partition(b"\r\n")
        assert status == b"HTTP/1.1 403 Forbidden" and b'"status":"refused"' in rest, reply[:300]


def run_head(served: Served, *lines: str) -> str:
    """The head of a POST /api/run the page could send, with the lab's cookie, and `lines` of its own."""
    return "\n".join(
        [
            "POST /api/run/ch25-paged-kv HTTP/1.1",
            f"Host: 127.0.0.1:{served.port}",
            f"Origin: http://127.0.0.1:{served.port}",
            "Content-Type: application/json",
            f"Cookie: course-lab-{served.port}={served.cookie()}",
            *lines,
            "",
        ]
    )


def test_a_body_announced_over_the_cap_is_refused_before_it_is_read(served):
    # 300 MiB announced, 10 bytes sent: the 413 comes at once (reading the body first would wait for the rest).
    answer = raw(served.port, run_head(served, f"Content-Length: {300 << 20}"), b'{"params":')
    assert answer.startswith(b"HTTP/1.1 413 ") and b'"status":"invalid"' in answer and b"too large" in answer


def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_cap(served):
    chunk = b"%x\r\n%s\r\n" % (16 << 10, b" " * (16 << 10))
    head = run_head(served, "Transfer-Encoding: chunked")
    # MAX_BODY bytes, then one more: the 413 comes though the body has not ended (its last chunk is never sent).
    answer = raw(served.port, head, chunk * (MAX_BODY // (16 << 10)), b"1\r\n \r\n")
    assert answer.startswith(b"HTTP/1.1 413 ") and b'"status":"invalid"' in answer and b"too large" in answer
    # A chunked body under the cap is read and run.
    answer = raw(
        served.port,
        run_head(served, "Transfer-Encoding: chunked", "Connection: close"),
        b'6\r\n{"para\r\n',
        b'e\r\nms": {"T": 6}}\r\n',
        b"0\r\n\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"status":"passed"' in answer


def test_the_command_line():
    runner = CliRunner()
    out = runner.invoke(main, ["lab", "--help"])
    assert out.exit_code == 0 and "--no-open" in out.output and "--port" in out.output
    out = runner.invoke(main, ["lab", "--solutions", "--submission", "."])
    assert out.exit_code == 2 and "exclude each other" in out.output


RELEASE_LAB = """
import json, sys
from grader.lab.runner import Lab
lab = Lab(time_limit=5)
try:
    out = {"checked": lab.describe()["checked"], "ids": sorted(lab.catalog.experiments)}
    for name, (exp, params) in json.loads(sys.argv[1]).items():
        r = lab.run(exp, params)
        svgs = [f["svg"] for f in r.get("figures", [])]
        out[name] = {"status": r["status"], "compared": r.get("compared"), "message": r["message"], "svgs": svgs}
    print(json.dumps(out))
finally:
    lab.close()
"""


def release_lab(student, runs: dict) -> dict:
    """Run the lab of a student release on `runs` ({name: (experiment, instance)}) in a process of the release's own."""
    env = dict(os.environ, PYTHONPATH=str(student))
    proc = subprocess.run(
        [sys.executable, "-c", RELEASE_LAB, __import__("json").dumps(runs)],
        cwd=student,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    return __import__("json").loads(proc.stdout)


def text(svg: str) -> str:
    return " ".join("".join(e.itertext()) for e in ET.fromstring(svg).iter() if e.tag.endswith("text"))


def test_the_lab_in_a_student_release_marks_against_recorded_answers_and_vouches_for_nothing_else(tmp_path):
    from grader.delivery.release import build

    built = build(tmp_path / "rel", chapter_list=[chapters.find(c) for c in ("ch17", "ch25", "ch26")], nbgrader=False)
    student = built.student
    assert (student / "grader" / "lab" / "static" / "lab.js").is_file()
    assert not (student / "grader" / "lab" / "ch15.py").exists()
    for cid in ("ch25", "ch26"):
        ch = chapters.find(cid)
        shutil.copy(chapters.SOLUTIONS / ch.filename, student / "exercises" / ch.filename)
    mutant(student / "exercises", "ch17", *row("ch17", "topleft").edits)  # a chunk's mask taken from the top-left
    runs = {
        "masks": ("ch17-masks", {}),
        "masks elsewhere": ("ch17-masks", {"num_cached": 4, "num_new": 3}),
        "paged": ("ch25-paged-kv", {}),
        "paged elsewhere": ("ch25-paged-kv", {"T": 4, "block_table": "1, 3"}),
        "varlen": ("ch26-varlen", {}),
    }
    out = release_lab(student, runs)
    assert out["checked"] is False and out["ids"] == ["ch17-masks", "ch25-paged-kv", "ch26-varlen"]

    # The starting instance: its answers ship with the release, so the wrong mask is marked and explained.
    masks = out["masks"]
    assert masks["status"] == "failed" and masks["compared"] is True, masks
    assert "hint: a chunk after a cached prefix is offset by num_cached" in masks["message"], masks["message"]
    offset = next(svg for svg in masks["svgs"] if 'id="ch17-offset-mask"' in svg)
    assert cells(offset, "wrong") and "your [2, 5] mask" not in text(offset) and "the [2, 5] mask it needs" in text(offset)
    # Elsewhere no answer ships: the rules that need none explain the mask; nothing is marked, nothing vouched for.
    elsewhere = out["masks elsewhere"]
    assert elsewhere["status"] == "failed" and elsewhere["compared"] is False, elsewhere
    assert "query 0 is the token at absolute position 4 + 0 = 4, so it sees keys 0–4" in elsewhere["message"]
    assert "hint: a chunk after a cached prefix is offset by num_cached" in elsewhere["message"]
    offset = next(svg for svg in elsewhere["svgs"] if 'id="ch17-offset-mask"' in svg)
    assert not cells(offset, "wrong") and cells(offset, "unchecked") and "your [3, 7] mask" not in text(offset)

    for name in ("paged", "varlen"):  # a right answer at the starting instance: compared, and it matches
        assert out[name]["status"] == "passed" and out[name]["compared"] is True, (name, out[name])
        assert out[name]["svgs"] and not any(cells(svg, "wrong") or cells(svg, "unchecked") for svg in out[name]["svgs"])
    paged = out["paged elsewhere"]
    assert paged["status"] == "unchecked" and paged["compared"] is False, paged
    assert all(cells(svg, "unchecked") and not cells(svg, "wrong") for svg in paged["svgs"])
    assert "the slot each token belongs in" not in text(paged["svgs"][0])

    # A wrong cu_seqlens is explained at any instance: running sums need no answer.
    mutant(student / "exercises", "ch26", ("    cu_seqlens[1:] = lens.cumsum(0)", "    cu_seqlens[1:] = lens"))
    wrong = release_lab(student, {"varlen": ("ch26-varlen", {"query_lens": "2, 2, 1", "cached_lens": "0, 4, 0"})})["varlen"]
    assert wrong["status"] == "failed" and "hint: cu_seqlens are cumulative" in wrong["message"], wrong["message"]
    # And a wrong slot, by the rule that a slot is its physical block times block_size plus the offset.
    mutant(student / "exercises", "ch25", WRONG_SLOTS)
    wrong = release_lab(student, {"paged": ("ch25-paged-kv", {"T": 4, "block_table": "1, 3"})})["paged"]
    assert (
        wrong["status"] == "failed"
        and wrong["compared"] is False
        and "block_table[0] = 1, so its slot lies in physical block 1" in wrong["message"]
    ), wrong["message"]
