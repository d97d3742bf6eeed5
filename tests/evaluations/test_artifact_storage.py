"""The artifact storage (evaluations.storage.ArtifactStorage): the files Django's
FileSystemStorage would write, written through one descriptor (issue 18)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage, default_storage

from evaluations.storage import ArtifactStorage


def test_artifacts_are_written_by_artifact_storage() -> None:
    assert settings.STORAGES["default"]["BACKEND"] == "evaluations.storage.ArtifactStorage"
    assert isinstance(default_storage, ArtifactStorage)


@pytest.mark.parametrize("content", [b"bytes \xe2\x9c\x93", "text \u2713"])
def test_a_blob_is_stored_as_filesystem_storage_stores_it(
    tmp_path: Path, content: bytes | str
) -> None:
    ours = ArtifactStorage(location=tmp_path / "ours", file_permissions_mode=0o640)
    django = FileSystemStorage(location=tmp_path / "django", file_permissions_mode=0o640)
    names = [
        storage.save("runs/1/executions/2/stdout.txt", ContentFile(content))
        for storage in (ours, django)
    ]
    assert names[0] == names[1] == "runs/1/executions/2/stdout.txt"
    written = [tmp_path / root / names[0] for root in ("ours", "django")]
    assert written[0].read_bytes() == written[1].read_bytes()
    assert written[0].read_bytes() == (content if isinstance(content, bytes) else content.encode())
    assert stat.S_IMODE(written[0].stat().st_mode) == 0o640
    with ours.open(names[0]) as handle:
        assert handle.read() == written[1].read_bytes()


def test_a_large_blob_is_written_whole(tmp_path: Path) -> None:
    storage = ArtifactStorage(location=tmp_path)
    data = os.urandom(3 * 1024 * 1024 + 17)  # several of ContentFile's 64 KiB chunks
    name = storage.save("runs/1/big.bin", ContentFile(data))
    assert (tmp_path / name).read_bytes() == data


def test_a_name_taken_is_never_overwritten(tmp_path: Path) -> None:
    storage = ArtifactStorage(location=tmp_path)
    first = storage.save("runs/1/artifact.json", ContentFile(b"first"))
    second = storage.save("runs/1/artifact.json", ContentFile(b"second"))
    assert first != second
    assert (tmp_path / first).read_bytes() == b"first"
    assert (tmp_path / second).read_bytes() == b"second"
    # Taken between get_available_name and the write (another worker's file): O_EXCL sees it.
    third = storage._save(first, ContentFile(b"third"))
    assert third not in (first, second)
    assert (tmp_path / first).read_bytes() == b"first"
    assert (tmp_path / third).read_bytes() == b"third"


def test_a_write_that_fails_leaves_no_file(tmp_path: Path) -> None:
    storage = ArtifactStorage(location=tmp_path)

    class Broken(ContentFile):
        def chunks(self, chunk_size: int | None = None):  # type: ignore[no-untyped-def]
            yield b"half of it"
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        storage.save("runs/1/executions/3/trace.json", Broken(b""))
    assert list((tmp_path / "runs/1/executions/3").iterdir()) == []


def test_a_file_where_the_directory_should_be_is_a_clear_error(tmp_path: Path) -> None:
    storage = ArtifactStorage(location=tmp_path)
    (tmp_path / "runs").write_text("not a directory")
    with pytest.raises((FileExistsError, NotADirectoryError)):
        storage.save("runs/1/stdout.txt", ContentFile(b"x"))
