"""Fresh processes: running one under a time limit and reading its exit status, and setting a Python child
up the way batchfit sets up a trial process.

Parent side (``run_cmd``, ``outcome_of``): every measurement of a harness is a command in a fresh process
(``batchfit probe``, ``batchfit-train --micro-batch N``, a Lightning fit). The command gets its own session,
so a timeout ends its whole tree (batchfit's trial children too), and a parent-death signal, so nothing
outlives a harness that is killed. Its exit status says what happened: 0 it completed, 6 it ran out of
memory (``batchfit-train``'s and the Python probes' convention), or it was stopped for time.

Child side (``reexec_with_malloc_env``, ``limit_data``, ``proc_status``, ``reset_rss_peak``): a Python process
that stands for a training job on CPU runs with batchfit's malloc settings and under ``RLIMIT_DATA``, and
reads its own memory from /proc.
"""
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

# batchfit-train's exit status for "ran out of memory"; the Python probes use the same
EXIT_OOM = 6

# batchfit's malloc set-up of a trial process (it calls mallopt; glibc reads these at start-up)
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_ARENA_MAX": "2", "PYTHONUNBUFFERED": "1"}

# the process group of the command running now, for a signal handler (on_term) to end it
CURRENT = {"pgid": None}


def _child_setup(then=None):
    os.setsid()
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001
        pass
    if then is not None:
        then()


def _kill_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def on_term(signum, frame):
    """A SIGTERM/SIGINT handler: ends the running command's process group, then this process."""
    pg = CURRENT.get("pgid")
    if pg:
        _kill_group(pg, signal.SIGTERM)
        time.sleep(2)
        _kill_group(pg, signal.SIGKILL)
    sys.exit(128 + signum)


def run_cmd(cmd, timeout, stdout_path=None, stderr_path=None, cwd=None, env=None, child_setup=None,
            stdin=None):
    """Runs cmd in its own session with stdout/stderr to the given files; on timeout (seconds; None: no
    limit) SIGTERM to its process group (batchfit writes its partial plan and stops its trial), SIGKILL 15 s
    later. Returns {"rc", "timed_out", "seconds"}, plus "stdout"/"stderr" (text) for a stream given no file.
    child_setup: called in the child after it has its session, before exec (e.g. ``limits.Limit.child_setup``:
    join a memory cgroup, or set RLIMIT_DATA); stdin: as subprocess's (None: inherited)."""
    t0 = time.monotonic()
    timed_out = False
    captured = {}
    with _sink(stdout_path, "stdout", captured) as so, _sink(stderr_path, "stderr", captured) as se:
        try:
            p = subprocess.Popen(cmd, stdout=so, stderr=se, cwd=cwd, env=env, stdin=stdin,
                                 preexec_fn=lambda: _child_setup(child_setup))
        except (OSError, subprocess.SubprocessError) as e:  # (a child_setup that raised: SubprocessError)
            se.write(f"cannot start {cmd[0]}: {e}\n".encode())
            return dict({"rc": 127, "timed_out": False, "seconds": 0.0}, **_read(captured))
        CURRENT["pgid"] = p.pid
        try:
            rc = p.wait(timeout=None if timeout is None else max(1.0, timeout))
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(p.pid, signal.SIGTERM)
            try:
                rc = p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                _kill_group(p.pid, signal.SIGKILL)
                rc = p.wait()
        _kill_group(p.pid, signal.SIGKILL)  # anything of that run still alive (a trial child)
        CURRENT["pgid"] = None
        out = _read(captured)
    return dict({"rc": rc, "timed_out": timed_out, "seconds": round(time.monotonic() - t0, 2)}, **out)


def _sink(path, name, captured):
    if path is not None:
        return open(path, "wb")
    f = tempfile.TemporaryFile()
    captured[name] = f
    return f


def _read(captured):
    out = {}
    for name, f in captured.items():
        f.seek(0)
        out[name] = f.read().decode("utf-8", "replace")
    return out


def outcome_of(r, other="error"):
    """What a run of batchfit-train (or of a Python fit probe) says about its batch: "fits" (exit 0),
    "oom" (exit 6), "timeout" (stopped by run_cmd's limit), else `other` ("{rc}" in it is the exit status)."""
    if r["rc"] == 0:
        return "fits"
    if r["rc"] == EXIT_OOM:
        return "oom"
    if r["timed_out"]:
        return "timeout"
    return other.format(rc=r["rc"])


# ------------------------------------------------------------------------------------------------------
# in the child: a Python process set up like a batchfit trial process
# ------------------------------------------------------------------------------------------------------

def reexec_with_malloc_env():
    """Re-executes this script once with MALLOC_ENV in its environment (glibc reads it only at start-up);
    returns when it is already there."""
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, **MALLOC_ENV))


def limit_data(limit):
    """RLIMIT_DATA = limit bytes, soft and hard (what batchfit's cpu backend limits a trial by)."""
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def proc_status(key):
    """A byte value of /proc/self/status (VmData, VmHWM, ...), or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_rss_peak():
    """Resets VmHWM, so the next proc_status("VmHWM") is the peak from now on."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
