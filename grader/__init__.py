"""The course's grader: checks chapters against a student's code in an isolated process.

Python API: `grader.run.check(...)` runs a chapter's checks and returns a
`grader.report.Report`; the `course` command (grader.cli) is a thin layer over it.
This module stays import-light: the student's process imports `grader.isolation.wire` too.
"""
