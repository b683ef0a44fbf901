"""Process checks shared by tests that kill or stop processes."""

from __future__ import annotations


def alive(pid: int) -> bool:
    """Is process `pid` running? A zombie (dead, not yet reaped by its parent) is not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
