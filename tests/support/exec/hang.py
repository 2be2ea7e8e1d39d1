#!/usr/bin/env python3
"""Fake training command that never finishes, with a grandchild: tests that a timeout or Ctrl-C ends the
whole process tree.

  hang.py [--ignore-sigterm] [--grandchild-setsid] [--after-output]

Starts a child process that sleeps forever (for batchfit it is a grandchild), prints
`hang: pid P grandchild G` on stdout (flushed) and sleeps forever itself.
  --ignore-sigterm     both processes ignore SIGTERM and SIGINT (only SIGKILL ends them)
  --grandchild-setsid  the grandchild starts its own session, leaving the process group (a group kill
                       misses it; a cgroup or a walk of the process tree does not)
Standard library only.
"""
import argparse
import os
import signal
import subprocess
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--grandchild-setsid", action="store_true")
    args = p.parse_args()
    ignore = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGINT, signal.SIG_IGN); "
    code = (ignore if args.ignore_sigterm else "") + "import time\nwhile True: time.sleep(3600)"
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.DEVNULL, start_new_session=args.grandchild_setsid
    )
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(f"hang: pid {os.getpid()} grandchild {child.pid}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
