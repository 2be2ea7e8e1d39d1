#!/usr/bin/env python3
"""How much the boundary of a Python training job moves between fresh runs under one memory limit, and where
the movement comes from (the measurement behind the guard band, docs/soundness.md "The cgroup boundary is
noisy").

Runs the same command at a few batch sizes near its boundary, each size REPEAT times, every run a fresh
process under the limit applied the way batchfit applies it (a new memory cgroup made under the parent
batchfit uses, or RLIMIT_DATA on the process), and samples while it runs (every --every seconds):

  cgroup: memory.usage_in_bytes and memory.stat (total_rss, total_cache, total_mapped_file, total_shmem)
          of the run's group; kept: the sample at the highest usage and the highest total_rss+total_shmem
          (anonymous); at the end the kernel's max_usage_in_bytes, failcnt and OOM kills;
  both:   the process's VmData (what RLIMIT_DATA bounds), VmRSS and RssAnon/RssFile from /proc/PID/status;
          kept: their peaks.

Writes every run's numbers (raw) to --out as JSON. Standard library and scripts/harness only.

  noise.py --python PY --mechanism cgroup-v1 --limit 1342177280 --sizes 1820,1826,1832 --repeat 5 \\
      --out benches/data/exec_noise.json --tag cgroup/plain -- tests/support/exec/train_mlp.py --input 65536 --hidden 16
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from harness.files import load_json, save_json  # noqa: E402
from harness.limits import Limit  # noqa: E402
from harness.procs import run_cmd  # noqa: E402

STAT_KEYS = ("total_rss", "total_cache", "total_mapped_file", "total_shmem", "total_inactive_file",
             "total_active_file")


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def memstat(d):
    out = {}
    for line in (read(os.path.join(d, "memory.stat")) or "").splitlines():
        k, _, v = line.partition(" ")
        if k in STAT_KEYS:
            out[k] = int(v)
    u = read(os.path.join(d, "memory.usage_in_bytes"))
    if u:
        out["usage"] = int(u)
    return out


def status(pid):
    out = {}
    for line in (read(f"/proc/{pid}/status") or "").splitlines():
        k, _, v = line.partition(":")
        if k in ("VmData", "VmRSS", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0]) * 1024
    return out


class Sampler(threading.Thread):
    def __init__(self, group_dir, every):
        super().__init__(daemon=True)
        self.dir, self.every = group_dir, every
        self.stop = threading.Event()
        self.at_max_usage, self.at_max_anon, self.proc_peak = {}, {}, {}
        self.samples = 0

    def pids(self):
        if self.dir:
            return [int(x) for x in (read(os.path.join(self.dir, "cgroup.procs")) or "").split()]
        return self.pid_list

    def run(self):
        while not self.stop.is_set():
            self.samples += 1
            if self.dir:
                s = memstat(self.dir)
                if s.get("usage", 0) > self.at_max_usage.get("usage", -1):
                    self.at_max_usage = s
                anon = s.get("total_rss", 0) + s.get("total_shmem", 0)
                if anon > self.at_max_anon.get("anon", -1):
                    self.at_max_anon = dict(s, anon=anon)
            for pid in self.pids():
                for k, v in status(pid).items():
                    if v > self.proc_peak.get(k, -1):
                        self.proc_peak[k] = v
            time.sleep(self.every)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", required=True)
    p.add_argument("--mechanism", required=True, choices=("cgroup-v1", "cgroup-v2", "rlimit-data"))
    p.add_argument("--limit", type=int, required=True)
    p.add_argument("--sizes", required=True)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--every", type=float, default=0.003)
    p.add_argument("--out", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--nice", type=int, default=10)
    p.add_argument("--timeout", type=int, default=240)
    p.add_argument("script", nargs=argparse.REMAINDER)
    a = p.parse_args()
    script = a.script[1:] if a.script[:1] == ["--"] else a.script
    sizes = [int(s) for s in a.sizes.split(",")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHFIT_")}
    env.update(PYTHONPATH=os.path.join(ROOT, "python", "batchfit"), OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    res = load_json(a.out)
    runs = res.setdefault(a.tag, {"mechanism": a.mechanism, "limit": a.limit, "command": script, "runs": []})
    tmp = tempfile.mkdtemp(prefix="exec-noise-")
    n = 0
    # interleaved (size after size, then again), so that a drift of the machine over time is not read as a
    # difference between sizes
    for rep in range(a.repeat):
        for b in sizes:
            n += 1
            report = os.path.join(tmp, f"r{n}.json")
            e = dict(env, BATCHFIT_BATCH=str(b), BATCHFIT_STEPS=str(a.steps), BATCHFIT_ACCUMULATION="1",
                     BATCHFIT_TRIAL=str(n), BATCHFIT_RESULT=report)
            cmd = ["nice", "-n", str(a.nice), a.python, *[os.path.join(ROOT, script[0]), *script[1:]],
                   "--batch-size", str(b), "--steps", str(a.steps), "--accumulation", "1"]
            with Limit(a.mechanism, a.limit, "exec-noise") as lim:
                s = Sampler(lim.group.dir if lim.group else None, a.every)
                s.pid_list = []
                holder = {}

                def setup(lim=lim):
                    lim.child_setup()

                t = threading.Thread(target=lambda: holder.update(r=run_cmd(cmd, a.timeout, env=e, child_setup=setup,
                                                                            stdin=subprocess.DEVNULL)))
                t.start()
                if not lim.group:
                    # find the child (nice execs python): the newest process whose parent is us
                    for _ in range(200):
                        kids = [int(x) for tid in os.listdir("/proc/self/task")
                                for x in (read(f"/proc/self/task/{tid}/children") or "").split()]
                        if kids:
                            s.pid_list = kids
                            break
                        time.sleep(0.005)
                s.start()
                t.join()
                s.stop.set()
                s.join()
                ev = lim.evidence()
                fail = None
                if lim.group:
                    fail = int((read(os.path.join(lim.group.dir, "memory.failcnt")) or "0").strip() or 0)
            r = holder["r"]
            text = (r.get("stdout") or "") + (r.get("stderr") or "")
            ok = r["rc"] == 0 and os.path.exists(report)
            outcome = "fits" if ok else ("oom" if ev.get("cgroup_oom_kills") or "alloc" in text or "MemoryError" in text
                                         else f"error {r['rc']}")
            rec = {"batch": b, "rep": rep, "outcome": outcome, "rc": r["rc"], "seconds": r["seconds"],
                   "loadavg": open("/proc/loadavg").read().split()[:3], "samples": s.samples,
                   "at_max_usage": s.at_max_usage, "at_max_anon": s.at_max_anon, "proc_peak": s.proc_peak,
                   "failcnt": fail, **ev}
            if outcome.startswith("error"):
                rec["tail"] = text.strip().splitlines()[-3:]
            runs["runs"].append(rec)
            save_json(a.out, res)
            am = s.at_max_anon
            print(f"{a.tag} b={b} rep={rep}: {outcome} {r['seconds']}s peak={ev.get('cgroup_peak_bytes')} "
                  f"anon@max={am.get('anon')} cache@maxanon={am.get('total_cache')} "
                  f"mapped@maxanon={am.get('total_mapped_file')} cache@maxusage={s.at_max_usage.get('total_cache')} "
                  f"VmData={s.proc_peak.get('VmData')} RssAnon={s.proc_peak.get('RssAnon')} "
                  f"RssFile={s.proc_peak.get('RssFile')} failcnt={fail}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
