"""Only the user who started `course lab` can use it (grader/lab/access.py): nobody else on the machine.

The server's routes are asked without the cookie, with it, with a wrong token and with another lab's
cookie, through Starlette's test client over a stand-in lab that records every run (a run is code
running). Then real labs, as the CLI starts them: the browser is opened on a one-time token of its own;
nothing the lab prints or logs carries a secret but its first line; and another local user (uid 65534
through setpriv), who knows the port and can read every process's command line, gets nothing usable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import closing
from http.cookies import SimpleCookie
from pathlib import Path

import httpx
import pytest
from conftest import missing, require_root
from starlette.testclient import TestClient

from grader.lab import access
from grader.lab.access import Session
from grader.lab.server import app
from tests.test_lab import Served, honest, raw, start_lab, stop_lab

PORT = 8765
ROUTES = ("/", "/static/lab.js", "/static/lab.css", "/static/index.html", "/fonts/sans-regular.woff2", "/api/experiments")
REFUSED = "open the URL that course lab printed in the terminal"
RUN = ("/api/run/ch25-paged-kv", b'{"params": {"T": 6}}')


class StandIn:
    """What the server asks of a `Lab`, with every run recorded: code runs only where `runs` grows."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, dict]] = []

    def describe(self) -> dict:
        return {"checked": True, "mode": "solutions", "target": "", "time_limit": 1.0, "chapters": []}

    def run(self, experiment: str, params: dict) -> dict:
        self.runs.append((experiment, params))
        return {"status": "passed", "message": "", "figures": [{"id": "ch25-dim-slot-mapping", "svg": "<svg/>"}]}


def client(session: Session, lab: StandIn | None = None) -> TestClient:
    """A client of `session`'s lab at 127.0.0.1:PORT that follows no redirect."""
    return TestClient(app(lab or StandIn(), session), base_url=f"http://127.0.0.1:{session.port}", follow_redirects=False)


def cookie_bought(c: TestClient, token: str) -> str:
    """Open `/?token=`: a 303 to the bare URL that sets the lab's cookie; its value (now in `c`'s jar)."""
    r = c.get(f"/?token={token}")
    assert r.status_code == 303 and r.headers["location"] == "/", (r.status_code, r.headers)
    (header,) = r.headers.get_list("set-cookie")
    return SimpleCookie(header)[f"course-lab-{c.base_url.port}"].value


def run(c: TestClient, path: str = RUN[0]):
    return c.post(path, content=RUN[1], headers=honest(str(c.base_url).rstrip("/")))


def test_without_the_cookie_no_route_answers_and_no_code_runs():
    session, lab = Session(PORT), StandIn()
    c = client(session, lab)
    for path in (*ROUTES, "/nowhere", "/static/../../pyproject.toml"):
        r = c.get(path)
        assert r.status_code == 403 and "set-cookie" not in r.headers, path
        assert session.token not in r.text and "token" not in r.text, path
        if path.startswith("/api/"):
            assert r.json()["status"] == "refused" and REFUSED in r.json()["message"], path
        else:
            assert r.headers["content-type"].startswith("text/html") and REFUSED in r.text, path
    r = run(c)
    assert r.status_code == 403 and r.json()["status"] == "refused" and lab.runs == []
    assert c.head("/").status_code == 403 and c.options(RUN[0]).status_code == 403


def test_the_printed_url_buys_the_cookie_and_redirects_to_the_bare_url():
    session, lab = Session(PORT), StandIn()
    assert session.url == f"http://127.0.0.1:{PORT}/?token={session.token}" and len(session.token) >= 40
    c = client(session, lab)
    r = c.get(f"/?token={session.token}")
    assert r.status_code == 303 and r.headers["location"] == "/" and "no-store" in r.headers["cache-control"]
    (header,) = r.headers.get_list("set-cookie")
    morsel = SimpleCookie(header)[f"course-lab-{PORT}"]
    assert morsel["httponly"] and morsel["samesite"].lower() == "strict" and morsel["path"] == "/", header
    assert not morsel["domain"] and not morsel["secure"], header  # this host only; plain http
    assert morsel.value != session.token and session.token not in header and session.token not in r.text
    for path in ROUTES:  # the cookie opens every route
        got = c.get(path)
        assert got.status_code == 200, path
        assert session.token not in got.text and morsel.value not in got.text, path
    page = c.get("/")
    assert "course lab" in page.text and "<script" in page.text and "course-token" not in page.text
    assert page.headers["x-frame-options"] == "DENY" and "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert run(c).json()["figures"] and lab.runs == [("ch25-paged-kv", {"T": 6})]
    assert c.get("/nowhere").status_code == 404  # past the door, the routes as before
    assert cookie_bought(client(session), session.token) == morsel.value  # the printed URL keeps working


