#!/usr/bin/env python3
"""Measurement tool for MEASUREMENTS.md: runs a training command the way `batchfit probe --exec` does
(fresh process, own session, stdin closed, output captured, RLIMIT_DATA on the whole tree) and reports
what happened. Standard library only; Linux only.

  measure.py run   --limit BYTES [--batch N] [--steps S] [--accumulation A] -- CMD ARG...
  measure.py scan  --limit BYTES [--start N] [--steps S] [--accumulation A] [--repeat R] -- CMD ARG...
  measure.py sweep --limit BYTES --batches N,N,... --repeat R [--steps S] [--accumulation A] -- CMD ARG...

`{batch}`, `{steps}`, `{accumulation}` in CMD are replaced, and BATCHFIT_BATCH/STEPS/ACCUMULATION/TRIAL/
RESULT are set, as batchfit does. `run` does one trial; `scan` doubles from --start until a trial runs out
of memory, bisects to the largest size that fits, then re-runs that size and the next one --repeat times
each. `sweep` runs each listed size --repeat times, interleaved (rounds over the list), and prints how
often each fit: the width of the band where the outcome is a coin toss. Every trial prints one JSON line on stdout (outcome, exit status, wall seconds, peak of the summed
RSS of the process tree and the largest VmData of one process, sampled every 10 ms, the OOM signature
found, the report); `--log DIR` keeps each trial's output. Options: `--env K=V` (repeatable), `--timeout S`.
"""
import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time

# Out-of-memory signatures (the reference list the Rust side is to carry), each with a name.
OOM_SIGNATURES = [
    ("torch-oom", re.compile(r"torch\.(cuda\.)?OutOfMemoryError|CUDA out of memory")),
    ("cublas-alloc", re.compile(r"CUBLAS_STATUS_ALLOC_FAILED")),
    ("cpu-allocator", re.compile(r"DefaultCPUAllocator: can't allocate memory")),
    ("bad-alloc", re.compile(r"std::bad_alloc")),
    # the last line of a Python traceback, also with torchrun's "[rank1]: " prefix
    ("python-memoryerror", re.compile(r"^(\[rank\d+\]:\s*)?(\w+\.)*MemoryError(:.*)?$", re.M)),
    ("xla-resource-exhausted", re.compile(r"RESOURCE_EXHAUSTED")),
    # seen under RLIMIT_DATA, not in the original list:
    ("dlopen-map-failed", re.compile(r"failed to map segment from shared object")),
    ("thread-create", re.compile(r"Thread creation failed|can't start new thread|pthread_create.*(EAGAIN|Resource temporarily)")),
]


def oom_signature(text):
    for name, rx in OOM_SIGNATURES:
        if rx.search(text):
            return name
    return None


def proc_table():
    """pid -> (ppid, sid, rss_bytes, vmdata_bytes) for every readable process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        ppid, sid = int(fields[1]), int(fields[3])
        rss = re.search(r"^VmRSS:\s+(\d+)", status, re.M)
        data = re.search(r"^VmData:\s+(\d+)", status, re.M)
        table[int(entry)] = (ppid, sid, int(rss.group(1)) * 1024 if rss else 0,
                             int(data.group(1)) * 1024 if data else 0)
    return table


def tree_usage(root):
    """(summed RSS, largest VmData, process count) of root's descendants and its session."""
    table = proc_table()
    members = {root} if root in table else set()
    changed = True
    while changed:
        changed = False
        for pid, (ppid, sid, _, _) in table.items():
            if pid not in members and (ppid in members or sid == root):
                members.add(pid)
                changed = True
    rss = sum(table[p][2] for p in members)
    data = max((table[p][3] for p in members), default=0)
    return rss, data, len(members)


