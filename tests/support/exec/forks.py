#!/usr/bin/env python3
"""A fork-heavy fake training job for tests of the tree's memory figure (standard library only): the
shape of a DataLoader with forked workers.

  forks.py BATCH [--shared-mib N] [--own-mib N] [--own-mib-per-sample M] [--readers N]
                 [--owners N] [--hold S]

The parent touches N MiB (default 200) of its own anonymous memory, then forks `--readers` workers
(default 3) that only read it (their pages stay shared with the parent, copy-on-write) and `--owners`
workers (default 1) that each touch `--own-mib` (default 40) + BATCH × `--own-mib-per-sample`
(default 0) MiB of their own. Every process holds its memory for `--hold` seconds (default 0.6) so
that the device's samples see them all at once; then the workers exit 0 and so does the parent.
Nothing prints a word about memory: a worker that cannot allocate exits 3 silently.

Each page is resident once: a memory cgroup around the tree charges ~N + own MiB (plus each Python's
few MiB), while the summed `RssAnon` of the processes counts the shared N MiB once per process.
"""
import os
import sys
import time

batch = int(sys.argv[1])
shared_mib, own_mib, per_sample, readers, owners, hold = 200, 40, 0, 3, 1, 0.6
args = sys.argv[2:]
while args:
    flag, value = args[0], args[1]
    if flag == "--shared-mib":
        shared_mib = int(value)
    elif flag == "--own-mib":
        own_mib = int(value)
    elif flag == "--own-mib-per-sample":
        per_sample = int(value)
    elif flag == "--owners":
        owners = int(value)
    elif flag == "--readers":
        readers = int(value)
    elif flag == "--hold":
        hold = float(value)
    else:
        sys.exit(f"forks.py: unknown flag {flag}")
    args = args[2:]

PAGE = 4096
shared = bytearray(shared_mib << 20)
for i in range(0, len(shared), PAGE):
    shared[i] = 1


def reader():
    total = 0
    for i in range(0, len(shared), PAGE):
        total += shared[i]  # a read: the page stays shared with the parent
    time.sleep(hold)
    os._exit(0 if total == len(shared) // PAGE else 3)


def owner():
    try:
        own = bytearray((own_mib + batch * per_sample) << 20)
    except MemoryError:
        os._exit(3)
    for i in range(0, len(own), PAGE):
        own[i] = 1
    time.sleep(hold)
    os._exit(0)


children = []
for k in range(readers + owners):
    pid = os.fork()
    if pid == 0:
        reader() if k < readers else owner()
    children.append(pid)
time.sleep(hold)
failed = 0
for pid in children:
    _, status = os.waitpid(pid, 0)
    failed += status != 0
print(f"batch {batch}: {readers} readers and {owners} owners done", flush=True)
sys.exit(1 if failed else 0)
