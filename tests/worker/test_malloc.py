"""The worker hands memory a burst freed back to the OS, instead of holding its highest burst for good."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

# A burst of malloc'd blocks (over pymalloc's 512 bytes), freed but for every sixteenth, which
# pins the heap: glibc alone would return nothing, as nothing free sits at its top.
_BURST = textwrap.dedent(
    """
    from futures.worker.malloc import FreedMemory, resident_bytes
    work = [0]
    freed = FreedMemory(lambda: work[0], after_bytes=32 * 1024 * 1024, quiet_below=1000)
    before = freed.due()
    blocks = [bytearray(4096) for _ in range(50_000)]
    kept = blocks[::16]
    del blocks
    work[0] += 5000  # still busy: what is freed would be reused at once
    busy = freed.due()
    grown, held = freed.due(), resident_bytes()  # a quiet look
    released = freed.release()
    print(before, busy, grown, held, released, resident_bytes(), freed.due())
    """
)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_memory_a_burst_freed_is_handed_back_once_it_is_over() -> None:
    out = subprocess.run([sys.executable, "-c", _BURST], capture_output=True, text=True, check=True).stdout
    before, busy, grown, held, released, after, again = out.split()
    # Only after growth, once quiet, and once.
    assert (before, busy, grown, again) == ("False", "False", "True", "False")
    burst = 50_000 * 4096
    assert int(released) > burst * 0.7
    assert int(after) < int(held) - burst * 0.7
