"""The process's memory figures and handing freed heap memory back (glibc)."""

import subprocess
import sys

import pytest

from agentrl.common import memory

# Fragmented heap: 200 MB in 2 KB blocks, every 100th kept, the rest freed. glibc keeps the freed
# pages (they sit between kept blocks, so the heap top cannot shrink) until malloc_trim.
PROGRAM = """
from agentrl.common import memory
blocks = [bytearray(2048) for _ in range(100_000)]
keep = blocks[::100]
del blocks
before = memory.rss_gb()
memory.release()
print(before, memory.rss_gb(), memory.peak_rss_gb())
"""


def test_rss_and_peak_are_this_process_in_gb():
    now, peak = memory.rss_gb(), memory.peak_rss_gb()
    assert 0.005 < now <= peak + 0.01 < 64  # a pytest process holds more than 5 MB and less than 64 GB


@pytest.mark.skipif(not sys.platform.startswith("linux") or memory._glibc() is None, reason="glibc only")
def test_release_hands_freed_heap_pages_back():
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True).stdout
    before, after, peak = map(float, out.split())
    assert peak >= 0.19  # the 200 MB were resident
    assert before - after > 0.15, out  # most of the freed 198 MB left the process


def test_tune_allocator_keeps_an_arena_cap_from_the_environment(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert memory.tune_allocator() is False