def kill_tree(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def trial(cmd, limit, batch, steps, accumulation, index, extra_env, timeout, log_dir=None):
    with tempfile.TemporaryDirectory(prefix="bf-trial-") as tmp:
        result = os.path.join(tmp, "result.json")
        subst = {"{batch}": str(batch), "{steps}": str(steps), "{accumulation}": str(accumulation)}
        argv = [subst.get(a, a) for a in cmd]
        argv = [re.sub(r"\{(batch|steps|accumulation)\}", lambda m: subst["{" + m.group(1) + "}"], a) for a in argv]
        env = dict(os.environ, BATCHFIT_BATCH=str(batch), BATCHFIT_STEPS=str(steps),
                   BATCHFIT_ACCUMULATION=str(accumulation), BATCHFIT_TRIAL=str(index), BATCHFIT_RESULT=result)
        env.update(extra_env)
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")

        def limit_self():
            if limit:
                resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

        t0 = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                    start_new_session=True, preexec_fn=limit_self)
            peak_rss = peak_data = peak_procs = 0
            timed_out = False
            while proc.poll() is None:
                rss, data, n = tree_usage(proc.pid)
                peak_rss, peak_data, peak_procs = max(peak_rss, rss), max(peak_data, data), max(peak_procs, n)
                if time.monotonic() - t0 > timeout:
                    timed_out = True
                    kill_tree(proc.pid)
                    proc.wait()
                    break
                time.sleep(0.01)
            kill_tree(proc.pid)  # leftovers of the group
        wall = time.monotonic() - t0
        code = proc.returncode
        text = open(out_path, errors="replace").read() + open(err_path, errors="replace").read()
        report = None
        if os.path.exists(result):
            try:
                report = json.load(open(result))
            except ValueError as e:
                report = {"unparsable": str(e)}
        sig = oom_signature(text)
        if timed_out:
            outcome = "timeout"
        elif code == 0:
            outcome = "fit"
        elif sig:
            outcome = "oom"
        else:
            outcome = "error"
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
            with open(os.path.join(log_dir, f"trial{index:03d}-b{batch}.log"), "w") as f:
                f.write(f"argv: {argv}\nexit: {code}\n\n{text}")
        last_lines = [l for l in text.strip().splitlines() if l.strip()][-3:]
        return {"trial": index, "batch": batch, "steps": steps, "accumulation": accumulation,
                "outcome": outcome, "exit": code, "signature": sig, "wall_s": round(wall, 2),
                "peak_tree_rss_mib": round(peak_rss / 2**20, 1), "peak_vmdata_mib": round(peak_data / 2**20, 1),
                "procs": peak_procs, "report_batch": (report or {}).get("batch"),
                "report_steps": (report or {}).get("steps"), "last_lines": last_lines}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["run", "scan", "sweep"])
    p.add_argument("--batches", help="sweep: comma-separated sizes")
    p.add_argument("--limit", type=lambda s: int(float(s)), required=True, help="RLIMIT_DATA bytes (0: none)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--start", type=int, default=256)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--accumulation", type=int, default=1)
    p.add_argument("--repeat", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--env", action="append", default=[], help="K=V for the trial's environment")
    p.add_argument("--log", help="directory for each trial's output")
    argv = sys.argv[1:]
    if "--" not in argv:
        p.error("no command: put it after --")
    cut = argv.index("--")
    a, cmd = p.parse_args(argv[:cut]), argv[cut + 1:]
    if not cmd:
        p.error("no command after --")
    extra_env = dict(kv.split("=", 1) for kv in a.env)
    index = 0

    def go(batch):
        nonlocal index
        r = trial(cmd, a.limit, batch, a.steps, a.accumulation, index, extra_env, a.timeout, a.log)
        index += 1
        print(json.dumps(r), flush=True)
        if r["outcome"] in ("error", "timeout") and a.mode != "sweep":
            sys.exit(f"measure.py: trial at batch {batch} ended with {r['outcome']} (exit {r['exit']}): "
                     f"{r['last_lines']}")
        return r["outcome"] == "fit"

    if a.mode == "run":
        go(a.batch)
        return
    if a.mode == "sweep":
        sizes = [int(b) for b in a.batches.split(",")]
        fits = {b: 0 for b in sizes}
        t0 = time.monotonic()
        for _ in range(max(1, a.repeat)):
            for b in sizes:
                fits[b] += go(b)
        print(json.dumps({"summary": {"repeat": max(1, a.repeat), "fits": {str(b): fits[b] for b in sizes},
                                      "sweep_s": round(time.monotonic() - t0, 1)}}), flush=True)
        return
    t0 = time.monotonic()
    lo, hi, b = 0, None, a.start
    while hi is None:  # gallop
        if go(b):
            lo, b = b, b * 2
        else:
            hi = b
    if lo == 0:  # the start did not fit: bisect below it
        lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if go(mid):
            lo = mid
        else:
            hi = mid
    search_s = time.monotonic() - t0
    summary = {"answer": lo, "first_oom": hi, "search_trials": index, "search_s": round(search_s, 1)}
    if a.repeat and lo:
        # the boundary: the answer and the next size, each --repeat times
        fits_lo = sum(go(lo) for _ in range(a.repeat))
        fits_hi = sum(go(lo + 1) for _ in range(a.repeat))
        summary.update(repeat=a.repeat, fits_at_answer=fits_lo, fits_at_answer_plus_1=fits_hi)
    print(json.dumps({"summary": summary}), flush=True)


if __name__ == "__main__":
    main()
