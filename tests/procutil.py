"""Process and port checks for tests, independent of the code under test."""

from __future__ import annotations

import socket
from pathlib import Path


def running(pid: int) -> bool:
    """A zombie is dead, a missing /proc entry is dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def accepts(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
