"""The lab's web server: one page, its static files, and a small JSON API over a `Lab`.

Starlette routes, served by uvicorn on 127.0.0.1 only. Student code runs in worker
threads (one request per experiment at a time, see `grader.lab.runner`), so a slow or
hanging function never holds up the server's other requests. Only the files of
`grader/lab/static/` are ever served.

Other web pages in the student's browser must not read the lab or run code through it. Every
request whose Host is not `127.0.0.1:PORT` or `localhost:PORT` gets 403 (a DNS-rebinding page
names its own host). Running code needs what a cross-site form or fetch cannot send: `Content-Type:
application/json`, the page's own `Origin`, and the session's token (made at start, put in the page's
`<meta name="course-token">`, sent back as `X-Course-Token`). A body over `MAX_BODY` is refused with
413 from its Content-Length, or as soon as a chunked body passes the cap; it is never read whole.
"""

from __future__ import annotations

import hmac
import json
import secrets
import socket
import threading
import webbrowser
from pathlib import Path
from typing import Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from grader.lab.runner import Lab

STATIC = Path(__file__).resolve().parent / "static"
FONTS = Path(__file__).resolve().parents[2] / "figures" / "fonts"
"""The shipped fonts (figures/fonts/*.woff2): lab.css draws the page with them, as the figures do, so a
machine without a CJK font shows Chinese too."""
HOST = "127.0.0.1"
MAX_BODY = 64 << 10
TOKEN_META = '<meta name="course-token" content="">'  # in index.html; filled in when the page is served
TOKEN_HEADER = "x-course-token"
TOO_LARGE = {"Connection": "close"}  # with a 413 uvicorn closes the connection rather than read the rest


class OnlyHosts:
    """403 for every request whose Host header is not exactly one of `hosts`."""

    def __init__(self, app: ASGIApp, hosts: set[str]) -> None:
        self.app, self.hosts = app, {h.encode() for h in hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            host = [value for name, value in scope["headers"] if name == b"host"]
            if len(host) != 1 or host[0] not in self.hosts:
                forbidden = PlainTextResponse("forbidden: course lab answers only 127.0.0.1 and localhost", 403)
                await forbidden(scope, receive, send)
                return
        await self.app(scope, receive, send)


def invalid(message: str, status_code: int, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"status": "invalid", "message": message, "errors": {}}, status_code, headers)


async def capped_body(request: Request) -> bytes | None:
    """The body, read as a stream: None as soon as it passes MAX_BODY (the rest is never read)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            return None
    return bytes(body)


def app(lab: Lab, port: int) -> Starlette:
    """The lab's routes, for requests to 127.0.0.1:`port` or localhost:`port`, with a new session token."""
    token = secrets.token_urlsafe(32)
    hosts = {f"{HOST}:{port}", f"localhost:{port}"}
    origins = {f"http://{h}" for h in hosts}
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    if TOKEN_META not in html:
        raise RuntimeError(f"{STATIC / 'index.html'} lacks {TOKEN_META}")
    html = html.replace(TOKEN_META, f'<meta name="course-token" content="{token}">')

    def refusal(request: Request) -> JSONResponse | None:
        """Why a request to run code is refused, if it is: it must come from our page, as small JSON."""
        if request.headers.get("origin") not in origins:
            return invalid("refused: code runs only from the lab's own page (Origin)", 403)
        if not hmac.compare_digest(request.headers.get(TOKEN_HEADER, "").encode("latin-1"), token.encode()):
            return invalid("refused: missing or wrong session token (reload the page)", 403)
        if request.headers.get("content-type", "").partition(";")[0].strip().lower() != "application/json":
            return invalid("send the parameters as application/json", 415)
        try:
            length = int(request.headers.get("content-length", "0"))
        except ValueError:
            return invalid("bad Content-Length", 400)
        return invalid("request too large", 413, TOO_LARGE) if length > MAX_BODY else None

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    async def font(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in {p.name for p in FONTS.glob("*.woff2")}:  # only the fonts: nothing else of the folder
            return PlainTextResponse("no such font", 404)
        return FileResponse(FONTS / name, media_type="font/woff2", headers={"Cache-Control": "max-age=3600"})

    async def experiments(request: Request) -> JSONResponse:
        return JSONResponse(lab.describe())

    async def run(request: Request) -> JSONResponse:
        if refused := refusal(request):
            return refused
        body = await capped_body(request)
        if body is None:
            return invalid("request too large", 413, TOO_LARGE)
        try:
            data = json.loads(body) if body else {}
            params = data.get("params", {}) if isinstance(data, dict) else None
            if not isinstance(params, dict):
                raise ValueError
        except ValueError:
            return invalid('send {"params": {name: value}}', 400)
        result = await run_in_threadpool(lab.run, request.path_params["experiment"], params)
        return JSONResponse(result)

    return Starlette(
        routes=[
            Route("/", page),
            Route("/fonts/{name}", font),
            Route("/api/experiments", experiments),
            Route("/api/run/{experiment}", run, methods=["POST"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        middleware=[Middleware(OnlyHosts, hosts=hosts)],
    )


def bind(port: int = 0) -> socket.socket:
    """A listening socket on 127.0.0.1 (`port` 0: a free one)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, port))
    sock.listen(128)
    return sock


def serve(lab: Lab, *, port: int = 0, open_browser: bool = True, on_ready: Callable[[str], None] | None = None) -> None:
    """Serve the lab until Ctrl-C (or SIGTERM); `on_ready(url)` is called once it listens."""
    import uvicorn

    sock = bind(port)
    port = sock.getsockname()[1]
    url = f"http://{HOST}:{port}/"
    config = uvicorn.Config(app(lab, port), log_level="warning", timeout_graceful_shutdown=2, lifespan="off")
    server = uvicorn.Server(config)
    if on_ready:
        on_ready(url)
    if open_browser:
        threading.Timer(0.3, webbrowser.open, args=(url,)).start()
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shuts down gracefully, then raises the signal again
        pass
    finally:
        sock.close()
