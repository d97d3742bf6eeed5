"""output_files.write_whole: a file Keystone writes for its user is there whole or not at all,
on a real file system (an interrupted writer, a write the kernel refuses, a FIFO, a link)."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from checks.output_files import write_whole


def test_writes_the_chunks_and_makes_the_directories(tmp_path: Path) -> None:
    target = tmp_path / "reports" / "nightly" / "run.json"
    assert write_whole(target, ['{"a": ', "1}", "\n", "é"]) == target
    assert target.read_bytes() == '{"a": 1}\né'.encode()
    assert os.listdir(target.parent) == ["run.json"]


def test_a_new_file_gets_the_mode_a_plain_write_would(tmp_path: Path) -> None:
    before = os.umask(0o027)
    try:
        write_whole(tmp_path / "r.xml", ["<testsuites/>"])
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "r.xml").stat().st_mode) == 0o640


def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    target.write_text("old")
    target.chmod(0o600)
    write_whole(target, ["new"])
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o600


def test_an_interrupted_writer_leaves_the_previous_file_as_it_was(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    target.write_text("the last complete report\n")

    def interrupted() -> Iterator[str]:
        yield "x" * 100_000  # on disk already when the writer is stopped
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_whole(target, interrupted())
    assert target.read_text() == "the last complete report\n"
    assert os.listdir(tmp_path) == ["run.json"]  # the partial file is gone too


def test_a_write_the_kernel_refuses_leaves_the_previous_file(
    tmp_path: Path, file_size_limit
) -> None:
    target = tmp_path / "run.json"
    target.write_text("the last complete report\n")
    with file_size_limit(4096), pytest.raises(OSError) as refused:
        write_whole(target, ["y" * 10_000])
    assert refused.value.errno == 27  # EFBIG: File too large
    assert target.read_text() == "the last complete report\n"
    assert os.listdir(tmp_path) == ["run.json"]


def test_a_fifo_is_written_to_as_a_stream(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    write_whole(fifo, ["<testsuites/>", "\n"])
    reader.join(timeout=10)
    assert received == [b"<testsuites/>\n"]
    assert stat.S_ISFIFO(fifo.stat().st_mode)  # not replaced by a regular file


def test_a_link_keeps_pointing_at_the_file_it_names(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    real = tmp_path / "store" / "latest.json"
    real.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    write_whole(link, ["new"])
    assert link.is_symlink() and real.read_text() == "new"
    assert os.listdir(tmp_path / "store") == ["latest.json"]
