#!/usr/bin/env python3
"""Fake job whose forked workers fill one shared region together (standard library only): a parent
makes a memfd of MIB MiB and forks 3 workers that each map all of it and touch it, 4 MiB at a time,
in step, then hold it a moment. Each page is one page of shared memory, mapped by 3 processes: a
memory cgroup charges it once.

  memfd_workers.py MIB
"""
import mmap
import os
import sys
import time

size = int(sys.argv[1]) << 20
fd = os.memfd_create("batch")
os.ftruncate(fd, size)
workers = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        region = mmap.mmap(fd, size)
        step = 4 << 20
        for start in range(0, size, step):
            for page in range(start, min(start + step, size), 4096):
                region[page] = 1
            time.sleep(0.002)
        time.sleep(0.5)
        os._exit(0)
    workers.append(pid)
for pid in workers:
    _, status = os.waitpid(pid, 0)
    if status != 0:
        sys.exit(f"memfd_workers.py: worker {pid} failed: {status}")
