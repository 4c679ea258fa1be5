"""grader.delivery.submission: a student's file read as itself (no link followed, bounded), and every
malformed module or notebook one clear SubmissionError, never another exception."""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
import zipfile
from pathlib import Path

import pytest

from grader import chapters
from grader.delivery import layout
from grader.delivery.cells import assemble, cells_of
from grader.delivery.layout import folder_tree, locate, names_chapter, open_zip, read_found, zip_tree
from grader.delivery.submission import (
    MAX_MODULE_BYTES,
    NOTEBOOK_SHAPE,
    SubmissionError,
    compile_module,
    decode_module,
    notebook_cells,
    open_folder,
    read_answer,
    read_file,
)

CH17 = chapters.find("ch17")
SOLUTION = (chapters.SOLUTIONS / CH17.filename).read_bytes()
SHAPE = 'a list of cells, each with a "source" string or list of strings'


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
        assert locate(folder_tree(ada), CH17, "ada/").path == ("ch17.ipynb",)  # found, so that reading it says it is a link
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
@pytest.mark.parametrize(
    "text, words",
    [
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
    ],
)
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
    nb = {"cells": [{"cell_type": "markdown", "source": "y" * (3 << 20)}, dict(code_cell(["a = 1\n", "b = 2\n"]), outputs=outputs)]}
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
@pytest.mark.parametrize(
    "source, words",
    [
        ("x = " + "-" * 100_000 + "1", "MemoryError"),
        ("x = " + " + ".join(["1"] * 100_000), "RecursionError"),
        ("x = 1\0\n", "contains a NUL byte"),
        ("def causal_mask(:\n", "does not parse: SyntaxError at line 1"),
    ],
)
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


# -- layouts: where in a student's folder or zip the answer is (grader.delivery.layout) --------------------------------
CH25 = chapters.find("ch25")
SOLUTION25 = (chapters.SOLUTIONS / CH25.filename).read_bytes()


def make_files(root: Path, files: dict[str, bytes | str]) -> Path:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    root.mkdir(parents=True, exist_ok=True)
    return root


def located(folder: Path, ch=CH25) -> layout.Found:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return locate(folder_tree(fd), ch, f"{folder.name}/")
    finally:
        os.close(fd)


LAYOUTS = {  # files of a student's folder: (the path found, found under another name)
    "flat": ({CH25.filename: SOLUTION25, "notes.txt": "x"}, (CH25.filename,), False),
    "notebook": ({"ch25.ipynb": "{}"}, ("ch25.ipynb",), False),
    "notebook named as the module": ({"ch25_paged_kv.ipynb": "{}"}, ("ch25_paged_kv.ipynb",), False),
    "the module wins over a notebook": ({CH25.filename: SOLUTION25, "ch25.ipynb": "{}"}, (CH25.filename,), False),
    "one folder down (LMS)": ({f"ch25/{CH25.filename}": SOLUTION25, "ch25/README.md": "x"}, ("ch25", CH25.filename), False),
    "one folder down, any name": ({f"my work/{CH25.filename}": SOLUTION25}, ("my work", CH25.filename), False),
    "the top wins over one down": ({CH25.filename: SOLUTION25, f"old/{CH25.filename}": "x"}, (CH25.filename,), False),
    "misnamed: the chapter id": ({"ch25.py": SOLUTION25, "notes.txt": "x"}, ("ch25.py",), True),
    "misnamed: the slug": ({"paged_kv.py": SOLUTION25}, ("paged_kv.py",), True),
    "misnamed: a copy's name": ({"CH25 (1).ipynb": "{}"}, ("CH25 (1).ipynb",), True),
    "misnamed, one folder down": ({"ch25/paged-kv.py": SOLUTION25}, ("ch25", "paged-kv.py"), True),
    "checkpoints are not searched": ({"ch25.py": SOLUTION25, ".ipynb_checkpoints/ch25-checkpoint.ipynb": "{}"}, ("ch25.py",), True),
}


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_each_accepted_layout_finds_the_answer(tmp_path, case):
    files, path, renamed = LAYOUTS[case]
    found = located(make_files(tmp_path / "alice", files))
    assert (found.path, found.renamed) == (path, renamed)


