"""A Gradescope autograder bundle: Gradescope runs every submission in its own container.

`export` writes a zip that Gradescope unpacks into /autograder/source:

- `setup.sh`, run once as root to build the image: installs Python, bubblewrap and setpriv,
  creates the unprivileged user `course-student` (it owns no file), installs the course package
  (hidden checks included) into a venv outside /autograder (`VENV`) with a plain, non-editable
  `pip install`, then `protect`s: /autograder and every folder of the installed course package in
  the venv's site-packages (solutions/, the whole grader/ with its hidden checks and any recorded
  answers, exercises/, figures/) become mode 0700, owned by root. The rest of the venv and Python
  stay readable by everybody: the student's code needs Python, torch and numpy, and nothing of the
  course package (the sandbox's harness is a copy the grader makes for the box);
- `run_autograder`, run as root for each submission: the installed package
  (`python -I -m grader.delivery.gradescope`, never the source tree) grades /autograder/submission;
  it holds the bundle's secret (`grader.delivery.seeds`) and hands it over in the environment;
- the package source, `course/`.

`run` finds the answer in /autograder/submission by the layout rules of `course grade`
(`grader.delivery.layout`: the chapter's file name, one folder down, or one file naming the
chapter such as `ch25_paged_kv (1).py`); when none fits, the output says what was expected and
what the submission holds, and none of it runs. The hidden checks run on the student's own seed:
the HMAC of the student's Gradescope user id (`users` in /autograder/submission_metadata.json, read by
root before any student code runs; a group's ids together) under the bundle's secret, fixed at
export, so that a regrade meets the same instances and no two students the same ones; results.json
carries no seed.

It grades the answer in one sandbox made for it and torn down before `grader.run.check` returns:
bubblewrap where the container allows user namespaces, else the uid boundary: the student's code
runs as `course-student`, no privileges, no capabilities, no network (`grader.isolation.netfilter`'s
seccomp filter), seeing the host's files. Before any of it runs, `grader.delivery.uidprobe` checks as
that user, under that filter, that nothing of /autograder but the submission (the metadata, the
results, the source, run_autograder), nothing of the course package and neither the chapter's
reference nor its hidden checks can be read, that the results folder cannot be written, and that the
network cannot be reached. Where neither boundary can be had it refuses to grade: score 0, a message
naming the fix, exit status 1.

/autograder and its results folder are made root's alone (0700) before any student code runs.
results.json says which boundary graded ("output", HTML with the figures inline:
`grader.delivery.feedback`; every test's own output stays text), gives the hidden checks' results
the visibility chosen at export (`after_due_date` by default; until they are shown, the output's
score line counts the public checks only), and is written only after the sandbox is gone: every
process of the student's uid is killed right before, and the file is written atomically (a
temporary file, then `os.replace`).

`GRADESCOPE_ROOT` moves the /autograder root, `COURSE_PYTHON` the interpreter; `COURSE_SANDBOX`
("bwrap" or "uid") forces a boundary and `COURSE_STUDENT_UID` the student's uid (tests use them).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import sys
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

from grader import chapters
from grader.chapters import Chapter
from grader.delivery import escape
from grader.i18n import language, mark, tr
from grader.i18n.choose import COURSE_LANGUAGE, normalize

SOURCE = ("pyproject.toml", "README.md", "grader", "figures", "solutions", "exercises")
STUDENT_USER = "course-student"
"""The unprivileged user the student's code runs as (setup.sh creates it)."""
PACKAGES = ("grader", "solutions", "exercises", "figures", "engine")
"""The course package's top-level folders, as installed in site-packages."""

VENV = "/opt/course/venv"
"""Where setup.sh installs Python and the course package: outside /autograder, which is root's alone."""
VISIBILITIES = ("after_due_date", "after_published", "visible", "hidden")
"""Gradescope's visibilities, for the hidden checks' results (the first is the default)."""
METADATA_BYTES = 16 << 20
"""The most of submission_metadata.json read (its list of previous submissions grows with each one)."""

