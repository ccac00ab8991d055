"""The session's end removes DeepSpeed's shared-memory buffers that nothing maps any more, and
leaves the ones a live job still maps (shm_leftovers.py says why both)."""

import mmap
import os
import time
import uuid

import pytest

from shm_leftovers import PREFIX, SHM, remove_leftovers

pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this machine")


def test_an_unmapped_buffer_goes_and_a_mapped_one_stays():
    start = time.time() - 1
    tag = uuid.uuid4().hex
    left, held = (SHM / f"{PREFIX}{tag}_{what}" for what in ("left", "held"))
    for path in (left, held):
        path.write_bytes(b"\0" * mmap.PAGESIZE)
    with open(held, "r+b") as f, mmap.mmap(f.fileno(), 0) as mapping:   # a live job's buffer
        try:
            assert remove_leftovers(since=start) >= 1
            assert not left.exists() and held.exists()
        finally:
            mapping.close()
            held.unlink(missing_ok=True)
            left.unlink(missing_ok=True)


def test_a_buffer_older_than_the_session_is_left_alone():
    path = SHM / f"{PREFIX}{uuid.uuid4().hex}_old"
    path.write_bytes(b"\0")
    try:
        os.utime(path, (time.time() - 3600,) * 2)   # made before this session began
        remove_leftovers(since=time.time() - 60)
        assert path.exists()
    finally:
        path.unlink(missing_ok=True)
