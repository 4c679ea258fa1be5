"""What runs on the other side of the trust boundary, and the grader's end of the pipes to it.

This folder is what enters the sandbox: `grader.isolation.sandbox.write_harness` copies it,
whole, into a private read-only folder the student's processes import from. It holds no
check, no answer and no solution.
"""