@pytest.mark.parametrize(
    "name, names_it",
    [
        ("ch25.py", True),
        ("CH25-v2.py", True),
        ("ch25 (1).ipynb", True),
        ("paged_kv.py", True),
        ("Paged-KV (2).py", True),
        ("paged_kv_old.py", True),
        ("ch250.py", False),
        ("ch2.py", False),
        ("ch24.py", False),
        ("solution.py", False),
        ("kv.py", False),
        ("my_paged_kv.py", False),
    ],
)
def test_a_misnamed_file_counts_only_when_its_name_names_the_chapter(name, names_it):
    assert names_chapter(name, CH25) is names_it


@pytest.mark.parametrize(
    "files, doubt",
    [
        ({f"a/{CH25.filename}": "x", f"b/{CH25.filename}": "x"}, [f"a/{CH25.filename}", f"b/{CH25.filename}"]),
        ({"ch25.py": "x", "work/paged_kv.py": "x"}, ["ch25.py", "work/paged_kv.py"]),
    ],
)
def test_two_candidates_on_one_rung_are_not_guessed_between(tmp_path, files, doubt):
    with pytest.raises(SubmissionError) as e:
        located(make_files(tmp_path / "bob", files))
    message = str(e.value)
    assert all(d in message for d in doubt) and "could each be the ch25 answer: keep one" in message, message


def test_nothing_found_says_what_was_expected_and_what_is_there(tmp_path):
    folder = make_files(
        tmp_path / "gina",
        {
            "notes.txt": "x",
            "ch25_paged_kv.txt": "x",
            "work/main.py": "x",
            "solution.py": "x",
            ".ipynb_checkpoints/ch25-checkpoint.ipynb": "{}",
        },
    )
    (folder / "linked").symlink_to(tmp_path)
    with pytest.raises(SubmissionError) as e:
        located(folder)
    message = str(e.value)
    assert message.startswith(f"no {CH25.filename} or ch25.ipynb in gina/, nor one folder down; found: ")
    for words in (
        "ch25_paged_kv.txt (rename it ch25_paged_kv.py)",
        "notes.txt",
        "solution.py",
        "work/ (main.py)",
        "linked (a symbolic link, not followed)",
        "not searched: .ipynb_checkpoints/",
        f"name your file {CH25.filename} (or your notebook ch25.ipynb)",
    ):
        assert words in message, (words, message)


def test_a_folder_that_is_a_link_is_not_entered(tmp_path):
    make_files(tmp_path / "elsewhere", {CH25.filename: SOLUTION25})
    folder = make_files(tmp_path / "eve", {})
    (folder / "ch25").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SubmissionError, match=r"ch25 \(a symbolic link, not followed\)"):
        located(folder)


