"""Memory this process may still use (:func:`available_memory`), for the estimate that refuses
a run before it starts (:mod:`lipcli.train.memory`).

On the CPU the figure is the smallest of: ``MemAvailable + SwapFree`` from ``/proc/meminfo``;
the cgroup's limit less its current use (cgroup v2 ``memory.max``/``memory.current``, v1
``memory.limit_in_bytes``/``memory.usage_in_bytes``); the address-space limit (``RLIMIT_AS``,
``ulimit -v``) less this process's ``VmSize``.  Sources that do not exist (not Linux, no limit)
are left out; with none left the figure is unknown (``None``).  On CUDA it is the device's free
memory (``torch.cuda.mem_get_info``).
"""

from __future__ import annotations

from typing import Any

_MEMINFO = "/proc/meminfo"
_STATUS = "/proc/self/status"
_CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))
#: a cgroup v1 "limit" at or above this is no limit (the kernel writes ~2^63 rounded to pages)
_NO_LIMIT = 1 << 60


def _kib_fields(path: str, *names: str) -> dict[str, int]:
    """``name: value in bytes`` of the ``name: N kB`` lines of ``path`` (missing: left out)."""
    found: dict[str, int] = {}
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in names:
                    found[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return found


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):  # "max" (no limit), missing file
        return None


def _cgroup_free() -> int | None:
    for limit_path, usage_path in _CGROUP_FILES:
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is not None and usage is not None and limit < _NO_LIMIT:
            return max(0, limit - usage)
    return None


def _address_space_free() -> int | None:
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    used = _kib_fields(_STATUS, "VmSize").get("VmSize")
    return None if used is None else max(0, soft - used)


def cpu_available() -> tuple[int | None, str]:
    """Bytes of memory this process may still allocate on the CPU, and which limit gave it
    (see the module); ``(None, reason)`` when no source is readable."""
    info = _kib_fields(_MEMINFO, "MemAvailable", "SwapFree")
    candidates: list[tuple[int, str]] = []
    if "MemAvailable" in info:
        candidates.append((info["MemAvailable"] + info.get("SwapFree", 0), "MemAvailable + SwapFree"))
    cgroup = _cgroup_free()
    if cgroup is not None:
        candidates.append((cgroup, "the cgroup's memory limit less its use"))
    address = _address_space_free()
    if address is not None:
        candidates.append((address, "the address-space limit (ulimit -v) less this process's size"))
    if not candidates:
        return None, "no memory figures readable (not Linux?)"
    return min(candidates)


def available_memory(device: Any) -> tuple[int | None, str]:
    """Bytes free for work on ``device`` (a ``torch.device``) and how they were found."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info(device)
        return int(free), "torch.cuda.mem_get_info (free device memory)"
    if getattr(device, "type", "cpu") != "cpu":
        return None, f"no memory figure for {device}"
    return cpu_available()
