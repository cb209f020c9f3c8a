"""glibc malloc settings for training on a CPU: a fixed mmap threshold.

glibc serves a request of at least M_MMAP_THRESHOLD bytes with its own mmap, returned to the
system when freed; smaller ones come from the heap, which keeps what is freed for reuse. By
default the threshold moves: each time a mapped block is freed, it rises to that block's size
(up to 32 MB). A training step frees its activations (blocks of 1-32 MB) at the end, so after the
first step nearly every tensor is carved from the heap, and the mix of sizes and lifetimes of
one step fragments it: at base size with 4,096-token batches the process held ~3.4 GB after four
steps whose live memory never exceeded ~2.8 GB (`/tmp`-style phase measurement in the README).

Fixing the threshold (which also stops it moving) at 4 MB keeps the many small and medium
tensors in the heap, where they are reused without page faults, and maps the large activations
separately so that they never fragment it. The user's own MALLOC_MMAP_THRESHOLD_ wins.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_MMAP_THRESHOLD = -3           # mallopt's parameter number (glibc malloc.h)
MMAP_THRESHOLD_BYTES = 4 << 20


def configure_allocator() -> bool:
    """Fix glibc's mmap threshold (Linux with glibc only; a no-op elsewhere or when the user set
    MALLOC_MMAP_THRESHOLD_). Returns whether it was set."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):           # musl and other C libraries
        return False
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
