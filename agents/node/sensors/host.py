"""The node's own size and name for the agent's inventory: CPU cores, memory, hostname.

Read under a root directory (``/`` on a real node, a fixture tree in tests) so that
``llmgw agent --once --dry-run --sys-root DIR`` describes the machine DIR came from.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

ReadText = Callable[[str], "str | None"]

_KIB_PER_GIB = 1024 * 1024


def cpu_cores(root: str, read_text: ReadText) -> int | None:
    """Logical CPUs the kernel has online, or None when unknown."""
    online = read_text(os.path.join(root, "sys/devices/system/cpu/online"))
    if online is not None:
        count = _count_cpu_list(online)
        if count:
            return count
    # Only the live machine may fall back to the interpreter's view: a fixture tree
    # without the file must not report the host's cores as its own.
    if _is_live_root(root):
        return os.cpu_count()
    return None


def memory_gib(root: str, read_text: ReadText) -> float | None:
    """MemTotal from /proc/meminfo in GiB (one decimal), or None when unknown."""
    text = read_text(os.path.join(root, "proc/meminfo"))
    if text is None:
        return None
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() != "MemTotal":
            continue
        parts = rest.split()
        if not parts or not (parts[0].isascii() and parts[0].isdigit()):
            return None
        kib = int(parts[0])
        return round(kib / _KIB_PER_GIB, 1) if kib > 0 else None
    return None


def hostname(root: str, read_text: ReadText) -> str | None:
    """The node's hostname, from the kernel under the root, or None when unknown."""
    text = read_text(os.path.join(root, "proc/sys/kernel/hostname"))
    if text is not None and text.strip():
        return text.strip()
    if _is_live_root(root):
        return socket.gethostname() or None
    return None


def _count_cpu_list(text: str) -> int:
    """Count the CPUs in a kernel cpu list such as ``0-47,96-143``."""
    count = 0
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        try:
            count += (int(last) - int(first) + 1) if last else 1
        except ValueError:
            return 0
    return count


def _is_live_root(root: str) -> bool:
    return os.path.realpath(root) == "/"
