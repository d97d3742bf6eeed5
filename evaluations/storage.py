"""Where artifact blobs are written in the embedded default and on a single host.

Every execution writes a few small blobs (stdout, the artifact summary, a trace), each one
new and written whole from memory by the one worker that made it. Django's
FileSystemStorage writes a file for any caller: an exclusive lock on the open file (for a
file others may write at once), a buffered file object over the descriptor, the content
copied chunk by chunk, then the mode and the group set through the path. That is about a
dozen system calls and 0.12 ms of Python per blob, twice or more per execution, all of it
holding the GIL the run's other executions wait for (issue 18). ArtifactStorage writes the
same file, with the same name, mode and group, through its descriptor: open (O_EXCL, so a
name taken since get_available_name chose it is never overwritten), write, fchmod, the
group compared with the root's, close. The directory is made only when the open finds it
missing, and a write that fails removes the file. Everything else (names, reads,
deletes, listings, URLs) is FileSystemStorage's.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from django.core.files.storage import FileSystemStorage

# What FileSystemStorage makes its directories with (django-stubs does not list it yet).
from django.utils._os import safe_makedirs  # type: ignore[attr-defined]


class ArtifactStorage(FileSystemStorage):
    def _save(self, name: str, content: Any) -> str:
        full_path = self.path(name)
        fd = self._create(full_path)
        while fd is None:  # the name was taken since it was chosen: choose again
            name = self.get_available_name(name)
            full_path = self.path(name)
            fd = self._create(full_path)
        try:
            for chunk in content.chunks():
                data = memoryview(chunk.encode() if isinstance(chunk, str) else chunk)
                while data:
                    data = data[os.write(fd, data) :]
            if self.file_permissions_mode is not None:
                os.fchmod(fd, self.file_permissions_mode)
            self._same_group_as_location(fd)
        except BaseException:
            os.close(fd)
            os.unlink(full_path)  # nothing half-written stays behind
            raise
        os.close(fd)
        return os.path.relpath(full_path, self.location).replace("\\", "/")

    def _create(self, full_path: str) -> int | None:
        """A descriptor of the new, empty file; None when the name exists already."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            return os.open(full_path, flags, 0o666)
        except FileExistsError:
            return None
        except FileNotFoundError:  # the directory's first file: make the directory
            directory = os.path.dirname(full_path)
            if self.directory_permissions_mode is not None:
                safe_makedirs(directory, self.directory_permissions_mode, exist_ok=True)
            else:
                os.makedirs(directory, exist_ok=True)
        try:
            return os.open(full_path, flags, 0o666)
        except FileExistsError:
            return None

    def _same_group_as_location(self, fd: int) -> None:
        """As FileSystemStorage does: the file takes the storage root's group where the
        process may give it (a root shared with a web server's group, say)."""
        location_gid = os.stat(self.location).st_gid
        if os.fstat(fd).st_gid != location_gid:
            with contextlib.suppress(PermissionError):
                os.fchown(fd, -1, location_gid)
