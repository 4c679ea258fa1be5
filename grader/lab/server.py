"""The lab's web server: one page, its static files, and a small JSON API over a `Lab`.

Starlette routes, served by uvicorn on 127.0.0.1 only. Student code runs in worker
threads (one request per experiment at a time, see `grader.lab.runner`), so a slow or
hanging function never holds up the server's other requests. Only the files of
`grader/lab/static/` are ever served.

Nobody but the user who started the lab may read it or run code through it (`grader.lab.access`):
every request whose Host is not `127.0.0.1:PORT` or `localhost:PORT` gets 403 (a DNS-rebinding page
names its own host), and every other one needs the session's cookie, bought with the token printed on
the terminal, or that token. Other web pages in that user's browser must not run code either: running
code needs what a cross-site form or fetch cannot send, `Content-Type: application/json` and the page's
own `Origin` (and the cookie, which is `SameSite=Strict`). The page may not be framed. A body over
`MAX_BODY` is refused with 413 from its Content-Length, or as soon as a chunked body passes the cap; it
is never read whole. uvicorn logs no request line (a first one carries the token).
"""

from __future__ import annotations

import json
import re
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

from grader.i18n import catalog, language, tr
from grader.lab.access import HOST, OnlyHosts, OnlyOwner, Session
from grader.lab.engine_panel import EnginePanel
from grader.lab.runner import Lab

STATIC = Path(__file__).resolve().parent / "static"
FONTS = Path(__file__).resolve().parents[2] / "figures" / "fonts"
"""The shipped fonts (figures/fonts/*.woff2): lab.css draws the page with them, as the figures do, so a
machine without a CJK font shows Chinese too."""
MAX_BODY = 64 << 10
PAGE_HEADERS = {"Cache-Control": "no-store", "Content-Security-Policy": "frame-ancestors 'none'", "X-Frame-Options": "DENY"}
TOO_LARGE = {"Connection": "close"}  # with a 413 uvicorn closes the connection rather than read the rest


MARKED = re.compile(r"(<(\w+)[^>]*\bdata-t\b[^>]*>)([^<]*)(</\2>)")
"""An element of index.html whose text is translated when the page is served (`<h1 data-t>…</h1>`); the same
pattern extracts those texts into the lab's catalog (`grader.i18n.update`)."""


def page_text(lang: str) -> dict[str, str]:
    """The translations lab.js's `t(…)` looks up: the lab catalog's messages in `lang` ({} in English)."""
    if lang == "en":
        return {}
    path = catalog.LOCALE_DIRS[0] / lang / "LC_MESSAGES" / "lab.po"
    return {m: s for (c, m), s in catalog.read(path).items() if c is None} if path.is_file() else {}


def localized_page(html: str, lang: str) -> str:
    """index.html in `lang`: its `data-t` texts translated, its `lang`, and lab.js's words as an inline object."""
    html = MARKED.sub(lambda m: m.group(1) + escape_html(tr(m.group(3))) + m.group(4), html)
    html = html.replace('<html lang="zh-Hans">', f'<html lang="{"zh-Hans" if lang == "zh" else "en"}">')
    words = json.dumps(page_text(lang), ensure_ascii=False).replace("<", "\\u003c")
    return html.replace('<script src="/static/lab.js">', f'<script>window.LAB_TEXT = {words};</script>\n<script src="/static/lab.js">')


def escape_html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


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


def engine_panel(lab: Lab) -> EnginePanel:
    """The engine panel of this lab: the engine runs what the lab runs (a submission, sandboxed as the lab is; the
    project's own chapters for a lab, or a stand-in of one, without a submission)."""
    submission = getattr(lab, "submission", None)
    return EnginePanel(submission=submission, sandboxed=getattr(lab, "box", None) is not None)


def app(lab: Lab, session: Session, engine: EnginePanel | None = None) -> Starlette:
    """The lab's routes, for requests to 127.0.0.1 or localhost at the session's port that carry its cookie or token;
    `engine`: the engine panel's runner (default: `engine_panel(lab)`)."""
    origins = {f"http://{h}" for h in session.hosts}
    engine = engine or engine_panel(lab)
    html = localized_page((STATIC / "index.html").read_text(encoding="utf-8"), language())

    def refusal(request: Request) -> JSONResponse | None:
        """Why a request to run code is refused, if it is: it must come from our page, as small JSON."""
        if request.headers.get("origin") not in origins:
            return invalid("refused: code runs only from the lab's own page (Origin)", 403)
        if request.headers.get("content-type", "").partition(";")[0].strip().lower() != "application/json":
            return invalid("send the parameters as application/json", 415)
        try:
            length = int(request.headers.get("content-length", "0"))
        except ValueError:
            return invalid("bad Content-Length", 400)
        return invalid("request too large", 413, TOO_LARGE) if length > MAX_BODY else None

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(html, headers=PAGE_HEADERS)

    async def font(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in {p.name for p in FONTS.glob("*.woff2")}:  # only the fonts: nothing else of the folder
            return PlainTextResponse("no such font", 404)
        return FileResponse(FONTS / name, media_type="font/woff2", headers={"Cache-Control": "max-age=3600"})

    async def experiments(request: Request) -> JSONResponse:
        return JSONResponse(lab.describe())

    async def params_of(request: Request) -> dict | JSONResponse:
        """The page's {"params": {name: value}}, or the refusal of the request."""
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
        return params

    async def run(request: Request) -> JSONResponse:
        params = await params_of(request)
        if isinstance(params, JSONResponse):
            return params
        result = await run_in_threadpool(lab.run, request.path_params["experiment"], params)
        return JSONResponse(result)

    async def describe_engine(request: Request) -> JSONResponse:
        return JSONResponse(engine.describe())

    async def run_engine(request: Request) -> JSONResponse:
        params = await params_of(request)
        if isinstance(params, JSONResponse):
            return params
        return JSONResponse(await run_in_threadpool(engine.run, params))

    return Starlette(
        routes=[
            Route("/", page),
            Route("/fonts/{name}", font),
            Route("/api/experiments", experiments),
            Route("/api/run/{experiment}", run, methods=["POST"]),
            Route("/api/engine", describe_engine, methods=["GET"]),
            Route("/api/engine", run_engine, methods=["POST"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        middleware=[Middleware(OnlyHosts, hosts=session.hosts), Middleware(OnlyOwner, session=session)],
    )


def bind(port: int = 0) -> socket.socket:
    """A listening socket on 127.0.0.1 (`port` 0: a free one)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, port))
    sock.listen(128)
    return sock


def serve(lab: Lab, *, port: int = 0, open_browser: bool = True, on_ready: Callable[[str], None] | None = None) -> None:
    """Serve the lab until Ctrl-C (or SIGTERM); `on_ready(url)` is called once it listens, with the URL that
    carries the session's token (for the terminal only). A browser is opened on a one-time token of its own."""
    import uvicorn

    sock = bind(port)
    session = Session(sock.getsockname()[1])
    engine = engine_panel(lab)
    config = uvicorn.Config(app(lab, session, engine), log_level="warning", access_log=False, timeout_graceful_shutdown=2, lifespan="off")
    server = uvicorn.Server(config)
    if on_ready:
        on_ready(session.url)
    if open_browser:
        threading.Timer(0.3, webbrowser.open, args=(session.browser_url(),)).start()
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shuts down gracefully, then raises the signal again
        pass
    finally:
        engine.stop()
        sock.close()
