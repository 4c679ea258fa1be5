"""grader.submission: a student's file read as itself (no link followed, bounded), and every
malformed module or notebook one clear SubmissionError, never another exception."""

from __future__ import annotations

import json
import os

import pytest

from grader import chapters
from grader.notebook import assemble, cells_of
from grader.submission import (MAX_MODULE_BYTES, NOTEBOOK_SHAPE, SubmissionError, compile_module, decode_module,
                               find_answer, notebook_cells, open_folder, read_answer, read_file)

CH17 = chapters.find("ch17")
SOLUTION = (chapters.SOLUTIONS / CH17.filename).read_bytes()
SHAPE = "a list of cells, each with a \"source\" string or list of strings"


def code_cell(source) -> dict:
    return {"cell_type": "code", "metadata": {}, "outputs": [], "source": source}


# -- what is read, and what is refused unread -------------------------------------------------------------
def test_a_regular_file_is_read(tmp_path):
    (tmp_path / CH17.filename).write_bytes(SOLUTION)
    assert read_file(tmp_path, CH17.filename, MAX_MODULE_BYTES) == SOLUTION


@pytest.mark.parametrize("target", ["/proc/self/pagemap", "other"])
def test_a_link_is_refused_unread(tmp_path, target):
    (tmp_path / "other").write_bytes(SOLUTION)
    (tmp_path / CH17.filename).symlink_to(target if target.startswith("/") else tmp_path / target)
    with pytest.raises(SubmissionError, match="is a symbolic link .*links are never followed"):
        read_file(tmp_path, CH17.filename, MAX_MODULE_BYTES)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / CH17.filename)  # opening it for reading would wait for a writer forever
    with pytest.raises(SubmissionError, match=r"is a FIFO \(named pipe\), not a regular file"):
        read_file(tmp_path, CH17.filename, MAX_MODULE_BYTES)


def test_a_folder_under_the_file_name_is_refused(tmp_path):
    (tmp_path / CH17.filename).mkdir()
    with pytest.raises(SubmissionError, match="is a folder, not a regular file"):
        read_file(tmp_path, CH17.filename, MAX_MODULE_BYTES)


def test_a_file_over_the_bound_is_refused_unread(tmp_path):
    with open(tmp_path / CH17.filename, "wb") as f:
        f.truncate(5 << 30)  # sparse: reading it would take 5 GiB
    with pytest.raises(SubmissionError, match="is 5120 MiB, over the 1 MiB a chapter file may have"):
        read_file(tmp_path, CH17.filename, MAX_MODULE_BYTES)


def test_a_student_folder_that_is_a_link_is_refused(tmp_path):
    (tmp_path / "ada").mkdir()
    (tmp_path / "eve").symlink_to(tmp_path / "ada")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(SubmissionError, match="eve is a symbolic link, not a folder"):
            open_folder("eve", dir_fd=fd)
        ada = open_folder("ada", dir_fd=fd)
        (tmp_path / "ada" / "ch17.ipynb").symlink_to("/etc/passwd")
        assert find_answer(ada, CH17) == "ch17.ipynb"  # found, so that reading it says it is a link
        with pytest.raises(SubmissionError, match="symbolic link"):
            read_answer(ada, "ch17.ipynb", CH17)
        os.close(ada)
    finally:
        os.close(fd)


# -- decoding ---------------------------------------------------------------------------------------------
def test_a_byte_order_mark_is_accepted_as_python_does():
    assert decode_module(b"\xef\xbb\xbf" + SOLUTION, "m.py") == SOLUTION.decode()


def test_a_coding_declaration_is_honoured_as_python_does():
    assert decode_module(b"# -*- coding: latin-1 -*-\nx = '\xe9'\n", "m.py").endswith("x = 'é'\n")


def test_bytes_that_are_not_utf8_are_a_clear_error():
    with pytest.raises(SubmissionError, match=r"m.py is not UTF-8 text \(byte 0\)"):
        decode_module(b"\xff\xfe not utf-8", "m.py")


# -- notebooks ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, words", [
    ("{}", 'it has no "cells"'),
    ("[]", "it is a list, not a JSON object"),
    ("3", "it is a number, not a JSON object"),
    ('{"cells": {}}', 'its "cells" is an object'),
    ('{"cells": NaN}', 'its "cells" is NaN'),
    ('{"cells": [1, 2]}', "cell 1 is a number, not a JSON object"),
    ('{"cells": [{"cell_type": "code", "source": null}]}', 'the "source" of code cell 1 is null'),
    ('{"cells": [{"cell_type": "code", "source": [1, 2]}]}', 'the "source" of code cell 1 is a list holding a number'),
    ('{"cells": [{"cell_type": "code"}]}', 'the "source" of code cell 1 is missing'),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply to read (RecursionError)"),
])
def test_every_shape_but_nbformats_names_the_convention(text, words):
    with pytest.raises(SubmissionError) as e:
        notebook_cells(text.encode(), "ch17.ipynb")
    assert words in str(e.value) and SHAPE in str(e.value) and NOTEBOOK_SHAPE in str(e.value)


