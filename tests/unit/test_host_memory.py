"""``reuse_freed_memory``: a freed large buffer comes back without page faults (glibc, Linux only).

Each case runs in its own interpreter, since the setting is process-wide and cannot be undone.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from nemo_dp.utils.host_memory import glibc

_PROBE = textwrap.dedent(
    """
    import ctypes, resource, sys
    from nemo_dp.utils.host_memory import reuse_freed_memory
    if sys.argv[1] == "on":
        assert reuse_freed_memory()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    n = 64 << 20
    def touch():
        p = libc.malloc(n)
        ctypes.memset(p, 1, n)
        libc.free(p)
    touch()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    touch()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _second_touch_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], check=True, capture_output=True, text=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(glibc() is None, reason="glibc's mallopt on Linux only")
def test_a_freed_buffer_is_reused_instead_of_mapped_again() -> None:
    pages = (64 << 20) // 4096
    # glibc's default: the 64 MiB buffer is mmapped and unmapped, so touching it again faults every page.
    assert _second_touch_faults("off") > pages // 2
    assert _second_touch_faults("on") < pages // 20


def test_off_linux_nothing_is_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    from nemo_dp.utils.host_memory import reuse_freed_memory

    monkeypatch.setattr(sys, "platform", "darwin")
    assert reuse_freed_memory() is False