def test_a_wrong_token_is_refused_even_beside_a_good_cookie():
    session, lab = Session(PORT), StandIn()
    c = client(session, lab)
    token = session.token
    for wrong in ("", "x", token[:-1], token + "x", token.swapcase(), Session(PORT).token, f"{token}&token={token}"):
        r = c.get(f"/?token={wrong}")
        assert r.status_code == 403 and "set-cookie" not in r.headers and token not in r.text, wrong
        assert run(c, f"{RUN[0]}?token={wrong}").status_code == 403, wrong
    cookie_bought(c, token)
    assert c.get("/?token=x").status_code == 403 and c.get("/").status_code == 200
    assert lab.runs == []


def test_another_lab_s_cookie_is_refused_and_two_labs_do_not_clash():
    ours, theirs, again = Session(PORT), Session(PORT + 1), Session(PORT)  # again: a lab started later at our port
    ours_c, theirs_c, again_c = client(ours), client(theirs), client(again)
    mine, other, later = cookie_bought(ours_c, ours.token), cookie_bought(theirs_c, theirs.token), cookie_bought(again_c, again.token)
    assert len({mine, other, later}) == 3
    lab = StandIn()
    for cookie in (
        f"course-lab-{PORT + 1}={other}",  # what a browser sends us from the other lab
        f"course-lab-{PORT}={other}",
        f"course-lab-{PORT}={later}",
        f"course-lab-{PORT + 1}={mine}",
        f"course-lab={mine}",
    ):
        c = client(ours, lab)
        for path in ROUTES:
            assert c.get(path, headers={"Cookie": cookie}).status_code == 403, (cookie, path)
        assert c.post(RUN[0], content=RUN[1], headers={**honest(f"http://127.0.0.1:{PORT}"), "Cookie": cookie}).status_code == 403
    assert lab.runs == []
    both = f"course-lab-{PORT + 1}={other}; course-lab-{PORT}={mine}"  # a browser that opened both labs
    assert client(ours).get("/", headers={"Cookie": both}).status_code == 200
    assert client(theirs).get("/", headers={"Cookie": both}).status_code == 200


def test_the_token_itself_opens_a_route_without_a_cookie():
    session, lab = Session(PORT), StandIn()
    c = client(session, lab)
    r = c.get(f"/api/experiments?token={session.token}")
    assert r.status_code == 200 and r.json()["checked"] and "set-cookie" not in r.headers
    assert run(c, f"{RUN[0]}?token={session.token}").status_code == 200 and len(lab.runs) == 1
    assert c.get("/api/experiments").status_code == 403  # and no cookie was left behind


def test_the_browser_s_token_works_once_and_not_for_long(monkeypatch):
    session = Session(PORT)
    url = session.browser_url()
    once = url.split("?token=")[1]
    assert url.startswith(f"http://127.0.0.1:{PORT}/?token=") and once != session.token
    cookie = cookie_bought(client(session), once)
    assert client(session).get(f"/?token={once}").status_code == 403  # spent
    assert cookie_bought(client(session), session.token) == cookie  # the same cookie as the printed URL's
    monkeypatch.setattr(access, "BROWSER_TOKEN_TTL", -1.0)
    late = session.browser_url().split("?token=")[1]
    assert client(session).get(f"/?token={late}").status_code == 403  # a browser that never came


# -- real labs, as the CLI starts them --------------------------------------------------------------------------

FAKE_BROWSER = """#!{python} -I
# A browser: opens the URL it was given (spending its token, keeping the cookie), then stays open with the
# URL on its command line, as a browser does, until the test says stop.
import http.client, pathlib, sys, time, urllib.parse
here, url = pathlib.Path(__file__).parent, urllib.parse.urlsplit(sys.argv[1])
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
conn.request("GET", url.path + "?" + url.query)
got = conn.getresponse()
(here / "opened").write_text(f"{{got.status}} {{got.getheader('set-cookie') or ''}}\\n{{sys.argv[1]}}")
while not (here / "stop").exists():
    time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def opened(tmp_path_factory):
    """A `course lab --solutions` whose browser is `FAKE_BROWSER`, open (and still running) once the lab is up:
    the lab, and what the browser got ("STATUS SET-COOKIE" then its URL)."""
    folder = tmp_path_factory.mktemp("browser")
    browser = folder / "fake-browser"
    browser.write_text(FAKE_BROWSER.format(python=sys.executable), encoding="utf-8")
    browser.chmod(0o700)
    proc, url = start_lab("--solutions", "--time-limit", "5", env=dict(os.environ, BROWSER=str(browser)))
    served = Served(proc, url)
    try:
        deadline = time.monotonic() + 60
        while not (folder / "opened").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "the lab opened no browser"
            time.sleep(0.1)
        yield served, (folder / "opened").read_text(encoding="utf-8")
    finally:
        (folder / "stop").touch()
        time.sleep(0.3)  # the lab's opener waits for its browser
        stop_lab(proc)


@pytest.mark.slow
def test_the_lab_opens_the_browser_on_a_token_of_its_own_that_works_once(opened):
    served, got = opened
    head, url = got.split("\n")
    assert url.startswith(f"{served.base}/?token=") and served.token not in url, (url, served.url)
    assert head.startswith("303 ") and f"course-lab-{served.port}=" in head and "HttpOnly" in head, head
    again = httpx.get(url)
    assert again.status_code == 403 and "set-cookie" not in again.headers, "the browser's token works twice"
    with closing(served.owner()) as owner:  # the printed URL still opens the lab
        assert owner.get("/").status_code == 200


NEIGHBOUR = r"""
import http.client, json, os, re, sys
port = int(sys.argv[1])
found = set()  # every token= this user can read on any process's command line or environment
for pid in filter(str.isdigit, os.listdir("/proc")):
    for what in ("cmdline", "environ"):
        try:
            with open("/proc/%s/%s" % (pid, what), "rb") as f:
                found.update(t.decode() for t in re.findall(rb"token=([\w-]+)", f.read()))
        except OSError:
            pass
