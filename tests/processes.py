"""Process-tree helpers for tests that look at the grader's processes from outside."""
import os
from pathlib import Path


def children_of(pid: int) -> list[int]:
    """Pids whose parent is `pid`, read from /proc."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
        except (OSError, IndexError, ValueError):
            pass
    return found
