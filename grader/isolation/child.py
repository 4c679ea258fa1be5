"""The process that runs student code: it loads one chapter module and answers calls.

It is started by `grader.isolation.worker.start` or forked by `grader.isolation.zygote`,
never imported by the grader itself. Before any student code runs it sets its own
limits (output file size, one thread), then reports every call's value and the
arguments as they were after the call. Verdicts are never made here, and nothing it
says about itself is believed: the memory it uses is counted by the grader's budget
(`grader.isolation.budget`), its leftover processes are found from outside
(`grader.isolation.sandbox`).
"""

from __future__ import annotations

import builtins
import errno
import gc
import importlib.abc
import importlib.util
import os
import sys
import time
import traceback
from typing import Any, cast

import torch

from grader.isolation import frames, wire

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]


class _Refuse(importlib.abc.MetaPathFinder):
    """Makes `import solutions` (and the hidden checks) fail inside the student's process."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if any(name == n or name.startswith(n + ".") for n in self.names):
            try:
                from grader.i18n import tr
            except ImportError:  # the sandbox shows the student's process grader.isolation only: there it speaks English

                def tr(message: str, /, **fields: Any) -> str:
                    return message.format(**fields)

            raise ImportError(
                tr("importing {name} is not allowed while grading: your code must not use the reference solutions", name=repr(name))
            )
        return None


class Child:
    def __init__(self, req_fd: int, rep_fd: int) -> None:
        self.req_fd, self.rep_fd = req_fd, rep_fd
        self.pid = os.getpid()
        self.module: Any = None
        self.objects: dict[int, Any] = {}

    def keep(self, obj: Any) -> int:
        self.objects[id(obj)] = obj
        return id(obj)

    def resolve(self, i: int) -> Any:
        if i not in self.objects:
            raise frames.WireError("unknown handle")
        return self.objects[i]

    def serve(self) -> None:
        frames.write_frame(self.rep_fd, {"ok": True, "pid": os.getpid()})
        while True:
            header, buffers = frames.read_frame(self.req_fd)
            op = header.get("op")
            if op == "exit":
                return
            try:
                reply, out = getattr(self, "op_" + op)(header, buffers)
            except BaseException as e:  # the student's exception, reported as data
                reply, out = {"ok": False, "error": self.describe(e)}, []
            if os.getpid() != self.pid:  # a copy made by os.fork() in student code: never reply twice
                os._exit(0)
            _flush()
            frames.write_frame(self.rep_fd, reply, out)

    def op_load(self, header: dict, _: list[bytearray]) -> tuple[dict, list[bytes]]:
        spec = cast("importlib.machinery.ModuleSpec", importlib.util.spec_from_file_location(header["name"], header["path"]))  # a .py file
        module = importlib.util.module_from_spec(spec)
        sys.modules[header["name"]] = module
        self.module = module
        cast("importlib.abc.Loader", spec.loader).exec_module(module)
        return {"ok": True}, []

    def op_call(self, header: dict, buffers: list[bytearray]) -> tuple[dict, list[bytes | memoryview]]:
        args = wire.decode(header["args"], buffers, self.resolve)
        kwargs = wire.decode(header["kwargs"], buffers, self.resolve)
        target = header["target"]
        if isinstance(target, str):
            fn = getattr(self.module, target, None)
            if fn is None:
                raise _Missing(f"your module has no function {target!r}", kind="function", name=target)
        else:  # a method of an object that stayed here: {"handle": id, "method": name}
            obj = self.resolve(target["handle"])
            fn = getattr(obj, target["method"], None)
            if fn is None:
                raise _Missing(
                    f"your {type(obj).__name__} has no method {target['method']!r}",
                    kind="method",
                    name=target["method"],
                    owner=type(obj).__name__,
                )
        saved = dict(vars(builtins))
        start = time.perf_counter()
        try:
            value = fn(*args, **kwargs)
        finally:
            _restore(vars(builtins), saved)  # patched builtins must not break the reply
        elapsed = time.perf_counter() - start
        tree, out = wire.encode({"value": value, "args": args, "kwargs": kwargs}, self.keep)
        return {"ok": True, "result": tree, "elapsed": elapsed}, out

    def op_getattr(self, header: dict, _: list[bytearray]) -> tuple[dict, list[bytes | memoryview]]:
        """Read attributes of an object that stayed here (its observable state)."""
        obj = self.resolve(header["handle"])
        saved = dict(vars(builtins))
        try:  # properties run student code too
            values = {name: getattr(obj, name) for name in header["names"]}
        except AttributeError as e:
            raise _Missing(
                f"your {type(obj).__name__} has no attribute {e.name!r}", kind="attribute", name=e.name, owner=type(obj).__name__
            ) from None
        finally:
            _restore(vars(builtins), saved)
        tree, out = wire.encode({"value": values, "args": [], "kwargs": {}}, self.keep)
        return {"ok": True, "result": tree, "elapsed": 0.0}, out

    def describe(self, e: BaseException) -> dict:
        """An exception as plain data: its type chain, message and the student's frames."""
        try:
            message = str(e)
        except BaseException:
            message = "<the exception's message could not be printed>"
        own = _own_files(self.module)
        frames = [[f.filename, f.lineno, f.name, f.line or ""] for f in traceback.extract_tb(e.__traceback__) if f.filename in own]
        if isinstance(e, SyntaxError) and e.filename:
            frames.append([e.filename, e.lineno or 0, "<module>", (e.text or "").rstrip()])
        oom = isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and "alloc" in message.lower() and "memory" in message.lower())
        flood = isinstance(e, OSError) and e.errno == errno.EFBIG  # Python ignores SIGXFSZ: writes fail
        return {
            "types": [f"{c.__module__}.{c.__qualname__}" for c in type(e).__mro__],
            "name": type(e).__name__,
            "message": message[:4000],
            "frames": frames[-5:],
            "missing": isinstance(e, _Missing),
            "missing_of": e.fields if isinstance(e, _Missing) else None,  # the parent says it in the run's language
            "out_of_memory": oom,
            "output_limit": flood,
            "exit_code": repr(e.code) if isinstance(e, SystemExit) else None,
        }


