"""The memory allocator of `tmt train`: tcmalloc when it is installed, glibc's malloc otherwise.

A training step allocates and frees hundreds of activation tensors of every size. glibc's malloc
serves them from one heap whose freed holes it reuses poorly: at base size and 4,096-token
batches the peak RSS is 4.2 GB, about 1.2 GB of it freed heap. tcmalloc (gperftools, Debian's
`libtcmalloc-minimal4`) keeps size-classed free lists and reuses them: 3.1 GB, and faster
(README, Performance). The allocator is fixed when the process starts, so `tmt train` runs
itself again once, before anything is imported, with tcmalloc in LD_PRELOAD. Set
TMT_ALLOCATOR=system to keep glibc's malloc; a malloc already in LD_PRELOAD is left alone.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV = "TMT_ALLOCATOR"                 # auto (default): tcmalloc when found | system
_DONE = "TMT_ALLOCATOR_CHOSEN"        # set in the re-executed process: never twice
TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                "/usr/lib", "/usr/local/lib")
# gperftools prints a line for every allocation above 1 GB by default; a large corpus array is
# not news.
_QUIET_LARGE_ALLOCATIONS = {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(1 << 40)}


def find_tcmalloc(dirs: tuple[str, ...] = LIBRARY_DIRS) -> str | None:
    for directory in dirs:
        for name in TCMALLOC_NAMES:
            path = Path(directory) / name
            if path.is_file():
                return str(path)
    return None


def preload_environment(environ: dict[str, str], platform: str,
                        tcmalloc: str | None) -> dict[str, str] | None:
    """The environment to run again with, or None to stay as we are."""
    if environ.get(ENV, "auto") != "auto" or _DONE in environ or tcmalloc is None:
        return None
    if not platform.startswith("linux") or "malloc" in environ.get("LD_PRELOAD", ""):
        return None
    preload = ":".join(p for p in (tcmalloc, environ.get("LD_PRELOAD", "")) if p)
    return {**environ, **_QUIET_LARGE_ALLOCATIONS, "LD_PRELOAD": preload, _DONE: "1"}


def reexec_with_tcmalloc() -> None:
    """For `tmt train` only (where it was measured): replace this process by the same command
    with tcmalloc preloaded (same process id, arguments and interpreter options)."""
    environment = preload_environment(dict(os.environ), sys.platform, find_tcmalloc())
    if environment is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, sys.orig_argv, environment)


def allocator_in_use() -> str:
    """What serves malloc in this process, for train.log and scripts/bench.py."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "the platform's malloc"
    for name in ("tcmalloc", "jemalloc", "mimalloc"):
        if f"lib{name}" in maps:
            return name
    return "glibc malloc" if sys.platform.startswith("linux") else "the platform's malloc"


def allocator_report() -> str:
    """The line train.log gets: the allocator, and how to get tcmalloc where it would help."""
    name = allocator_in_use()
    if name == "glibc malloc" and os.environ.get(ENV, "auto") == "auto":
        return (f"memory allocator: {name} (install tcmalloc, e.g. Debian's "
                f"libtcmalloc-minimal4, and tmt train uses it: about 1 GB less at base size, "
                f"and faster; README, Performance)")
    return f"memory allocator: {name}"
