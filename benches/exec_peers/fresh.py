"""The ``fresh10`` stage of benches/exec_peers/run.py: does batchfit's answer hold when the script is run
again, fresh, under the very limit its trials had?

For one script and mechanism, from the plan the ``batchfit`` stage wrote: its answer (``max_fitting_batch``),
the trials' limit (``limit_bytes``, applied by ``limit_mechanism``), its guard band (``guard_band_bytes``)
and its fitted line (``capacity_model.per_sample_bytes``). Runs, each a fresh process of the same command
(the plan's confirmation steps, accumulation 1, batchfit's ``BATCHFIT_*`` variables), under that limit:

* the answer ``--fresh-runs`` times (10): the promise is that every one completes;
* the size one guard band above it (answer + ceil(guard band / bytes per sample), at least answer + 1)
  ``--above-runs`` times (3): how the boundary sits one band further up,

interleaved (three at the answer, one above, ...), so that a drift of the machine's load is not read as a
difference between the sizes. Every run is sampled (every 10 ms) for the figures the plan's trials recorded:
under a cgroup the group's peak usage (kernel) and its peak anonymous + shmem memory (memory.stat); under
RLIMIT_DATA the largest VmData of any process of the tree and the tree's summed Pss_Anon + Pss_Shmem. Each
run's excess over the plan's own figure at the answer is what the guard band must cover.
"""
import math
import os
import subprocess
import threading
import time

from harness.limits import CgroupError, Limit
from harness.procs import CURRENT, run_cmd


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _tree(root):
    """root and all its descendants (through /proc/PID/task/*/children)."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            todo += [int(x) for x in (_read(f"/proc/{pid}/task/{tid}/children") or "").split()]
    return out


def _status_kib(pid, key):
    for line in (_read(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return None


def _pss_anon_shmem(pid):
    tot = 0
    for line in (_read(f"/proc/{pid}/smaps_rollup") or "").splitlines():
        if line.startswith(("Pss_Anon:", "Pss_Shmem:")):
            tot += int(line.split()[1]) * 1024
    return tot


class Sampler(threading.Thread):
    """Peaks of one run: vm_data (largest of any process), tree_pss (summed Pss_Anon + Pss_Shmem), and
    under a cgroup cgroup_anon (memory.stat rss + shmem); processes seen."""

    def __init__(self, group_dir, every=0.01):
        super().__init__(daemon=True)
        self.dir, self.every, self.stop = group_dir, every, threading.Event()
        self.peak = {"vm_data": 0, "tree_pss": 0, "cgroup_anon": 0}
        self.seen = set()

    def _pids(self):
        if self.dir:
            return [int(x) for x in (_read(os.path.join(self.dir, "cgroup.procs")) or "").split()]
        root = CURRENT.get("pgid")
        return _tree(root) if root else []

    def _cgroup_anon(self):
        st = dict(l.split() for l in (_read(os.path.join(self.dir, "memory.stat")) or "").splitlines() if " " in l)
        if "total_rss" in st:  # v1
            return int(st.get("total_rss", 0)) + int(st.get("total_shmem", 0))
        return int(st.get("anon", 0)) + int(st.get("shmem", 0))

    def run(self):
        while not self.stop.is_set():
            pids = self._pids()
            self.seen.update(pids)
            vm = [_status_kib(p, "VmData") or 0 for p in pids]
            pk = self.peak
            pk["vm_data"] = max([pk["vm_data"], *vm])
            pk["tree_pss"] = max(pk["tree_pss"], sum(_pss_anon_shmem(p) for p in pids))
            if self.dir:
                pk["cgroup_anon"] = max(pk["cgroup_anon"], self._cgroup_anon())
            time.sleep(self.every)


def plan_figures(plan, answer):
    """The plan's own figures at the answer (the largest fitting trial of that size): peak_bytes (cgroup:
    the kernel's peak usage; rlimit: the largest VmData), tree_pss, cgroup_anon."""
    best = None
    for t in plan.get("trials") or []:
        if t.get("batch") == answer and t.get("outcome") == "fits":
            if best is None or (t.get("peak_bytes") or 0) > (best.get("peak_bytes") or 0):
                best = t
    if best is None:
        return {}
    d = best.get("details") or {}
    return {"peak_bytes": best.get("peak_bytes"), "tree_pss": d.get("tree_pss_peak_bytes"),
            "cgroup_anon": d.get("cgroup_anon_peak_bytes"), "steps": best.get("steps")}