def test_not_json_is_a_clear_error():
    with pytest.raises(SubmissionError, match="ch17.ipynb is not a notebook: not JSON"):
        notebook_cells(b"{ this is not json", "ch17.ipynb")


def test_a_lone_surrogate_in_a_cell_is_a_clear_error():
    with pytest.raises(SubmissionError, match="lone UTF-16 surrogate"):
        notebook_cells(json.dumps({"cells": [code_cell("x = '\ud800'")]}).encode(), "ch17.ipynb")


def test_only_code_cells_count_against_the_bound():
    outputs = [{"output_type": "stream", "name": "stdout", "text": "x" * (3 << 20)}]
    nb = {"cells": [{"cell_type": "markdown", "source": "y" * (3 << 20)},
                    dict(code_cell(["a = 1\n", "b = 2\n"]), outputs=outputs)]}
    assert notebook_cells(b"\xef\xbb\xbf" + json.dumps(nb).encode(), "ch17.ipynb") == ["a = 1\nb = 2\n"]
    with pytest.raises(SubmissionError, match="code cells hold over 1 MiB of code"):
        notebook_cells(json.dumps({"cells": [code_cell("#" * (MAX_MODULE_BYTES + 1))]}).encode(), "ch17.ipynb")


def test_a_notebook_file_over_its_bound_is_refused_unread(tmp_path):
    with open(tmp_path / "ch17.ipynb", "wb") as f:
        f.truncate(65 << 20)
    with pytest.raises(SubmissionError, match="is 65 MiB, over the 64 MiB a notebook may have"):
        cells_of(tmp_path / "ch17.ipynb")


def test_cells_of_reads_through_grader_submission(tmp_path):
    (tmp_path / "nb.ipynb").write_text(json.dumps({"cells": [code_cell("x = 1")]}))
    assert cells_of(tmp_path / "nb.ipynb") == ["x = 1"]
    (tmp_path / "link.ipynb").symlink_to(tmp_path / "nb.ipynb")
    with pytest.raises(ValueError, match="symbolic link"):  # SubmissionError is a ValueError, as before
        cells_of(tmp_path / "link.ipynb")
    (tmp_path / "bad.ipynb").write_text('{"cells": NaN}')
    with pytest.raises(ValueError, match='its "cells" is NaN'):
        cells_of(tmp_path / "bad.ipynb")


# -- compiling --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("source, words", [
    ("x = " + "-" * 100_000 + "1", "MemoryError"),
    ("x = " + " + ".join(["1"] * 100_000), "RecursionError"),
    ("x = 1\0\n", "contains a NUL byte"),
    ("def causal_mask(:\n", "does not parse: SyntaxError at line 1"),
])
def test_a_module_python_cannot_compile_is_one_clear_error(source, words):
    with pytest.raises(SubmissionError, match=words):
        compile_module(source, "m.py", "m.py")


@pytest.mark.parametrize("cell", ["x = " + "-" * 100_000 + "1", "x = " + " + ".join(["1"] * 100_000), "x = 1\0"])
def test_assemble_survives_cells_the_parser_cannot_take(cell):
    module = assemble(CH17, [cell, SOLUTION.decode()])
    assert "torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()" in module


def test_a_notebook_whose_graded_cell_cannot_compile_is_one_clear_error(tmp_path):
    cell = "def causal_mask(num_tokens):\n    return " + " + ".join(["1"] * 100_000) + "\n"
    (tmp_path / "ch17.ipynb").write_text(json.dumps({"cells": [code_cell(cell)]}))
    with pytest.raises(SubmissionError, match="ch17.ipynb cannot be compiled: .*RecursionError"):
        read_answer(tmp_path, "ch17.ipynb", CH17)


def test_a_good_answer_is_its_own_bytes(tmp_path):
    (tmp_path / CH17.filename).write_bytes(b"\xef\xbb\xbf" + SOLUTION)
    answer = read_answer(tmp_path, CH17.filename, CH17)
    assert answer.source == b"\xef\xbb\xbf" + SOLUTION and answer.text == SOLUTION.decode()
