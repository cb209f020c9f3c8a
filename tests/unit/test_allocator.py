import platform
import subprocess
import sys

import pytest

CHECK = """
import sys
from transformer_mt.allocator import configure_allocator
print(configure_allocator())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_the_threshold_is_fixed_unless_the_user_chose_one(monkeypatch):
    run = lambda: subprocess.run([sys.executable, "-c", CHECK], capture_output=True,  # noqa: E731
                                 text=True, check=True).stdout.strip()
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert run() == "True"
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert run() == "False"