def above_size(plan, answer):
    """answer + the smallest number of samples that adds one guard band by the plan's fitted line; when
    the plan has no line, by the slope between the two largest fitting sizes' peaks."""
    band = plan.get("guard_band_bytes")
    if band is None and plan.get("guard_band") and plan.get("limit_bytes"):
        band = plan["guard_band"] * plan["limit_bytes"] / (1 - plan["guard_band"])
    slope = ((plan.get("capacity_model") or {}).get("per_sample_bytes"))
    how = "capacity_model.per_sample_bytes"
    if not slope:
        fits = sorted({t["batch"]: t.get("peak_bytes") or 0 for t in plan.get("trials") or []
                       if t.get("outcome") == "fits"}.items())
        if len(fits) >= 2 and fits[-1][0] != fits[-2][0]:
            slope = (fits[-1][1] - fits[-2][1]) / (fits[-1][0] - fits[-2][0])
            how = "slope of the two largest fitting trials"
    if not band or not slope or slope <= 0:
        return answer + 1, band, slope, "no band or slope: answer + 1"
    return answer + max(1, math.ceil(band / slope)), band, slope, how


def classify(r, ev, report, b, oom_text):
    import json
    text = (r.get("stdout") or "") + (r.get("stderr") or "")
    if r["timed_out"]:
        return "timeout", "timed out"
    if r["rc"] == 0:
        try:
            rep = json.load(open(report))
        except (OSError, ValueError):
            return "error", "exit 0 without its report"
        return ("fits", None) if rep.get("batch") == b else ("error", f"its report says batch {rep.get('batch')}")
    last = next((l.strip() for l in reversed(text.splitlines()) if l.strip()), "")
    if ev.get("cgroup_oom_kills"):
        return "oom", f"killed by the kernel's OOM killer (exit {r['rc']})"
    if any(s in text for s in oom_text):
        return "oom", last[:200]
    return "error", f"exit {r['rc']}: {last[:200]}"


def one_run(cmd, env, mechanism, limit, timeout, report, b, oom_text):
    with Limit(mechanism, limit, "exec-peers-fresh") as lim:
        s = Sampler(lim.group.dir if lim.group else None)
        s.start()
        r = run_cmd(cmd, timeout, env=env, child_setup=lim.child_setup, stdin=subprocess.DEVNULL)
        s.stop.set()
        s.join()
        ev = lim.evidence()
    outcome, why = classify(r, ev, report, b, oom_text)
    run = {"batch": b, "outcome": outcome, "rc": r["rc"], "seconds": r["seconds"], "processes": len(s.seen),
           "vm_data_peak": s.peak["vm_data"] or None, "tree_pss_peak": s.peak["tree_pss"] or None,
           "loadavg": (_read("/proc/loadavg") or "").split()[:3]}
    if s.dir:
        run.update(cgroup_peak=ev.get("cgroup_peak_bytes"), cgroup_anon_peak=s.peak["cgroup_anon"] or None,
                   cgroup_oom_kills=ev.get("cgroup_oom_kills"))
    if why:
        run["why"] = why
    # under RLIMIT_DATA batchfit also holds the tree's summed memory to the limit (over-budget)
    if mechanism == "rlimit-data" and outcome == "fits" and (run["tree_pss_peak"] or 0) > limit:
        run["over_budget"] = True
    return run


def order(fresh_runs, above_runs):
    """'a'/'u' (answer / above) interleaved: three answers, then one above, while both last."""
    seqn, a, u = [], fresh_runs, above_runs
    while a or u:
        for _ in range(3):
            if a:
                seqn.append("a")
                a -= 1
        if u:
            seqn.append("u")
            u -= 1
    return seqn


