"""CPU memory limits the way ``batchfit probe --exec`` applies them, for processes a harness starts itself:
a fresh memory cgroup around a command's whole process tree (v1 or v2, made under the cgroup this process is
in, as ``src/device/cgroup.rs`` makes a trial's), or ``RLIMIT_DATA`` on each of its processes.

A harness that judges batchfit's answer (the true-maximum scan of a user's command) or runs a peer under
"the same limit" must use the same *mechanism* as the plan (its ``limit_mechanism``: ``cgroup-v2``,
``cgroup-v1`` or ``rlimit-data``), because the two are different bounds: a cgroup counts the resident memory
of the whole tree (page cache included, reclaimable), ``RLIMIT_DATA`` each process's data segment (reserved
address space included) on its own. Their failures differ too: over ``RLIMIT_DATA`` an allocation fails and
the program sees an error (``DefaultCPUAllocator: can't allocate memory``, ``MemoryError``); over a cgroup's
limit nothing fails in the program: the kernel's OOM killer ends a process of the group with SIGKILL.

Standard library only. Creating a cgroup needs the right to (root, or a delegated cgroup); ``cgroup_parent``
says why not when it cannot.
"""
import os
import signal
import time

from .procs import limit_data

MECHANISMS = ("cgroup-v2", "cgroup-v1", "rlimit-data")


class CgroupError(RuntimeError):
    pass


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _write(path, value):
    with open(path, "w") as f:
        f.write(value)


def cgroup_parent():
    """(version "v1"/"v2", directory) of the cgroup this process is in, for the memory controller — where
    batchfit would make its trials' groups (``cgroup::parent``). Raises CgroupError with the reason."""
    own = _read("/proc/self/cgroup")
    if own is None:
        raise CgroupError("cannot read /proc/self/cgroup")
    for line in own.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and "memory" in parts[1].split(","):
            d = os.path.join("/sys/fs/cgroup/memory", parts[2].lstrip("/"))
            if os.path.exists(os.path.join(d, "memory.limit_in_bytes")):
                return "v1", d
    path = next((l[3:] for l in own.splitlines() if l.startswith("0::")), None)
    if path is None:
        raise CgroupError("no cgroup v2 entry and no v1 memory controller in /proc/self/cgroup")
    base = next((b for b in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")
                 if os.path.exists(os.path.join(b, "cgroup.controllers"))), None)
    if base is None:
        raise CgroupError("no cgroup v2 hierarchy mounted")
    d = os.path.join(base, path.lstrip("/"))
    if "memory" not in (_read(os.path.join(d, "cgroup.controllers")) or "").split():
        raise CgroupError(f"the memory controller is not available to this process's cgroup ({d})")
    if "memory" not in (_read(os.path.join(d, "cgroup.subtree_control")) or "").split():
        try:
            _write(os.path.join(d, "cgroup.subtree_control"), "+memory")
        except OSError as e:
            raise CgroupError(f"cannot enable the memory controller for child groups of {d} ({e})") from None
    return "v2", d


class MemoryCgroup:
    """A memory cgroup limited to `limit` bytes without swap, under `parent` (cgroup_parent()); its
    processes killed and the group removed by close() (also as a context manager)."""

    def __init__(self, parent, name, limit):
        self.version, base = parent
        self.dir = os.path.join(base, name)
        try:
            os.mkdir(self.dir)
        except OSError as e:
            raise CgroupError(f"cannot create the memory cgroup {self.dir}: {e}") from None
        try:
            if self.version == "v2":
                _write(self._f("memory.max"), str(limit))
                if os.path.exists(self._f("memory.swap.max")):
                    _write(self._f("memory.swap.max"), "0")
            else:
                _write(self._f("memory.limit_in_bytes"), str(limit))
                if os.path.exists(self._f("memory.memsw.limit_in_bytes")):
                    _write(self._f("memory.memsw.limit_in_bytes"), str(limit))
                else:
                    _write(self._f("memory.swappiness"), "0")
        except OSError as e:
            self.close()
            raise CgroupError(f"cannot set the limit of {self.dir}: {e}") from None
        self.procs = self._f("cgroup.procs")

    def _f(self, name):
        return os.path.join(self.dir, name)

    @property
    def mechanism(self):
        return f"cgroup-{self.version}"

    def join(self):
        """Moves the calling process into the group (in a child between fork and exec)."""
        _write(self.procs, "0")

    def _value(self, name):
        v = _read(self._f(name))
        try:
            return int(v.strip()) if v is not None else None
        except ValueError:
            return None

    def peak(self):
        return self._value("memory.peak" if self.version == "v2" else "memory.max_usage_in_bytes")

    def oom_kills(self):
        text = _read(self._f("memory.events" if self.version == "v2" else "memory.oom_control")) or ""
        for line in text.splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def pids(self):
        return [int(l) for l in (_read(self.procs) or "").split()]

    def kill_all(self):
        if self.version == "v2":
            try:
                _write(self._f("cgroup.kill"), "1")
                return
            except OSError:
                pass
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self):
        for _ in range(200):
            self.kill_all()
            try:
                os.rmdir(self.dir)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class Limit:
    """One application of a limit of `limit` bytes by `mechanism` (one of MECHANISMS) to one command: use
    ``with Limit(...) as lim:`` around the run and pass ``lim.child_setup`` to ``procs.run_cmd``; afterwards
    ``lim.evidence()`` says what the kernel saw (the cgroup's OOM kills and peak; nothing for RLIMIT_DATA)."""

    counter = 0

    def __init__(self, mechanism, limit, tag="harness"):
        if mechanism not in MECHANISMS:
            raise ValueError(f"unknown limit mechanism {mechanism!r} (one of {', '.join(MECHANISMS)})")
        self.mechanism, self.limit, self.tag = mechanism, int(limit), tag
        self.group = None

    def __enter__(self):
        if self.mechanism.startswith("cgroup"):
            parent = cgroup_parent()
            want = self.mechanism.split("-")[1]
            if parent[0] != want:
                raise CgroupError(f"this machine's memory cgroups are {parent[0]}, not {want}")
            Limit.counter += 1
            self.group = MemoryCgroup(parent, f"{self.tag}-{os.getpid()}-{Limit.counter}", self.limit)
        return self

    def child_setup(self):
        if self.group is not None:
            self.group.join()
        else:
            limit_data(self.limit)

    def evidence(self):
        if self.group is None:
            return {}
        return {"cgroup_oom_kills": self.group.oom_kills(), "cgroup_peak_bytes": self.group.peak()}

    def __exit__(self, *exc):
        if self.group is not None:
            self.group.close()
        return False