def test_a_link_one_folder_down_is_found_and_refused_unread(tmp_path):
    folder = make_files(tmp_path / "subs" / "eve", {"ch25/x": ""})
    (folder / "ch25" / CH25.filename).symlink_to(chapters.SOLUTIONS / CH25.filename)
    assert located(folder).path == ("ch25", CH25.filename)
    fd = os.open(tmp_path / "subs", os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(SubmissionError, match=f"^ch25/{CH25.filename} is a symbolic link .*never followed"):
            read_found(fd, "eve", f"ch25/{CH25.filename}", CH25, archive=False)
    finally:
        os.close(fd)


def test_a_nested_answer_is_read_and_its_errors_name_where_it_is(tmp_path):
    make_files(tmp_path / "subs" / "ann", {f"ch25/{CH25.filename}": SOLUTION25, "ch25/ch25.py": "def f(:\n"})
    fd = os.open(tmp_path / "subs", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert read_found(fd, "ann", f"ch25/{CH25.filename}", CH25, archive=False).source == SOLUTION25
        with pytest.raises(SubmissionError, match="^ch25/ch25.py does not parse: SyntaxError at line 1"):
            read_found(fd, "ann", "ch25/ch25.py", CH25, archive=False)
    finally:
        os.close(fd)


# -- zips -------------------------------------------------------------------------------------------------------
def make_zip(path: Path, members: dict[str, bytes | str], *, links: tuple[str, ...] = ()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
        for name in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            z.writestr(info, "/etc/passwd")
    return path


def zip_answer(path: Path, ch=CH25):
    """(the member found, the answer read from it) for a student's zip, as `course grade` reads it."""
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        archive = open_zip(fd, path.name)
        try:
            tree = zip_tree(archive)
        finally:
            archive.close()
        member = tree.name_of(locate(tree, ch, path.name).path)
        return member, read_found(fd, path.name, member, ch, archive=True)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "members, member",
    [
        ({CH25.filename: SOLUTION25}, CH25.filename),
        ({f"alice/{CH25.filename}": SOLUTION25, "alice/README": "x"}, f"alice/{CH25.filename}"),  # one top folder
        ({f"alice/ch25/{CH25.filename}": SOLUTION25, "__MACOSX/alice/._x": "junk"}, f"alice/ch25/{CH25.filename}"),
        ({f"ch25\\{CH25.filename}": SOLUTION25}, f"ch25\\{CH25.filename}"),  # a Windows tool's separators
        ({"work/ch25.py": SOLUTION25, "notes.txt": "x"}, "work/ch25.py"),
    ],
)
def test_a_zip_is_read_in_any_accepted_layout_without_extracting(tmp_path, monkeypatch, members, member):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    zipped = make_zip(tmp_path / "subs" / "alice.zip", members)
    found, answer = zip_answer(zipped)
    assert found == member and answer.source == SOLUTION25
    assert sorted(p.name for p in (tmp_path / "subs").iterdir()) == ["alice.zip"]  # nothing extracted beside it
    assert list(scratch.iterdir()) == []  # the private copy of the one member is gone


@pytest.mark.parametrize(
    "members, links, words",
    [
        ({"/etc/ch25_paged_kv.py": "x"}, (), "an absolute path"),
        ({"C:/ch25_paged_kv.py": "x"}, (), "an absolute path"),
        ({"../ch25_paged_kv.py": "x"}, (), "a path that leaves the zip (..)"),
        ({"a\\..\\..\\ch25_paged_kv.py": "x"}, (), "a path that leaves the zip (..)"),
        ({"notes.txt": "x"}, ("ch25_paged_kv.py",), "a symbolic link: a zip may hold files and folders only"),
    ],
)
def test_a_zip_with_a_hostile_member_is_refused_whole(tmp_path, members, links, words):
    zipped = make_zip(tmp_path / "alice.zip", members, links=links)
    with pytest.raises(SubmissionError) as e:
        zip_answer(zipped)
    assert str(e.value).startswith("alice.zip holds ") and words in str(e.value), str(e.value)
    assert not (tmp_path.parent / CH25.filename).exists() and not (tmp_path / "etc").exists()


def test_a_zip_holding_a_name_twice_is_refused(tmp_path):
    with pytest.warns(UserWarning, match="Duplicate name"):
        zipped = make_zip(tmp_path / "alice.zip", {CH25.filename: SOLUTION25})
        with zipfile.ZipFile(zipped, "a") as z:
            z.writestr(CH25.filename, "print('the other one')")
    with pytest.raises(SubmissionError, match=f"holds '{CH25.filename}' twice"):
        zip_answer(zipped)


@pytest.mark.parametrize(
    "bound, words",
    [
        ("MAX_ZIP_BYTES", "over the 1 KiB a student's zip may have"),
        ("MAX_ZIP_MEMBERS", "holds 3 files and folders, over the 2 a student's zip may have"),
        ("MAX_ZIP_DIRECTORY_BYTES", "has a list of files of"),
        ("MAX_ZIP_UNPACKED", "would unpack to"),
    ],
)
def test_each_zip_bound_is_checked_before_anything_is_decompressed(tmp_path, monkeypatch, bound, words):
    monkeypatch.setattr(
        layout, bound, {"MAX_ZIP_BYTES": 1024, "MAX_ZIP_MEMBERS": 2, "MAX_ZIP_DIRECTORY_BYTES": 100, "MAX_ZIP_UNPACKED": 1 << 20}[bound]
    )
    zipped = make_zip(tmp_path / "alice.zip", {CH25.filename: SOLUTION25, "a.txt": "x" * (1 << 20), "b.txt": "y"})
    assert zipped.stat().st_size > 1024  # the solution does not compress below the bound
    with pytest.raises(SubmissionError, match=re.escape(words)):
        zip_answer(zipped)


def test_a_member_over_the_module_bound_is_refused_though_it_compresses_well(tmp_path):
    zipped = make_zip(tmp_path / "alice.zip", {CH25.filename: "#" * (MAX_MODULE_BYTES + 1)})
    assert zipped.stat().st_size < 10_000
    with pytest.raises(SubmissionError, match=f"alice.zip: {CH25.filename} is 1 MiB, over the 1 MiB a chapter file"):
        zip_answer(zipped)


def _patched(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    assert data.count(old) == 1
    path.write_bytes(data.replace(old, new))


def test_an_encrypted_or_damaged_member_is_that_zips_error(tmp_path):
    zipped = make_zip(tmp_path / "alice.zip", {CH25.filename: SOLUTION25})
    with zipfile.ZipFile(zipped) as z:
        info = z.getinfo(CH25.filename)
    data = bytearray(zipped.read_bytes())
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)  # the compressed bytes, after the header
    damaged = bytearray(data)
    damaged[start + info.compress_size // 2] ^= 0xFF
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "alice.zip").write_bytes(bytes(damaged))
    with pytest.raises(SubmissionError, match=f"^alice.zip: {CH25.filename} cannot be read from the zip .*zip it again"):
        zip_answer(tmp_path / "damaged" / "alice.zip")
    central = data.rindex(b"PK\x01\x02")  # the encryption flag, as the central directory gives it
    data[central + 8 : central + 10] = (info.flag_bits | 1).to_bytes(2, "little")
    zipped.write_bytes(bytes(data))
    with pytest.raises(SubmissionError, match="is encrypted: zip it without a password"):
        zip_answer(zipped)


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p.write_bytes(b"PK\x03\x04 not really a zip"), "is not a zip file (it has no end of central directory"),
        (lambda p: p.symlink_to(chapters.SOLUTIONS / CH25.filename), "is a symbolic link: links are never followed"),
        (lambda p: os.mkfifo(p), "is a FIFO (named pipe), not a zip file"),
    ],
)
def test_what_is_not_a_readable_zip_is_one_clear_error(tmp_path, make, words):
    make(tmp_path / "alice.zip")
    with pytest.raises(SubmissionError, match=re.escape(words)):
        zip_answer(tmp_path / "alice.zip")


def test_a_truncated_zip_is_one_clear_error(tmp_path):
    zipped = make_zip(tmp_path / "alice.zip", {CH25.filename: SOLUTION25})
    data = zipped.read_bytes()
    zipped.write_bytes(data[:200] + data[-22:])  # its end record still there, pointing at nothing
    with pytest.raises(SubmissionError, match="alice.zip is not a zip file that can be read"):
        zip_answer(zipped)


def test_a_folder_under_the_answers_name_in_a_zip_is_refused(tmp_path):
    zipped = make_zip(tmp_path / "alice.zip", {f"{CH25.filename}/inside.py": "x", "notes.txt": "x"})
    with pytest.raises(SubmissionError, match=f"^alice.zip: {CH25.filename} is a folder, not a file"):
        zip_answer(zipped)