SETUP = f"""#!/usr/bin/env bash
# Gradescope runs this once, as root, to build the image (a base image with Python 3.11+, e.g. Ubuntu 24.04).
set -euo pipefail
umask 022   # the venv and Python stay readable by the student's unprivileged user
apt-get update
apt-get install -y --no-install-recommends python3 python3-venv python3-pip bubblewrap util-linux passwd
# The student's code runs as this user wherever bubblewrap cannot make its namespaces; it owns no file.
id -u {STUDENT_USER} >/dev/null 2>&1 || useradd --system --no-create-home --home-dir /nonexistent \\
    --shell /usr/sbin/nologin {STUDENT_USER}
python3 -m venv {VENV}   # outside /autograder, which becomes root's alone
{VENV}/bin/pip install /autograder/source/course   # not editable; torch==2.13.0 is pinned by the package
# Root alone may read /autograder and the installed course package (reference, hidden checks, answers).
cd / && {VENV}/bin/python -I -m grader.delivery.gradescope --protect /autograder
"""

RUN = f"""#!/usr/bin/env bash
# Gradescope runs this as root for every submission; the results land in results/results.json.
ROOT="${{GRADESCOPE_ROOT:-/autograder}}"
PYTHON="${{COURSE_PYTHON:-{VENV}/bin/python}}"
# The secret goes in the environment, which only root may read (a command line is anybody's to read).
cd / && COURSE_GRADING_SECRET=@SECRET@ COURSE_LANG=@LANG@ exec "$PYTHON" -I -m grader.delivery.gradescope "$ROOT" @CHAPTER@ @VISIBILITY@
"""


def export(
    chapter: Chapter, out: Path, *, seed: int | None = None, hidden_visibility: str = VISIBILITIES[0], lang: str = COURSE_LANGUAGE
) -> Path:
    """Write the bundle for one chapter to `out` (a .zip). Its secret is a new one (`grader.delivery.seeds`),
    or the number `seed` (repeatable, and guessable: for tests); `hidden_visibility` (one of
    VISIBILITIES) says when students see the hidden checks' results; its feedback speaks `lang` (never the
    container's locale)."""
    from grader.delivery.seeds import secret_of

    if hidden_visibility not in VISIBILITIES:
        raise ValueError(f"hidden_visibility {hidden_visibility!r} is none of {', '.join(VISIBILITIES)}")
    run = RUN.replace("@CHAPTER@", chapter.id).replace("@SECRET@", secret_of(seed)).replace("@VISIBILITY@", hidden_visibility)
    run = run.replace("@LANG@", normalize(lang))
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        _add(z, "setup.sh", SETUP)
        _add(z, "run_autograder", run)
        for name in SOURCE:
            path = chapters.ROOT / name
            shipped = (p for p in path.rglob("*") if p.suffix in (".py", ".po") and "__pycache__" not in p.parts)  # code, catalogs
            files = [path] if path.is_file() else sorted(shipped)
            for f in files:
                z.write(f, f"course/{f.relative_to(chapters.ROOT)}")  # Gradescope unzips into /autograder/source
    return out


def _add(z: zipfile.ZipFile, name: str, text: str) -> None:
    info = zipfile.ZipInfo(name)
    info.external_attr = 0o755 << 16  # executable, as Gradescope expects
    z.writestr(info, text)


# -- the container's permissions ----------------------------------------------------------------------------
def course_folders() -> list[Path]:
    """The installed course package's folders in site-packages; none when this runs from a source
    tree (an editable install), which `protect` leaves alone and the uid boundary then refuses."""
    paths = sysconfig.get_paths()
    if chapters.ROOT not in {Path(paths["purelib"]).resolve(), Path(paths["platlib"]).resolve()}:
        return []
    return [chapters.ROOT / name for name in PACKAGES if (chapters.ROOT / name).is_dir()]


def protect(root: Path) -> list[Path]:
    """Make root alone able to read /autograder (`root`: the source tree, run_autograder with the
    secret, the submission's metadata, the results) and the installed course package (mode 0700,
    owned by root); return the folders locked. Idempotent: setup.sh runs it once, `run` again
    before grading."""
    locked = []
    for path in [root / "source", *course_folders()]:
        if path.is_dir() and not path.is_symlink():
            _own(path, 0o700)
            locked.append(path)
    if (root / "run_autograder").is_file():  # it holds the bundle's secret
        _own(root / "run_autograder", 0o700)
    results = root / "results"
    if results.is_symlink():
        results.unlink()
    results.mkdir(parents=True, exist_ok=True)
    _own(results, 0o700)
    _own(root, 0o700)  # everything under it out of the student's reach, whatever Gradescope puts there
    return locked