def excess(run, fig, mechanism):
    """(measure, bytes by which this run's peak went above the plan's figure at the answer)."""
    if mechanism.startswith("cgroup"):
        k_run, k_plan, name = "cgroup_anon_peak", "cgroup_anon", "cgroup anon+shmem"
    else:
        k_run, k_plan, name = "vm_data_peak", "peak_bytes", "largest VmData"
    if run.get(k_run) is None or fig.get(k_plan) is None:
        return name, None
    return name, run[k_run] - fig[k_plan]


def stage(args, res, it, key, plan, command_at, env_base, log, save, oom_text, name="fresh10"):
    """Fills it[name] run by run (saved after each): ``fresh10`` under the plan's trial limit
    (``limit_bytes``); ``fresh-budget`` the same runs under the job's budget (``budget_bytes``: with
    ``--margin 0`` and no reserve the limit the user gave, of which the trials' is the guard band less)."""
    bf = it.get("batchfit") or {}
    answer, limit, mechanism = bf.get("answer"), bf.get("limit_bytes"), bf.get("limit_mechanism")
    if name == "fresh-budget":
        limit = bf.get("budget_bytes") or (plan or {}).get("budget_bytes") or args.budget
    if not answer or not limit or not mechanism or not plan:
        it[name] = {"error": "needs the batchfit stage's plan with an answer, its limit and mechanism"}
        return
    up, band, slope, how = above_size(plan, answer)
    fig = plan_figures(plan, answer)
    steps = fig.get("steps") or args.steps
    out = {"answer": answer, "above": up, "limit_bytes": limit, "mechanism": mechanism, "guard_band_bytes": band,
           "per_sample_bytes": slope, "above_from": how, "plan_at_answer": fig, "steps": steps,
           "command": None, "runs": []}
    it[name] = out
    t0 = time.monotonic()
    for n, which in enumerate(order(args.fresh_runs, args.above_runs)):
        b = answer if which == "a" else up
        report = os.path.join(args.work, f"fresh-report-{os.getpid()}-{n}.json")
        if os.path.exists(report):
            os.remove(report)
        env = dict(env_base, BATCHFIT_BATCH=str(b), BATCHFIT_STEPS=str(steps), BATCHFIT_ACCUMULATION="1",
                   BATCHFIT_TRIAL=str(n), BATCHFIT_RESULT=report)
        cmd = command_at(b, steps)
        out["command"] = out["command"] or cmd
        try:
            run = one_run(cmd, env, mechanism, limit, args.run_timeout, report, b, oom_text)
        except CgroupError as e:
            out["error"] = f"cannot apply the plan's limit ({mechanism}): {e}"
            break
        run["size"] = "answer" if which == "a" else "above"
        run["excess_measure"], run["excess_bytes"] = excess(run, fig, mechanism)
        out["runs"].append(run)
        log(f"{key}: {name}: b={b} ({run['size']}): {run['outcome']}{' ' + run['why'] if run.get('why') else ''} "
            f"({run['seconds']:.0f} s, {run['excess_measure']} {'+' if (run['excess_bytes'] or 0) >= 0 else ''}"
            f"{(run['excess_bytes'] or 0) / 1048576:.1f} MiB vs the plan)")
        save()
    summarize(out)
    out["wall_seconds"] = round(time.monotonic() - t0, 1)
    save()


def summarize(out):
    at = [r for r in out["runs"] if r["size"] == "answer"]
    up = [r for r in out["runs"] if r["size"] == "above"]
    out["answer_fits"] = sum(r["outcome"] == "fits" and not r.get("over_budget") for r in at)
    out["answer_runs"] = len(at)
    out["above_fits"] = sum(r["outcome"] == "fits" and not r.get("over_budget") for r in up)
    out["above_runs"] = len(up)
    ex = [r["excess_bytes"] for r in at if r.get("excess_bytes") is not None]
    out["answer_excess_max"] = max(ex) if ex else None
    out["answer_excess_min"] = min(ex) if ex else None
    out["answer_failures"] = [{k: r.get(k) for k in ("outcome", "why", "excess_bytes", "vm_data_peak",
                                                       "tree_pss_peak", "cgroup_peak", "cgroup_anon_peak")}
                              for r in at if r["outcome"] != "fits" or r.get("over_budget")]
