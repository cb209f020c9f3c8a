"""OpenMP settings for the CPU: they must be in the environment before torch is imported.

OpenMP's default wait policy keeps each thread spinning after every parallel region. On a
machine shared with other busy processes, a spinning thread burns the time slice that its
partner needs, and every operator waits for the slower of the two: with 2 threads on the 2
cores of the development machine (a training run and test suites beside), an elementwise op on
a 16 MB tensor took 24 ms with the default policy and 2 ms with passive waiting. On an idle
machine passive waiting costs a few microseconds per parallel region.
"""

from __future__ import annotations

import os


def configure_openmp() -> None:
    """Passive waiting unless the user chose a policy. No effect once torch is imported."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