def _own(path: Path, mode: int) -> None:
    if os.geteuid() == 0:
        os.chown(path, 0, 0, follow_symlinks=False)
    os.chmod(path, mode)


# -- the sandbox ------------------------------------------------------------------------------------------
def choose_sandbox() -> tuple[str, str]:
    """(kind, description) of the boundary to grade in: bubblewrap where it works, else the uid
    boundary; `COURSE_SANDBOX` forces one. SandboxUnavailable names the fixes when none works."""
    from grader.isolation.sandbox import KINDS, SandboxUnavailable, probe

    forced = os.environ.get("COURSE_SANDBOX", "")
    if forced and forced not in KINDS:
        raise SandboxUnavailable(f"COURSE_SANDBOX={forced!r} names no sandbox: {' or '.join(KINDS)}")
    reasons = []
    for kind in [forced] if forced else KINDS:
        try:
            return kind, probe(kind)
        except SandboxUnavailable as e:
            reasons.append(str(e))
    raise SandboxUnavailable(
        "no sandbox can be made in this container, so no submission is graded here: "
        + "; ".join(reasons)
        + f" (setup.sh installs bubblewrap and setpriv and creates the "
        f"user {STUDENT_USER}; Gradescope runs run_autograder as root)"
    )


def student_uid() -> tuple[int, str]:
    """The host uid the student's code runs as, and how to name it: `COURSE_STUDENT_UID`, else the
    user setup.sh made, else a uid of the sandbox's own range that has no user and no file."""
    from grader.isolation.sandbox import HOST_UID_BASE

    given = os.environ.get("COURSE_STUDENT_UID", "")
    if given:
        if not given.isdigit() or int(given) == 0:
            raise Refused(f"COURSE_STUDENT_UID={given!r} is not the uid of an unprivileged user")
        return int(given), f"uid {given}"
    try:
        uid = pwd.getpwnam(STUDENT_USER).pw_uid
    except KeyError:
        return HOST_UID_BASE, f"uid {HOST_UID_BASE} (no user {STUDENT_USER}: setup.sh creates it)"
    return uid, f"user {STUDENT_USER} (uid {uid})"


def processes_of(uid: int) -> list[int]:
    """Every live process (not a zombie) that runs as `uid`, any of its ids."""
    from grader.isolation import procs

    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = procs.status(int(name))
            if str(uid) in info.get("Uid", "").split() and not info.get("State", "Z").startswith(("Z", "X")):
                found.append(int(name))
    return found


def end_processes(uid: int) -> list[int]:
    """Kill every process of `uid` (the sandbox is gone already; this makes sure); the pids that
    are still there afterwards, if any."""
    from grader.isolation import sandbox

    for _ in range(3):
        if not processes_of(uid):
            break
        sandbox._kill_uid(uid)  # `kill -9 -1` as that uid: all of them at once, a forking one included
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:  # orphans this subreaper adopted
            pass
    except ChildProcessError:
        pass
    return processes_of(uid)


# -- grading ----------------------------------------------------------------------------------------------
class Refused(RuntimeError):
    """This container cannot grade anybody's submission safely: no result but score 0."""


