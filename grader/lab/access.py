"""Who may use `course lab`: the user who started it, and nobody else on the machine.

127.0.0.1 is shared by every account of a machine (a university lab, a JupyterHub node): that a request
comes from there says nothing about whose it is. So, as Jupyter does, the lab makes a secret token when
it starts and prints it, in the lab's URL, on the terminal, which only the user who started it sees. The
first request for the page that presents it (`/?token=…`) exchanges it for a cookie and is redirected to
the bare URL, so the token leaves the address bar. The cookie is `HttpOnly` (the page's script never
sees it), `SameSite=Strict` (no page of another site sends it; pages at other ports of 127.0.0.1 count as
this site, and the server's Origin and JSON checks stop their runs), `Path=/`, and named after the port:
a browser sends 127.0.0.1's cookies to every port, so a second lab reads only its own. Its value is
a second secret, not the token. Every request (the page, its static files and fonts, the API, the figures
it returns) must carry that cookie, or the token itself in `?token=`; anything else gets 403 and a short
page saying to open the URL printed in the terminal. Nothing served, no refusal and no log line carries
the token or the cookie's value; both are compared in constant time.

Opening a browser puts its URL on a command line, which other users can read (`ps`) for as long as that
browser runs: the browser is given a URL with a token of its own that works once (`Session.browser_url`),
within `BROWSER_TOKEN_TTL` seconds, not the printed one.

`OnlyHosts` comes first: a request whose Host is not 127.0.0.1:PORT or localhost:PORT gets 403 before
any secret is looked at (a DNS-rebinding page names its own host).

What this does not defend: a user who can read this user's terminal, files or memory (root, or the same
account); a user who reads the browser's command line and uses its token before the browser does (a race
the browser, which asks at once, usually wins; then the owner's browser gets the 403 page; `--no-open`
puts no token on any command line); and the cookie goes, like every 127.0.0.1 cookie, to whatever
listens at another port of 127.0.0.1 when this browser opens a URL there itself (typed, or clicked
outside any web page).
"""

from __future__ import annotations

import hmac
import html
import secrets
import time
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from grader.i18n import language, mark, tr

HOST = "127.0.0.1"
BROWSER_TOKEN_TTL = 120.0
"""Seconds a browser's one-time token stays good: long enough for a browser to start, short enough that a
token left on the command line of a browser that never used it is soon worth nothing."""
REFUSED = mark("course lab: open the URL that course lab printed in the terminal where it was started (it carries this session's key)")


def refusal_page() -> str:
    """The page a refused browser gets, in the run's language."""
    lang = "zh-Hans" if language() == "zh" else "en"
    return f"""<!doctype html>
<html lang="{lang}"><head><meta charset="utf-8"><title>course lab · 403</title></head>
<body><h1>course lab · 403</h1><p>{html.escape(tr(REFUSED))}</p></body></html>
"""


CLOSE = {"Connection": "close", "Cache-Control": "no-store"}  # a refused request's body is read and dropped (`drain`)
DRAIN = 64 << 10
"""The most of a refused request's body read (and dropped) before the refusal is sent."""


async def drain(receive: Receive, limit: int = DRAIN) -> None:
    """Read and drop a refused request's body, up to `limit` bytes. A socket closed with data it never read sends
    a reset, which can overtake the refusal: the client then sees a broken connection, not the 403 and its
    message (measured: now and then, on a loaded machine). A larger body is left unread: no honest page sends one."""
    seen = 0
    while seen <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def same(presented: str, secret: str) -> bool:
    """Whether `presented` is `secret`, compared in constant time (any text: it comes from the request)."""
    return hmac.compare_digest(presented.encode("utf-8", "replace"), secret.encode())


class Session:
    """The secrets of one lab at one port: the printed token, the cookie it buys, the browser's one-time tokens."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.token = secrets.token_urlsafe(32)
        self.cookie_name = f"course-lab-{port}"
        self.hosts = {f"{HOST}:{port}", f"localhost:{port}"}
        self._cookie = secrets.token_urlsafe(32)
        self._once: dict[str, float] = {}  # one-time token -> when it stops being good

    @property
    def url(self) -> str:
        """The URL to print on the terminal: the bare URL with the session's token."""
        return f"http://{HOST}:{self.port}/?token={self.token}"

    def browser_url(self) -> str:
        """A URL for a browser's command line: a new token, good once and for `BROWSER_TOKEN_TTL` seconds."""
        once = secrets.token_urlsafe(32)
        self._once[once] = time.monotonic() + BROWSER_TOKEN_TTL
        return f"http://{HOST}:{self.port}/?token={once}"

    def redeem(self, presented: str) -> bool:
        """Whether `presented` is the session's token or an unspent one-time token (then spent)."""
        if same(presented, self.token):
            return True
        now = time.monotonic()
        for once, until in list(self._once.items()):
            if same(presented, once):
                del self._once[once]
                return now < until
        return False

    def admits(self, cookie: str | None) -> bool:
        """Whether `cookie` (the value of this lab's cookie, if any) is the one the token was exchanged for."""
        return cookie is not None and same(cookie, self._cookie)

    def give_cookie(self, response: Response) -> None:
        response.set_cookie(self.cookie_name, self._cookie, path="/", httponly=True, samesite="strict")


def refusal(scope: Scope) -> Response:
    """403 for a request without the session's cookie or token: JSON for the page's API, else a short page."""
    if scope["path"].startswith("/api/"):
        return JSONResponse({"status": "refused", "message": tr(REFUSED), "errors": {}}, 403, CLOSE)
    return HTMLResponse(refusal_page(), 403, CLOSE)


class OnlyOwner:
    """Requests pass with this lab's cookie or its token; `GET /?token=…` with a good token buys the cookie."""

    def __init__(self, app: ASGIApp, session: Session) -> None:
        self.app, self.session = app, session

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # the lab speaks no WebSocket: refused before it is accepted (403)
            await send({"type": "websocket.close", "code": 1008})
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        if "token" in query:
            tokens = query["token"]
            if len(tokens) != 1 or not self.session.redeem(tokens[0]):
                response = refusal(scope)
            elif scope["path"] == "/" and scope.get("method") in ("GET", "HEAD"):
                response = RedirectResponse("/", 303, {"Cache-Control": "no-store"})  # the token leaves the address bar
                self.session.give_cookie(response)
            else:
                await self.app(scope, receive, send)  # a script that presents the token on each request
                return
        elif self.session.admits(Request(scope).cookies.get(self.session.cookie_name)):
            await self.app(scope, receive, send)
            return
        else:
            response = refusal(scope)
        if response.status_code == 403:
            await drain(receive)
        await response(scope, receive, send)


class OnlyHosts:
    """403 for every request whose Host header is not exactly one of `hosts`."""

    def __init__(self, app: ASGIApp, hosts: set[str]) -> None:
        self.app, self.hosts = app, {h.encode() for h in hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            host = [value for name, value in scope["headers"] if name == b"host"]
            if len(host) != 1 or host[0] not in self.hosts:
                forbidden = PlainTextResponse("forbidden: course lab answers only 127.0.0.1 and localhost", 403, CLOSE)
                await drain(receive)
                await forbidden(scope, receive, send)
                return
        await self.app(scope, receive, send)