class _Missing(Exception):
    """The module lacks the function the check calls; `fields`: what is missing (kind, name, owner)."""

    def __init__(self, message: str, *, kind: str, name: object, owner: str = "") -> None:
        super().__init__(message)
        self.fields = {"kind": kind, "name": repr(name), "owner": owner}


def _own_files(module: Any) -> set:
    """The file names of the student's code: the module's file, and the notebook cells a module made
    from a notebook compiles its code under (their labels, listed in its `__course_cells__`)."""
    if module is None:
        return set()
    own = {getattr(module, "__file__", None)}
    try:
        names = vars(module).get("__course_cells__", ())
        own |= {n for n in names if type(n) is str} if type(names) is tuple else set()
    except BaseException:  # whatever the module made of that name, the frames of its file still count
        pass
    return own


def _restore(namespace: dict, saved: dict) -> None:
    for name in set(namespace) - set(saved):
        del namespace[name]
    namespace.update(saved)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass


def main(argv: list[str]) -> None:
    """Entry point of a fresh interpreter given its pipes (`grader.isolation.worker.start`): fds and the
    output limit from the command line."""
    req_fd, rep_fd, output = (int(a) for a in argv[:3])
    run(req_fd, rep_fd, output=output)


def main_stdio(argv: list[str]) -> None:
    """Entry point of a fresh interpreter on the portable route: requests arrive on stdin, replies leave on
    stdout, and from here on whatever the student's code prints (stdout and stderr) goes to stderr, the
    log the grader opened. No extra file descriptor needs passing, which Windows cannot do."""
    req_fd, rep_fd = os.dup(0), os.dup(1)
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    run(req_fd, rep_fd, output=int(argv[0]))


def run(req_fd: int, rep_fd: int, *, output: int) -> None:
    """Become the student's process: one thread, limits, then serve requests.

    `output` caps what it may print (bytes; 0: no cap). Memory is not limited here: the grader's budget
    (`grader.isolation.budget`) counts what this process and its children use, from outside. Address space
    is never limited (a CUDA build of torch reserves gigabytes of it without using them).
    """
    torch.set_num_threads(1)
    gc.freeze()  # torch's many objects: keep them out of every full garbage collection (0.1 s each)
    for fd in (req_fd, rep_fd):
        os.set_inheritable(fd, False)
    sys.meta_path.insert(0, _Refuse(["solutions", "grader.hidden", "grader.checks"]))
    _first_to_go()
    if resource is not None:  # hard limits: the student's code cannot raise them
        if output > 0:
            resource.setrlimit(resource.RLIMIT_FSIZE, (output, output))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    elif output > 0:  # no resource module (Windows): cap what Python prints instead
        sys.stdout, sys.stderr = _Capped(sys.stdout, output), _Capped(sys.stderr, output)
    Child(req_fd, rep_fd).serve()


def _first_to_go() -> None:
    """Make this process the one the kernel ends first when memory runs out (Linux): the runaway, not the
    warm process beside it. Raising one's own score needs no privilege."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


class _Capped:
    """A text stream that refuses to write past `limit` characters in all (raising EFBIG, as a file over
    RLIMIT_FSIZE does), for platforms without `resource`."""

    def __init__(self, stream: Any, limit: int) -> None:
        self._stream, self._left = stream, limit

    def write(self, text: str) -> int:
        self._left -= len(text)
        if self._left < 0:
            raise OSError(errno.EFBIG, "the output limit was reached")
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