def run(root: Path, chapter_id: str, secret: str, hidden_visibility: str = VISIBILITIES[0]) -> tuple[dict, int]:
    """Grade the submission under `root` on its student's seed (the HMAC of the student's id under
    `secret`) and write `root/results/results.json` (never raises); the document and the exit status
    (1 when grading was refused or broke, else 0)."""
    from grader.delivery.layout import folder_tree, locate, read_in, shown_name
    from grader.delivery.seeds import student_seed
    from grader.delivery.submission import SubmissionError, open_folder
    from grader.isolation.sandbox import SandboxUnavailable
    from grader.run import MissingModule, check

    results = root / "results"
    ch = chapters.find(chapter_id)
    private = Path(tempfile.mkdtemp(prefix="course-gradescope-"))  # 0700, root's
    uid, boundary = None, ""
    status = 0
    try:
        locked = protect(root)
        seed = student_seed(secret, student_id(root))  # read by root: no code of the student's has run yet
        kind, description = choose_sandbox()
        if os.geteuid() == 0:
            uid, who = student_uid()
            if end_processes(uid):  # a dedicated uid runs nothing before the submission does
                raise Refused(f"uid {uid} runs processes that cannot be ended: the student's uid must be its own")
            boundary = tr("sandbox: {description}; the student's code ran as {who} on the host", description=description, who=who)
        else:
            boundary = tr("sandbox: {description}", description=description)
        if kind == "uid":
            check_uid_boundary(root, uid, [*locked, chapters.SOLUTIONS / ch.filename, chapters.ROOT / "grader" / "hidden" / f"{ch.id}.py"])
        folder_fd = open_folder(root / "submission", follow=True)
        try:  # where the answer is: the layout rules of `course grade` (grader.delivery.layout)
            located = locate(folder_tree(folder_fd), ch, tr("your submission"))
            name = "/".join(located.path)
            answer = read_in(folder_fd, name, ch)
        finally:
            os.close(folder_fd)
        (private / ch.filename).write_bytes(answer.source)
        report = check(
            ch.id, submission=private, source=answer.source, hidden=True, seed=seed, figures_dir=results / "figures", sandbox=kind, uid=uid
        )
        doc = report.to_json()
        del doc["seed"]  # results.json carries none: a regrade derives the same one from the secret and the id
        for test in doc["tests"]:
            if "hidden" in test["tags"]:
                test["visibility"] = hidden_visibility
        graded = (
            tr("graded {name} as {file}: name it {file} next time", name=shown_name(name), file=ch.filename)
            if located.renamed
            else tr("graded {name}", name=shown_name(name))
        )
        figures = {Path(p).stem: Path(p).read_text(encoding="utf-8") for p in report.figures}
        doc.update(_output([score_line(report, hidden_visibility), graded, boundary], figures))
        doc.update(stdout_visibility="hidden")
    except (SubmissionError, MissingModule) as e:  # the submission's own problem: graded 0, said why; none of it ran
        doc = {
            "score": 0,
            **_output([tr("could not grade this submission: {error}", error=e), tr("(none of its code was run)")]),
            "tests": [],
        }
    except (Refused, SandboxUnavailable) as e:
        doc = {"score": 0, **_output([tr("not graded: {error}", error=e)]), "tests": []}
        status = 1
    except Exception as e:  # the grader's own failure: still a document, and a status that says so
        failure = tr("could not grade this submission ({kind}: {error})", kind=type(e).__name__, error=e)
        doc = {"score": 0, **_output([failure, boundary]), "tests": []}
        status = 1
    finally:
        shutil.rmtree(private, ignore_errors=True)
    if uid is not None:
        left = end_processes(uid)
        if left:
            outlived = tr("not graded: processes of uid {uid} ({pids}) outlived the sandbox", uid=uid, pids=left[:10])
            doc = {"score": 0, **_output([outlived]), "tests": []}
            status = 1
    write_results(results, doc)
    return doc, status


def student_id(root: Path) -> str:
    """The submission's student: the Gradescope user ids of `users` in root/submission_metadata.json,
    sorted and joined by commas (a group submission is the group's). Read by root before any of the
    student's code runs, never through a link; Refused when there is none."""
    path = root / "submission_metadata.json"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise OSError(0, "not a regular file")
            data = f.read(METADATA_BYTES + 1)
    except OSError as e:
        why = f"{path} cannot be read ({e.strerror}); Gradescope writes it before run_autograder"
        raise Refused(f"no student to grade for: {why}") from None
    try:
        if len(data) > METADATA_BYTES:
            raise ValueError(f"over {METADATA_BYTES >> 20} MiB")
        users = json.loads(data)["users"]
        ids = sorted({str(u["id"]) for u in users if isinstance(u["id"], (int, str)) and not isinstance(u["id"], bool)})
        if not ids or len(ids) != len(users) or not all(0 < len(i) <= 64 for i in ids):
            raise ValueError("no user id, or one that is not a Gradescope id")
    except (ValueError, KeyError, TypeError) as e:
        raise Refused(f"no student to grade for: the users of {path} have no ids ({type(e).__name__}: {str(e)[:200]})") from None
    return ",".join(ids)


