"""The course's grader: runs a chapter's checks against a student's code in a sandboxed process.

How `course check ch25` flows, one line per module, in the order a check passes through them:

    cli.py         `course …`: one thin click command per verb, over the functions below
    chapters.py    the chapters, found by file name: solutions/chNN_<slug>.py → Chapter, its Tasks
    run.py         check(): the spine: start the student's process, run each check, draw the figures
    checks/        content: a chapter's public checks (chNN.py), found by file name; hidden/ its hidden ones
    authoring/     what a check is written with: Trial (t.yours.fn(...) beside t.ref.fn(...)), comparisons
                   that explain, the tables of common mistakes, trace grading; run_one gives the verdict
    isolation/     the other side of the trust boundary: the student's process, its pipes, the warm process
                   that forks it, the sandbox (this folder, and only it, is what enters the sandbox)
    report.py      the results of one run, as data and as a Gradescope results.json
    terminal.py    the results on a terminal, streamed as they come
    progress.py    `course list`: the chapters, their points, how the last check went

Where a verdict is computed: `authoring/trial.py:run_one` runs one check (a function in checks/chNN.py or
hidden/chNN.py) in the trusted process and turns what it raised into a status; the comparisons and
teaching messages are `authoring/compare.py` and the chapter's own helpers. Where a student's code runs:
`isolation/child.py`, in a process started by `isolation/worker.py` or forked by `isolation/zygote.py`,
inside `isolation/sandbox.py`'s sandbox when it is somebody else's code (its uid boundary without network by
`isolation/netfilter.py`'s seccomp filter); the trusted side talks to it only through `isolation/session.py`
(values as plain data, `isolation/wire.py`).

The other ways in, in delivery/: `stubs.py` (solutions/ → exercises/), `release.py` (the student package and
the nbgrader course), `notebook.py` (chapter notebooks, graded cell by cell), `grade.py` (a whole class,
with `layout.py` and `submission.py` reading what students handed in, `summary.py` its report,
`gradebook.py` nbgrader's gradebook, `seeds.py` each student's grading seed, `cluster.py` the same on a Dask
cluster's workers), `gradescope.py` (the autograder bundle, which finds the answer by the same `layout.py` and
checks its uid boundary with `uidprobe.py`),
`feedback.py` (what a graded student gets back: a page with the figures inline, and Gradescope's HTML output),
`doctor.py` (`course doctor`: what this installation can do), `files.py` (writing only where the grader chose),
`escape.py` (every text a submission chose, such as a name, a message quoting its values or what its code
printed, escaped for where it goes: the terminal, CSV, Markdown, HTML, SVG, JSON; the terminal report and the
figure kit use it too). `lab/` serves `course lab`.

This module stays import-light: the student's process imports `grader.isolation` too.
"""
