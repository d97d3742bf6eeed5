"""`keystone run` keeps one malloc arena for all its threads (evaluations.cli_commands.
one_malloc_arena): glibc would give each thread one of its own, each keeping the memory
freed in it (issue 18). Read from glibc itself: malloc_info lists one <heap> per arena."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    import ctypes, os, sys, tempfile, threading

    if sys.argv[1] == "one":
        from evaluations.cli_commands import one_malloc_arena
        one_malloc_arena()

    def work():
        kept = [bytes(2000) for _ in range(2000)]  # past pymalloc's 512 bytes: malloc's
        del kept

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    handle, path = tempfile.mkstemp()
    os.close(handle)
    stream = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    print(open(path).read().count("<heap nr="))
    os.unlink(path)
    """
)


def arenas(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


def test_threads_share_one_malloc_arena() -> None:
    assert arenas("glibc's default") > 1  # what the setting changes: an arena per thread
    assert arenas("one") == 1