def check_uid_boundary(root: Path, uid: int | None, secret: list[Path]) -> None:
    """Refused unless the student's uid, in its box, can read nothing of `root` but the submission nor
    any of `secret`, cannot write in the results folder and cannot reach the network
    (`grader.delivery.uidprobe`)."""
    from grader.delivery.uidprobe import problems

    if uid is None:
        raise Refused("the uid boundary needs root")
    private = [root, *sorted(p for p in root.iterdir() if p.name != "submission"), *secret, chapters.ANSWERS]
    found = problems(uid, root / "results", private)
    if not found:
        return
    fixes = []
    if any(line.startswith(("can read", "can write")) for line in found):
        fixes.append("run setup.sh (it installs the course package non-editably and makes /autograder and the package root's alone)")
    if any(not line.startswith(("can read", "can write")) for line in found):
        fixes.append(
            "the student's code must not reach the network: the bundle's seccomp filter needs Linux on x86-64 or aarch64; "
            "or allow user namespaces, and bubblewrap makes a sandbox with no network at all"
        )
    raise Refused(f"the uid boundary does not hold here ({'; '.join(found)[:1000]}): {'; '.join(fixes)}")


WHEN = {
    "after_due_date": mark("after the due date"),
    "after_published": mark("once the grades are published"),
    "hidden": mark("to the instructors only"),
}
"""When students see the hidden checks' results, per visibility (all but "visible")."""


def score_line(report, hidden_visibility: str) -> str:
    """The output's first line: the score, counting the hidden checks only where students see their results."""
    ch = report.chapter
    head = f"{ch.id} · {ch.title_zh if language() == 'zh' else ch.title_en}"
    if hidden_visibility == "visible":
        return f"{head}: {report.score:g}/{report.max_score:g}"
    open_ = [r for r in report.results if not r.hidden]
    secret = [r for r in report.results if r.hidden]  # not `public`/`hidden`: Babel takes those for the checks' decorators
    when = tr(WHEN[hidden_visibility])
    return tr(
        "{head}: public checks {score:g}/{points:g}; {n} hidden checks ({hidden_points:g} points), their results shown {when}",
        head=head,
        score=sum(r.score for r in open_),
        points=sum(r.points for r in open_),
        n=len(secret),
        hidden_points=sum(r.points for r in secret),
        when=when,
    )


def _output(lines: list[str], figures: dict[str, str] | None = None) -> dict:
    """results.json's top-level output: `lines` (escaped) and the figures inline, as HTML
    (`grader.delivery.feedback.gradescope_output`); the lines again, as text, for run_autograder's stdout."""
    from grader.delivery.feedback import gradescope_output

    return {
        "output": gradescope_output(lines, figures or {}),
        "output_format": "html",
        "test_output_format": "text",
        "extra_data": {"summary": "\n".join(escape.plain(line) for line in lines if line)},  # printed to Gradescope's log
    }


def write_results(results: Path, doc: dict) -> None:
    """results.json, written atomically (a temporary file beside it, then `os.replace`)."""
    results.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=results, prefix=".results-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, results / "results.json")
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def main(argv: list[str]) -> int:
    if argv[:1] == ["--protect"] and len(argv) == 2:
        for path in protect(Path(argv[1])):
            print(f"root's alone (0700): {path}")
        return 0
    secret = os.environ.get("COURSE_GRADING_SECRET", "")
    if len(argv) not in (2, 3) or not secret or argv[2:3] not in ([], *([v] for v in VISIBILITIES)):
        print(
            "usage: COURSE_GRADING_SECRET=SECRET python -m grader.delivery.gradescope ROOT CHAPTER "
            f"[{'|'.join(VISIBILITIES)}] | --protect ROOT",
            file=sys.stderr,
        )
        return 2
    started = time.monotonic()
    doc, status = run(Path(argv[0]), argv[1], secret, *argv[2:])
    print(doc["extra_data"]["summary"], f"({time.monotonic() - started:.1f} s)")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
