#!/usr/bin/env python3
"""A job that says what was imported before its own code ran, and which fork server is waiting.

Its first line records which of its packages are already in `sys.modules`: none in a fresh process;
in a trial forked from batchfit's fork server, what the server imported: `torch`, which this script
imports at its top level (read from its text before any trial), and `jinja2`, which it imports only
inside `main` (named by the first trial's report). It also prints the module list of each fork
server batchfit runs beside it (a process with the same parent running the warm bootstrap in its
serving mode). Each step allocates 256 KiB per sample with torch.

  preloaded.py --batch {batch} [--steps {steps}] [--no-report]

With `--no-report` it writes no report (a job without the helper's report runs every trial cold).
"""
import sys

PRELOADED = [m for m in ("torch", "jinja2") if m in sys.modules]

import argparse  # noqa: E402
import os  # noqa: E402

import batchfit_trial as bt  # noqa: E402
import torch  # noqa: E402


def fork_servers():
    """The module lists (JSON, as given) of the fork servers that are this process's siblings."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")[:-1]
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        bootstrap = "-c" in argv and "batchfit's warm trial process" in argv[argv.index("-c") + 1]
        if bootstrap and argv[-1] == "serve" and ppid == os.getppid():
            found.append(argv[-2])
    return found


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--no-report", action="store_true")
    a = p.parse_args()
    import jinja2  # noqa: F401  (inside a function: not read from the text; the first report names it)

    print("preloaded:", ",".join(PRELOADED) or "none", flush=True)
    print("servers:", " ".join(fork_servers()) or "none", flush=True)
    bt.start()
    for _ in range(a.steps):
        x = torch.ones(a.batch, 1 << 18, dtype=torch.uint8)  # out of memory here at the limit
        del x
        bt.step()
    if not a.no_report:
        bt.report(batch=a.batch, accumulation=1)


if __name__ == "__main__":
    main()
