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
    freed = FreedMemory(after_bytes=32 * 1024 * 1024)
    quiet = freed.due()
    blocks = [bytearray(4096) for _ in range(50_000)]
    kept = blocks[::16]
    del blocks
    grown, held = freed.due(), resident_bytes()
    released = freed.release()
    print(quiet, grown, held, released, resident_bytes(), freed.due())
    """
)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_memory_a_burst_freed_is_handed_back_once_it_passes_the_bound() -> None:
    out = subprocess.run([sys.executable, "-c", _BURST], capture_output=True, text=True, check=True).stdout
    quiet, grown, held, released, after, again = out.split()
    assert (quiet, grown, again) == ("False", "True", "False")  # only after growth, and once
    burst = 50_000 * 4096
    assert int(released) > burst * 0.7
    assert int(after) < int(held) - burst * 0.7
