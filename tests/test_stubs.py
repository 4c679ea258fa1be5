"""Stub generation: regions become TODOs naming their task; malformed regions are refused."""

from __future__ import annotations

import pytest

from grader.delivery.stubs import StubError, make_stub

SOURCE = '''"""标题 · title"""

CONSTANT = 3


def f(x):
    """Do f. Task ch99.1."""
    # a comment students keep
    ### BEGIN SOLUTION
    y = x + 1

    # the answer
    return y
    ### END SOLUTION


class G:
    """A class task. Task ch99.2."""

    def method(self):
        ### BEGIN SOLUTION
        return 1
        ### END SOLUTION
'''


def test_regions_become_todos_naming_the_task_and_size():
    stub = make_stub(SOURCE, "ch99")
    assert "y = x + 1" not in stub and "return 1" not in stub
    assert "    # TODO(ch99.1): your code here (about 2 lines)\n" in stub
    assert '    raise NotImplementedError("ch99.1 f: not implemented yet (about 2 lines)")\n' in stub
    assert '        raise NotImplementedError("ch99.2 G: not implemented yet (about 1 line)")\n' in stub
    assert "CONSTANT = 3" in stub and "# a comment students keep" in stub and '"""Do f. Task ch99.1."""' in stub
    compile(stub, "stub", "exec")


@pytest.mark.parametrize(
    "broken, why",
    [
        (SOURCE.replace("    ### END SOLUTION\n\n\nclass", "\n\nclass"), "not closed"),
        (SOURCE.replace("Task ch99.1.", ""), "not inside a function or class marked"),
        (SOURCE + "### BEGIN SOLUTION\nZ = 1\n### END SOLUTION\n", "inside a function"),
        (SOURCE + "### END SOLUTION\n", "without"),
    ],
)
def test_malformed_regions_are_refused(broken, why):
    with pytest.raises(StubError, match=why):
        make_stub(broken, "ch99")


def test_two_functions_may_share_a_task():
    from grader.chapters import parse

    source = SOURCE.replace('class G:\n    """A class task. Task ch99.2."""', 'class G:\n    """The same task. Task ch99.1."""')
    ch = parse(source, "ch99", "demo")
    assert [(t.id, t.names) for t in ch.tasks] == [("ch99.1", ("f", "G"))]
    assert ch.tasks[0].label == "ch99.1 f, G" and ch.task("G") is ch.tasks[0]
    assert 'raise NotImplementedError("ch99.1 G: not implemented yet' in make_stub(source, "ch99")


def test_a_task_in_several_places_is_estimated_over_all_of_them():
    source = SOURCE.replace(
        """    def method(self):
        ### BEGIN SOLUTION
        return 1
        ### END SOLUTION
""",
        """    def __init__(self):
        ### BEGIN SOLUTION
        self.x = 1
        ### END SOLUTION

    def method(self):
        ### BEGIN SOLUTION
        y = self.x
        # a comment does not count
        z = y + 1
        return z
        ### END SOLUTION
""",
    )
    stub = make_stub(source, "ch99")
    # 1 line in __init__ and 3 in method: both TODOs and both errors speak of the task's 4
    assert stub.count('raise NotImplementedError("ch99.2 G: not implemented yet (about 4 lines)")') == 2
    assert "        # TODO(ch99.2): your code here (about 1 of the task's 4 lines, in 2 places)\n" in stub
    assert "        # TODO(ch99.2): your code here (about 3 of the task's 4 lines, in 2 places)\n" in stub
    assert "    # TODO(ch99.1): your code here (about 2 lines)\n" in stub, "a task in one place is unchanged"


def test_the_block_manager_stub_names_the_whole_task():
    import re

    from grader import chapters
    from grader.delivery.stubs import stub_for

    stub = stub_for(chapters.find("ch25"))
    here = [int(n) for n in re.findall(r"TODO\(ch25\.3\): your code here \(about (\d+) of", stub)]
    total = {int(n) for n in re.findall(r'"ch25\.3 BlockManager: not implemented yet \(about (\d+) lines\)"', stub)}
    assert len(here) > 3 and total == {sum(here)}
