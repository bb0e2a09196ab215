"""trainer.allocator: a trainer's large blocks come from glibc's heap and stay there once freed,
in a real process (mallopt is process-wide, so each case runs in one of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

PROBE = """
import ctypes, json, os
import torch
from trainer.allocator import keep_freed_memory

class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Mallinfo2
told = keep_freed_memory(os.environ)
before = libc.mallinfo2()
block = torch.ones(64 * 2**20, dtype=torch.uint8)  # a step's buffer: 64 MiB
held = libc.mallinfo2()
del block
freed = libc.mallinfo2()
print(json.dumps({"told": told, "mapped": held.hblkhd - before.hblkhd,
                  "heap_held": held.arena - before.arena,
                  "heap_freed": freed.arena - before.arena}))
"""
MIB = 2**20


def probe(**environ: str) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    done = subprocess.run([sys.executable, "-c", PROBE], env={**env, **environ}, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_a_large_block_comes_from_the_heap_and_stays_there_once_freed() -> None:
    found = probe()
    assert found["told"] is True
    assert found["mapped"] == 0
    # The heap grew by the block, less what it had free already (32 KiB in one run).
    assert found["heap_held"] >= 63 * MIB
    assert found["heap_freed"] >= 63 * MIB  # kept for the next step, not handed back


def test_an_environment_that_tunes_malloc_keeps_its_choice() -> None:
    found = probe(MALLOC_MMAP_MAX_="65536")  # glibc's default
    assert found["told"] is False
    assert found["mapped"] >= 64 * MIB  # a mapping of its own, unmapped when freed
    assert found["heap_held"] < 64 * MIB


FAULTS = """
import json, os, resource, sys
import torch
from trainer.allocator import keep_freed_memory, reserve

keep_freed_memory(os.environ)
reserved = reserve(int(sys.argv[1]))

def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

before = faults()
block = torch.ones(64 * 2**20, dtype=torch.uint8)  # a first step's buffer, touched
print(json.dumps({"reserved": reserved, "faults": faults() - before}))
"""
PAGES = 64 * MIB // 4096


def faults_of_a_first_block(reserved: int, **environ: str) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    done = subprocess.run([sys.executable, "-c", FAULTS, str(reserved)],
                          env={**env, **environ}, cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_memory_reserved_ahead_takes_a_blocks_page_faults_before_it_is_allocated() -> None:
    cold = faults_of_a_first_block(0)
    warm = faults_of_a_first_block(80 * MIB)
    assert cold["reserved"] is False and warm["reserved"] is True
    assert cold["faults"] >= PAGES * 0.9  # every page of the block faulted in, one by one
    assert warm["faults"] < PAGES * 0.1


def test_nothing_is_reserved_where_malloc_hands_freed_memory_back() -> None:
    found = faults_of_a_first_block(80 * MIB, MALLOC_MMAP_MAX_="65536")
    assert found["reserved"] is False
    assert found["faults"] >= PAGES * 0.9
