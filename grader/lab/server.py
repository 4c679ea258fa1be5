"""The lab's web server: one page, its static files, and a small JSON API over a `Lab`.

Starlette routes, served by uvicorn on 127.0.0.1 only. Student code runs in worker
threads (one request per experiment at a time, see `grader.lab.runner`), so a slow or
hanging function never holds up the server's other requests. Only the files of
`grader/lab/static/` are ever served.
"""

from __future__ import annotations

import socket
import threading
import webbrowser
from pathlib import Path
from typing import Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from grader.lab.runner import Lab

STATIC = Path(__file__).resolve().parent / "static"
HOST = "127.0.0.1"
MAX_BODY = 64 << 10


def app(lab: Lab) -> Starlette:
    """The lab's routes: the page, its assets, the experiments and running one."""

    async def page(request: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    async def experiments(request: Request) -> JSONResponse:
        return JSONResponse(lab.describe())

    async def run(request: Request) -> JSONResponse:
        body = await request.body()
        if len(body) > MAX_BODY:
            return JSONResponse({"status": "invalid", "message": "request too large", "errors": {}}, status_code=413)
        try:
            params = (await request.json()).get("params", {}) if body else {}
            if not isinstance(params, dict):
                raise ValueError
        except ValueError:
            return JSONResponse({"status": "invalid", "message": 'send {"params": {name: value}}', "errors": {}},
                                status_code=400)
        result = await run_in_threadpool(lab.run, request.path_params["experiment"], params)
        return JSONResponse(result)

    return Starlette(routes=[
        Route("/", page),
        Route("/api/experiments", experiments),
        Route("/api/run/{experiment}", run, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ])


def bind(port: int = 0) -> socket.socket:
    """A listening socket on 127.0.0.1 (`port` 0: a free one)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, port))
    sock.listen(128)
    return sock


def serve(lab: Lab, *, port: int = 0, open_browser: bool = True,
          on_ready: Callable[[str], None] | None = None) -> None:
    """Serve the lab until Ctrl-C (or SIGTERM); `on_ready(url)` is called once it listens."""
    import uvicorn

    sock = bind(port)
    url = f"http://{HOST}:{sock.getsockname()[1]}/"
    config = uvicorn.Config(app(lab), log_level="warning", timeout_graceful_shutdown=2, lifespan="off")
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
