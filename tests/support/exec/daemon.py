#!/usr/bin/env python3
"""Fake training command that leaves a daemon behind: tests that batchfit ends every process of a
trial, escaped ones included, and that a trial whose output pipe stays open still ends.

  daemon.py [--clear-env] [--exit CODE] [--detach] [--hold-mib N] [--wait S] [--outlive S]

Double-forks a daemon (fork, setsid, fork: it leaves the trial's session and process group, and its
parent is gone before batchfit can see it in the tree) that ignores SIGTERM and SIGHUP, keeps the
inherited stdout and stderr open and sleeps forever; prints `daemon: started` and exits with CODE
(default 1) after 0.2 s.
  --clear-env  the daemon re-executes itself with an empty environment (no marker to find it by)
  --detach     the daemon points its stdin, stdout and stderr at /dev/null (as real daemons do)
  --hold-mib N the daemon allocates and touches N MiB and holds them
  --wait S     the main process waits S seconds (not 0.2) before it exits
  --outlive S  the daemon exits by itself S seconds after the main process (not never)
Standard library only.
"""
import os
import signal
import sys
import time


def arg(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def daemon(clear_env):
    if "--detach" in sys.argv:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
    held = bytearray(int(arg("--hold-mib", "0")) * 1024 * 1024)
    held[::4096] = b"\x01" * (len(held) // 4096)
    if clear_env:
        os.execve(sys.executable, [sys.executable, "-c",
                  "import signal, time\n"
                  "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                  "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
                  "time.sleep(20)  # daemon.py-cleared"], {})
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if "--outlive" in sys.argv:
        time.sleep(float(arg("--wait", "0.2")) + float(arg("--outlive", "0")))
        os._exit(0)
    while True:
        time.sleep(3600)


def main():
    clear_env = "--clear-env" in sys.argv
    code = int(sys.argv[sys.argv.index("--exit") + 1]) if "--exit" in sys.argv else 1
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            daemon(clear_env)
        os._exit(0)
    print("daemon: started", flush=True)
    time.sleep(float(arg("--wait", "0.2")))
    sys.exit(code)


if __name__ == "__main__":
    main()