tries = []
def ask(method, path, host, headers=(), body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=body, headers=dict(headers, Host=host))
    r = conn.getresponse()
    tries.append({"ask": "%s %s (Host %s)" % (method, path, host), "status": r.status,
                  "set_cookie": r.getheader("set-cookie"), "body": r.read(1 << 16).decode("utf-8", "replace")})
paths = ["/", "/static/lab.js", "/static/index.html", "/static/lab.css", "/fonts/sans-regular.woff2",
         "/api/experiments", "/?token=", "/?token=guess"] + ["/?token=" + t for t in sorted(found)]
for host in ("127.0.0.1:%d" % port, "localhost:%d" % port):
    run = {"Origin": "http://" + host, "Content-Type": "application/json"}
    for path in paths:
        ask("GET", path, host)
    for path in ["/api/run/ch25-paged-kv"] + ["/api/run/ch25-paged-kv?token=" + t for t in sorted(found)]:
        ask("POST", path, host, run, b'{"params": {"T": 6}}')
    ask("GET", "/", host, {"Cookie": "course-lab-%d=guess" % port})
print(json.dumps({"uid": os.getuid(), "found": sorted(found), "tries": tries}))
"""


@pytest.mark.slow
def test_another_local_user_who_knows_the_port_gets_nothing_usable(opened):
    """uid 65534, through setpriv, with the system's Python: it reads every command line it can (the
    browser's among them), then asks every route with every token it found, as 127.0.0.1 and localhost."""
    require_root("another local user")
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if not python:
        missing("another local user: needs a system python3 that uid 65534 can run")
    served, got = opened
    browser_token = got.split("\n")[1].split("?token=")[1]
    cookie = served.cookie()
    argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs", "--"]
    proc = subprocess.run(
        [*argv, python, "-I", "-S", "-c", NEIGHBOUR, str(served.port)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["uid"] == 65534 and len(out["tries"]) >= 20
    if "hidepid" not in Path("/proc/self/mountinfo").read_text():
        assert browser_token in out["found"], "the neighbour should see the browser's command line (and its spent token)"
    assert served.token not in out["found"]
    for t in out["tries"]:
        assert t["status"] == 403 and t["set_cookie"] is None, t
        assert REFUSED in t["body"] and served.token not in t["body"] and cookie not in t["body"], t
    with closing(served.owner()) as owner:  # the owner's lab is untouched
        r = owner.post(RUN[0], content=RUN[1], headers=honest(served.base))
        assert r.status_code == 200 and r.json()["status"] == "passed"


@pytest.mark.slow
def test_nothing_the_lab_prints_or_logs_holds_a_secret_but_its_first_line():
    proc, url = start_lab("--solutions", "--time-limit", "5")
    served = Served(proc, url)
    try:
        cookie = served.cookie()
        with closing(served.owner()) as owner:
            assert owner.post(RUN[0], content=RUN[1], headers=honest(served.base)).json()["status"] == "passed"
            assert owner.get(f"/?token={served.token}x").status_code == 403
            assert owner.get(f"/api/run/x?token={served.token}").status_code == 405
        assert httpx.get(f"{served.base}/?token={served.token}", headers={"Host": "evil.example"}).status_code == 403
        # Connection: close: the answer ends the exchange, not the server's keep-alive timeout (5 s, the socket's own)
        brew = f"BREW /?token={served.token} HTTP/1.1\nHost: 127.0.0.1:{served.port}\nConnection: close\n"
        assert raw(served.port, brew).startswith(b"HTTP/1.1 ")
        assert raw(served.port, f"GET /?token={served.token} HTTP/9\nHost: x\n").startswith(b"HTTP/1.1 400")
        upgrade = "Upgrade: websocket\nConnection: Upgrade\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\nSec-WebSocket-Version: 13"
        for path in ("/", f"/?token={served.token}"):  # the lab speaks no WebSocket, to anybody
            assert raw(served.port, f"GET {path} HTTP/1.1\nHost: 127.0.0.1:{served.port}\n{upgrade}\n").startswith(b"HTTP/1.1 403 ")
    finally:
        out = stop_lab(proc)
    assert served.token not in out and cookie not in out and "Traceback" not in out, out
