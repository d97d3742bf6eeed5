"""Resident memory of a process tree, read from /proc: what the benchmarks report as peak
RSS (sampled while the command runs). Linux only, like the sandboxes."""

from __future__ import annotations

import os
from pathlib import Path


def processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, resident bytes), for every process we can read."""
    page = os.sysconf("SC_PAGE_SIZE")
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue  # it ended while we looked
        # The command name (field 2) may hold spaces and parentheses: split after its ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        found[int(name)] = (int(fields[1]), int(fields[21]) * page)
    return found


def trees(roots: list[int]) -> dict[int, list[tuple[int, int]]]:
    """(pid, resident bytes) of each root and every process under it, from one look at
    /proc (reading every process's stat is the sampler's whole cost)."""
    found = processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in found.items():
        children.setdefault(parent, []).append(pid)
    result = {}
    for root in roots:
        members, stack = [], [root]
        while stack:
            pid = stack.pop()
            if pid in found:
                members.append((pid, found[pid][1]))
                stack.extend(children.get(pid, []))
        result[root] = members
    return result


def tree(root: int) -> list[tuple[int, int]]:
    """(pid, resident bytes) of `root` and every process under it."""
    return trees([root])[root]


def pss(pid: int) -> int:
    """The process's proportional set size in bytes: its resident pages, each shared page
    divided among the processes sharing it (a prefork pool's children share most of their
    memory with their parent, which a sum of resident sets counts once per process)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0  # it ended while we looked
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0
