#!/usr/bin/env python3
"""How long it takes to fault in a fresh segment, by the unit the page cache is filled in.

The store warms the next segment with MADV_POPULATE_WRITE in 1 MiB calls (docs/benchmarks.md,
"The tail"). On a fresh, allocated (not yet written) ext4 file, each first write fault reads the
page first: the kernel fills (zero-fills) a whole read-ahead window or folio in one page fault,
which a PREEMPT_NONE kernel does not interrupt. This script warms one fresh file per variant and
prints the total time, the longest single call (a writer on the same vCPU waits that long) and
how much of the file ended up mapped in 2 MiB pieces (FilePmdMapped in /proc/self/smaps):

  default   MADV_POPULATE_WRITE, 1 MiB a call (what the store does)
  huge      MADV_HUGEPAGE and MADV_RANDOM first: each fault fills one 2 MiB folio
  willneed  MADV_WILLNEED 256 KiB a step, then the populate: 4 KiB folios
  heat      before each 8 MiB of the file, 8 MiB of anonymous memory in transparent huge pages
            faulted in and unmapped (its time counts in the total, not in the longest call: a
            huge page is zeroed 4 KiB at a time, with a chance to reschedule between them)

Each variant waits --pause seconds before it starts, so that memory the previous one freed has
been taken back by the host (free page reporting) and no variant fills memory another freed.

Usage: warm_fill.py [--dir DIR] [--mib 256] [--rounds 3] [--pause 3]
(DIR on the data disk; default cwd)
"""

import argparse
import ctypes
import mmap
import os
import time

MADV_POPULATE_WRITE = 23  # Linux 5.14+
MIB = 1 << 20
HUGE = 2 * MIB
HEAT_STEP = 8 * MIB


def heat(size):
    """Faults in `size` bytes of anonymous memory as transparent huge pages, then unmaps it."""
    anon = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    start = ctypes.addressof(ctypes.c_char.from_buffer(anon))
    skip = (HUGE - start % HUGE) % HUGE
    anon.madvise(mmap.MADV_HUGEPAGE, skip, size)
    anon.madvise(MADV_POPULATE_WRITE, skip, size)
    anon.close()


def pmd_mapped_kib(address):
    """FilePmdMapped of the mapping at `address`, from /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "FilePmdMapped:":
                return int(line.split()[1])
    return 0


def warm(path, size, variant):
    with open(path, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, size)
    fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, size)
        address = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        if variant == "huge":
            mm.madvise(mmap.MADV_HUGEPAGE)
            mm.madvise(mmap.MADV_RANDOM)
        calls = []
        started = time.perf_counter()
        for at in range(0, size, MIB):
            if variant == "heat" and at % HEAT_STEP == 0:
                heat(min(HEAT_STEP, size - at))
            t = time.perf_counter()
            if variant == "willneed":
                for step in range(at, at + MIB, 256 * 1024):
                    mm.madvise(mmap.MADV_WILLNEED, step, 256 * 1024)
            mm.madvise(MADV_POPULATE_WRITE, at, MIB)
            calls.append(time.perf_counter() - t)
        total = time.perf_counter() - started
        pmd = pmd_mapped_kib(address) // 1024
        del address
        mm.close()
        return total, max(calls), sum(c > 0.003 for c in calls), pmd
    finally:
        os.close(fd)
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=".")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pause", type=float, default=3.0)
    args = ap.parse_args()
    size = args.mib * MIB
    path = os.path.join(args.dir, f"warm_fill.{os.getpid()}")
    print(f"{args.mib} MiB per fresh file, 1 MiB MADV_POPULATE_WRITE calls")
    print("variant   round  total s  longest call ms  calls > 3 ms  PMD-mapped MiB")
    for r in range(args.rounds):
        for variant in ("default", "huge", "willneed", "heat"):
            time.sleep(args.pause)
            total, longest, slow, pmd = warm(path, size, variant)
            print(f"{variant:9} {r + 1:5}  {total:7.3f}  {longest * 1e3:15.1f}  {slow:12}  {pmd:14}")


if __name__ == "__main__":
    main()
