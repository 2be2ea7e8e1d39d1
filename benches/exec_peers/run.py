#!/usr/bin/env python3
"""batchfit probe --exec versus the batch-size finders users run inside their own training scripts, on CPU,
against each script's true maximum (issue #13's benchmark).

Normally started by ``benches/exec_peers/run.sh`` (which finds the benchmark venv and copies the binaries).
Python standard library and scripts/harness only; the training runs in the venv's Python.

Scripts (the same for every tool; tests/support/exec/):
  plain      train_mlp.py       a plain PyTorch loop (AdamW), its own --batch-size/--steps/--accumulation flags
  lightning  train_lightning.py the same model as a LightningModule, Trainer(max_steps, accumulate_grad_batches)
both with ``--input 65536 --hidden 16`` (65536 -> 16 -> 10: 256 KiB of input per sample, little compute), and
  lightning-wide  train_lightning.py with ``--input 64 --hidden 8192``: little input per sample and wide
                  activations, so that Lightning's binsearch survives its out-of-memory trials under RLIMIT_DATA
                  (its data fetcher's pre-fetch of the next batch is small) and its wall time can be compared.

Mechanisms (how the limit B is applied; each one a separate set of rows):
  cgroup     a memory cgroup around the whole process tree (batchfit --cpu-limit cgroup; the plan says
             cgroup-v1 or cgroup-v2); over the limit the kernel's OOM killer ends a process (SIGKILL)
  rlimit     RLIMIT_DATA on each process (batchfit --cpu-limit rlimit; plan: rlimit-data); over the limit an
             allocation fails inside the program

Stages, for every mechanism x script (results saved after each one; a later call with --stages resumes):
  batchfit    batchfit probe --backend cpu --memory-budget B --margin 0 --cpu-limit M --exec
              --fingerprint-file SCRIPT -- PY SCRIPT --batch-size {batch} --steps {steps} --accumulation {accumulation} ...
  truth       the script's true maximum: the largest b at which a fresh run of the same command (b, N steps,
              accumulation 1, batchfit's BATCHFIT_* variables) completes under the plan's limit, applied by
              the plan's mechanism (a new memory cgroup per run, made under the same parent cgroup as
              batchfit's trial groups; or RLIMIT_DATA); gallop out from batchfit's bracket, bisect to one
              sample, re-run the boundary (--recheck) and, where it does not reproduce, find the band between
              the largest size that completed twice and the smallest that failed twice
  lightning   (Lightning script only) Tuner.scale_batch_size(mode="binsearch", max_val=1048576, Lightning's
              other defaults) inside the script's process (peer.py), the whole process in one cgroup / under
              RLIMIT_DATA of the same size as batchfit's limit
  accelerate  find_executable_batch_size(starting_batch_size=--accelerate-start) around the script's training
              (3 steps), likewise in one process under the same limit
  doc         the exec-peers section of docs/benchmarks.md, from the saved results
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from harness.files import load_json as load, save_json as save, replace_section, sha256_of, log as _log  # noqa: E402
from harness.limits import CgroupError, Limit, cgroup_parent  # noqa: E402
from harness.procs import run_cmd  # noqa: E402
from harness.scan import true_max_scan  # noqa: E402
from harness import units  # noqa: E402
from harness.units import gib, mib, seconds_then_minutes as fmt_s  # noqa: E402
import fresh  # noqa: E402  (benches/exec_peers/fresh.py)
from fresh_doc import render_fresh, FRESH_BEGIN, FRESH_END  # noqa: E402

STAGES = ["batchfit", "truth", "lightning", "accelerate", "hf", "fresh10", "fresh-budget", "doc"]
MECHANISMS = {"cgroup": "cgroup", "rlimit": "rlimit"}
MODEL_ARGS = ["--input", "65536", "--hidden", "16"]
# lightning-wide: little input per sample (64 floats) and wide activations (8192), so that the batch Lightning's
# data fetcher pre-fetches after a failed trial is small and its binsearch can finish under RLIMIT_DATA (with
# 256 KiB of input per sample it crashed there); its trials are still short (0.6 M parameters)
WIDE_ARGS = ["--input", "64", "--hidden", "8192"]
SCRIPTS = {
    "plain": {"path": "tests/support/exec/train_mlp.py", "label": "plain PyTorch loop (`train_mlp.py`)",
              "args": MODEL_ARGS},
    "lightning": {"path": "tests/support/exec/train_lightning.py",
                  "label": "Lightning `Trainer.fit` (`train_lightning.py`)", "args": MODEL_ARGS, "lightning": True},
    "lightning-wide": {"path": "tests/support/exec/train_lightning.py",
                       "label": "Lightning `Trainer.fit` (`train_lightning.py`), wide activations",
                       "args": WIDE_ARGS, "lightning": True},
    # a DataLoader of 2 persistent worker processes, each with a 32 MiB sample cache, 64 KiB per sample
    "workers": {"path": "tests/support/exec/train_workers.py",
                "label": "plain PyTorch loop with 2 DataLoader workers (`train_workers.py`)",
                "args": ["--workers", "2", "--worker-mib", "32"], "peers": ["accelerate"]},
    "accelerate-workers": {"path": "tests/support/exec/train_accelerate.py",
                           "label": "Accelerate loop with 2 DataLoader workers (`train_accelerate.py`)",
                           "args": ["--workers", "2", "--worker-mib", "32"], "peers": ["accelerate"]},
    # a tiny GPT-2 (2 layers, 128 wide, vocabulary 8192, 128 tokens) under transformers.Trainer
    "hf-trainer": {"path": "tests/support/exec/train_hf.py",
                   "label": "tiny GPT-2 under `transformers.Trainer` (`train_hf.py`)", "args": [], "peers": ["hf"]},
}
PEERS = ("lightning", "accelerate", "hf")
BEGIN, END = "<!-- exec-peers:begin -->", "<!-- exec-peers:end -->"
OOM_TEXT = ("DefaultCPUAllocator: can't allocate memory", "MemoryError", "std::bad_alloc", "out of memory",
            "Cannot allocate memory", "cannot allocate memory", "Thread creation failed")


def log(msg):
    _log(msg, "exec-peers")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", type=lambda s: units.parse_size(s) or int(s), default=1342177280,
                   help="the memory limit B (batchfit --memory-budget with --margin 0); default 1.25GiB")
    p.add_argument("--steps", type=int, default=5, help="N: optimizer steps of each true-maximum run (default 5, "
                   "batchfit's --confirm-steps)")
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    p.add_argument("--mechanisms", default="cgroup,rlimit")
    p.add_argument("--scripts", default="plain,lightning,lightning-wide")
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "target", "release"))
    p.add_argument("--bin-commit", default=None, help="the commit the binaries in --bin-dir were built from "
                   "(recorded; default: this checkout's)")
    p.add_argument("--python", required=True, help="the Python with torch, Lightning and Accelerate")
    p.add_argument("--results", default=os.path.join(ROOT, "benches", "data", "exec_peers.json"))
    p.add_argument("--work", default=os.path.join(ROOT, "target", "exec-peers"))
    p.add_argument("--doc", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    p.add_argument("--nice", type=int, default=10)
    p.add_argument("--recheck", type=int, default=1, help="re-run the boundary of each scan (1) or not (0)")
    p.add_argument("--run-timeout", type=int, default=240, help="seconds per true-maximum run (a run that "
                   "takes longer counts as not completing)")
    p.add_argument("--peer-timeout", type=int, default=1200, help="seconds per peer search")
    p.add_argument("--batchfit-timeout", type=int, default=1800, help="seconds per batchfit probe")
    p.add_argument("--accelerate-start", type=int, default=4096)
    p.add_argument("--hf-start", type=int, default=256, help="the Trainer's per_device_train_batch_size when "
                   "its auto_find_batch_size searches (it only goes down)")
    p.add_argument("--fresh-runs", type=int, default=10, help="fresh10: runs at batchfit's answer")
    p.add_argument("--above-runs", type=int, default=3, help="fresh10: runs one guard band above the answer")
    p.add_argument("--section", choices=["peers", "fresh"], default="peers", help="the doc section the doc "
                   "stage writes: peers (answers against the true maximum) or fresh (fresh10's repeat runs)")
    a = p.parse_args()
    a.stages = [s.strip() for s in a.stages.split(",") if s.strip()]
    a.mechanisms = [s.strip() for s in a.mechanisms.split(",") if s.strip()]
    a.scripts = [s.strip() for s in a.scripts.split(",") if s.strip()]
    for what, got, ok in (("stage", a.stages, STAGES), ("mechanism", a.mechanisms, MECHANISMS),
                          ("script", a.scripts, SCRIPTS)):
        bad = [x for x in got if x not in ok]
        if bad:
            p.error(f"unknown {what}(s) {bad}; choose from {list(ok)}")
    return a


# ------------------------------------------------------------------------------------------------------
# the run's context
# ------------------------------------------------------------------------------------------------------

def now_utc():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def loadavg():
    try:
        return open("/proc/loadavg").read().split()[:3]
    except OSError:
        return None


def machine(args):
    info = {"nproc": os.cpu_count(), "kernel": platform.release(), "loadavg": loadavg()}
    try:
        cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")]
        info["cpu"] = cpu[0] if cpu else "?"
        info["mem_total"] = next(int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal"))
    except (OSError, StopIteration):
        pass
    r = subprocess.run([args.python, "-c", "import json, sys, importlib.metadata as m\n"
                        "v = {'python': sys.version.split()[0]}\n"
                        "for p in ('torch', 'lightning', 'accelerate', 'transformers', 'numpy'):\n"
                        "    try: v[p] = m.version(p)\n    except Exception: v[p] = None\n"
                        "print(json.dumps(v))"], capture_output=True, text=True)
    try:
        info.update(json.loads(r.stdout))
    except json.JSONDecodeError:
        pass
    try:
        info["cgroup_parent"] = list(cgroup_parent())
    except CgroupError as e:
        info["cgroup_parent_error"] = str(e)
    return info


def git_info():
    def sh(*c):
        return subprocess.run(["git", "-C", ROOT, *c], capture_output=True, text=True).stdout.strip()
    return {"commit": sh("rev-parse", "--short", "HEAD"),
            "src_commit": sh("log", "-1", "--format=%h", "--", "src", "Cargo.toml", "Cargo.lock", "build.rs"),
            "src_dirty": bool(sh("status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock", "build.rs"))}


def niced(args, cmd):
    return ["nice", "-n", str(args.nice)] + cmd if args.nice else cmd


def show(cmd):
    """A command line for the doc: repository paths relative, the home directory as ~."""
    home = os.path.expanduser("~")
    out = []
    for c in cmd:
        if c.startswith(ROOT + os.sep):
            c = os.path.relpath(c, ROOT)
        if c.startswith(home + os.sep):
            out.append("~" + shlex.quote(c[len(home):]))
        else:
            out.append(shlex.quote(c))
    return " ".join(out)


def job_env():
    """The environment of every run of a script (batchfit's trials inherit it unchanged): the helper
    importable, one OpenMP/OpenBLAS thread per process (2 shared cores), no BATCHFIT_* left over."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHFIT_")}
    env.update(PYTHONPATH=os.path.join(ROOT, "python", "batchfit"), OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def script_cmd(args, script, batch="{batch}", steps="{steps}", accumulation="{accumulation}"):
    return [args.python, os.path.join(ROOT, SCRIPTS[script]["path"]), "--batch-size", str(batch), "--steps",
            str(steps), "--accumulation", str(accumulation), *SCRIPTS[script]["args"]]


def item(res, mech, script):
    return res.setdefault("items", {}).setdefault(f"{mech}/{script}", {})


# ------------------------------------------------------------------------------------------------------
# stages
# ------------------------------------------------------------------------------------------------------

def stage_batchfit(args, res, mech, script):
    it = item(res, mech, script)
    d = os.path.join(args.work, mech, script)
    os.makedirs(d, exist_ok=True)
    plan = os.path.join(d, "plan.json")
    for f in (plan, plan[:-5] + ".partial.json"):
        if os.path.exists(f):
            os.remove(f)
    cmd = [os.path.join(args.bin_dir, "batchfit"), "probe", "--backend", "cpu", "--memory-budget",
           str(args.budget), "--margin", "0", "--cpu-limit", MECHANISMS[mech], "--no-cache", "--out", plan,
           "--format", "text", "--exec", "--fingerprint-file", os.path.join(ROOT, SCRIPTS[script]["path"]), "--",
           *script_cmd(args, script)]
    log(f"{mech}/{script}: batchfit: {show(cmd)}")
    r = run_cmd(niced(args, cmd), args.batchfit_timeout, os.path.join(d, "batchfit.out"),
                os.path.join(d, "batchfit.err"), env=job_env(), stdin=subprocess.DEVNULL)
    out = {"command": show(niced(args, cmd)), "exit_code": r["rc"], "timed_out": r["timed_out"],
           "wall_seconds": r["seconds"], "ended": now_utc(), "loadavg_end": loadavg()}
    pl = load(plan) or load(plan[:-5] + ".partial.json")
    if not pl:
        err = open(os.path.join(d, "batchfit.err")).read().strip().splitlines()
        out["error"] = f"no plan (exit {r['rc']}): {err[-1] if err else 'no output'}"
    else:
        rec = pl.get("recommendation") or {}
        trials = pl.get("trials") or []
        out.update(
            status=pl.get("status"), stop_reason=pl.get("stop_reason"), limit_bytes=pl.get("limit_bytes"),
            limit_mechanism=pl.get("limit_mechanism"), strategy=(pl.get("search") or {}).get("strategy"),
            answer=rec.get("max_fitting_batch"), first_failing_batch=rec.get("first_failing_batch"),
            n_trials=len(trials), trial_seconds=round(sum(t.get("seconds") or 0 for t in trials), 1),
            warnings=pl.get("warnings"), budget_bytes=pl.get("budget_bytes"),
            guard_band_bytes=pl.get("guard_band_bytes"),
            trials=[{"batch": t["batch"], "steps": t["steps"], "purpose": t.get("purpose"), "outcome": t["outcome"],
                     "peak_bytes": t.get("peak_bytes"), "seconds": round(t.get("seconds") or 0, 2),
                     "message": (t.get("message") or "")[:200] or None} for t in trials])
    it["batchfit"] = out
    log(f"{mech}/{script}: batchfit answer {out.get('answer')} in {out.get('n_trials')} trials, "
        f"{r['seconds']:.0f} s (exit {r['rc']}, {out.get('limit_mechanism')})")


def classify_run(r, ev, report_path, b):
    """fits / oom / error of one fresh run of a script."""
    text = (r.get("stdout") or "") + (r.get("stderr") or "")
    if r["timed_out"]:
        return "timeout", "timed out"
    if r["rc"] == 0:
        try:
            rep = json.load(open(report_path))
            if rep.get("batch") != b:
                return "error", f"its report says batch {rep.get('batch')}"
        except (OSError, ValueError):
            return "error", "exit 0 without its report"
        return "fits", None
    if ev.get("cgroup_oom_kills"):
        return "oom", f"killed by the kernel's OOM killer (exit {r['rc']})"
    last = next((l.strip() for l in reversed(text.splitlines()) if l.strip()), "")
    if any(s in text for s in OOM_TEXT):
        return "oom", last[:200]
    return "error", f"exit {r['rc']}: {last[:200]}"


def stage_truth(args, res, mech, script):
    it = item(res, mech, script)
    bf = it.get("batchfit") or {}
    mechanism = bf.get("limit_mechanism")
    # The job runs under the budget B (batchfit's --margin 0): batchfit's own trials ran under B less
    # its guard band (the plan's limit_bytes), which is headroom for the job, not the job's limit.
    limit = args.budget if bf.get("limit_bytes") else None
    if not mechanism or not limit:
        it["truth"] = {"error": "needs the batchfit stage's plan (its limit and mechanism): run --stages batchfit"}
        log(f"{mech}/{script}: truth: {it['truth']['error']}")
        return
    d = os.path.join(args.work, mech, script)
    logf = open(os.path.join(d, "truth.log"), "a")
    env = job_env()
    tmp = tempfile.mkdtemp(prefix="exec-peers-truth-")
    count = [0]

    def probe(b):
        count[0] += 1
        report = os.path.join(tmp, f"report-{count[0]}.json")
        e = dict(env, BATCHFIT_BATCH=str(b), BATCHFIT_STEPS=str(args.steps), BATCHFIT_ACCUMULATION="1",
                 BATCHFIT_TRIAL=str(count[0]), BATCHFIT_RESULT=report)
        cmd = niced(args, script_cmd(args, script, b, args.steps, 1))
        with Limit(mechanism, limit, "exec-peers-truth") as lim:
            r = run_cmd(cmd, args.run_timeout, env=e, child_setup=lim.child_setup, stdin=subprocess.DEVNULL)
            ev = lim.evidence()
        o, why = classify_run(r, ev, report, b)
        tail = "\n".join((r["stdout"] + r["stderr"]).strip().splitlines()[-3:])
        logf.write(f"$ b={b} ({mechanism}, {limit}): exit {r['rc']} {o} {r['seconds']} s {ev}\n{tail}\n")
        logf.flush()
        log(f"{mech}/{script}: truth: b={b}: {o}{' (' + why + ')' if why and o != 'oom' else ''} ({r['seconds']:.0f} s)")
        return o

    out = {"mechanism": mechanism, "limit_bytes": limit, "steps": args.steps,
           "command": show(niced(args, script_cmd(args, script, "b", args.steps, 1)))}

    def on_probe(pr):
        out["probes"] = pr
        it["truth"] = out
        save(args.results, res)

    t0 = time.monotonic()
    try:
        r = true_max_scan(probe, bf.get("answer") or 64, bf.get("first_failing_batch"), args.recheck, on_probe)
    except CgroupError as e:
        out["error"] = f"cannot apply the plan's limit ({mechanism}): {e}"
        it["truth"] = out
        return
    out.update(r, wall_seconds=round(time.monotonic() - t0, 1), ended=now_utc(), loadavg_end=loadavg())
    errors = [p for p in out["probes"] if p["outcome"] not in ("fits", "oom")]
    if errors:
        out["errors"] = errors
    it["truth"] = out
    log(f"{mech}/{script}: truth {r['max']} ({r['first_fail']} does not), stable={r['stable']}, band={r.get('band')}")


def stage_fresh(args, res, mech, script, name):
    it = item(res, mech, script)
    plan = load(os.path.join(args.work, mech, script, "plan.json"))
    fresh.stage(args, res, it, f"{mech}/{script}", plan,
                lambda b, steps: niced(args, script_cmd(args, script, b, steps, 1)), job_env(), log,
                lambda: save(args.results, res), OOM_TEXT, name)
    f = it.get(name) or {}
    if f.get("command"):
        f["command"] = show(f["command"])
    f.update(ended=now_utc(), loadavg_end=loadavg())


def stage_peer(args, res, mech, script, tool):
    it = item(res, mech, script)
    if tool == "lightning" and not SCRIPTS[script].get("lightning"):
        it[tool] = {"not_applicable": "Lightning's Tuner.scale_batch_size needs a LightningModule and a Trainer: "
                                      "a plain PyTorch loop has neither"}
        return
    if tool not in SCRIPTS[script].get("peers", ("lightning", "accelerate")):
        return  # not this script's framework: no row
    bf = it.get("batchfit") or {}
    mechanism = bf.get("limit_mechanism") or {"cgroup": None, "rlimit": "rlimit-data"}[mech]
    limit = args.budget  # the job's limit, as for the truth (not batchfit's guarded trial limit)
    if mechanism is None:
        try:
            mechanism = f"cgroup-{cgroup_parent()[0]}"
        except CgroupError as e:
            it[tool] = {"error": f"no memory cgroup here: {e}"}
            return
    d = os.path.join(args.work, mech, script)
    os.makedirs(d, exist_ok=True)
    record = os.path.join(d, f"{tool}.json")
    if os.path.exists(record):
        os.remove(record)
    cmd = [args.python, os.path.join(HERE, "peer.py"), tool, "--script", os.path.join(ROOT, SCRIPTS[script]["path"]),
           "--record", record]
    if tool == "accelerate":
        cmd += ["--start", str(args.accelerate_start), "--steps", "3"]
    elif tool == "hf":
        cmd += ["--start", str(args.hf_start), "--steps", "3"]
    else:
        cmd += ["--init-val", "2", "--max-val", str(1 << 20), "--max-trials", "25", "--steps-per-trial", "3"]
    cmd += ["--", *SCRIPTS[script]["args"]]
    log(f"{mech}/{script}: {tool}: {show(cmd)} (one process, {mechanism} {limit})")
    try:
        with Limit(mechanism, limit, f"exec-peers-{tool}") as lim:
            r = run_cmd(niced(args, cmd), args.peer_timeout, os.path.join(d, f"{tool}.out"),
                        os.path.join(d, f"{tool}.err"), env=job_env(), child_setup=lim.child_setup,
                        stdin=subprocess.DEVNULL)
            ev = lim.evidence()
    except CgroupError as e:
        it[tool] = {"error": f"cannot apply the limit ({mechanism}): {e}"}
        return
    rec = load(record)
    trials = rec.get("trials") or []
    out = {"command": show(niced(args, cmd)), "mechanism": mechanism, "limit_bytes": limit, "exit_code": r["rc"],
           "timed_out": r["timed_out"], "wall_seconds": r["seconds"], "answer": rec.get("answer"),
           "call": rec.get("call"), "setup_seconds": rec.get("setup_seconds"),
           "search_seconds": rec.get("search_seconds"), "error": rec.get("error"),
           "error_where": rec.get("error_where"), "error_in_trial": rec.get("error_in_trial"),
           "error_is_oom": rec.get("error_is_oom"), "n_trials": len(trials),
           "trials": trials, "ended": now_utc(), "loadavg_end": loadavg(), **ev}
    if r["rc"] != 0 and rec.get("answer") is None and not rec.get("error"):
        running = [t for t in trials if t.get("outcome") == "running"]
        how = ("killed by the kernel's OOM killer" if ev.get("cgroup_oom_kills") else
               "timed out" if r["timed_out"] else f"ended with exit {r['rc']}")
        out["error"] = how + (f" during its trial at batch {running[-1]['batch']}" if running else "")
        out["killed"] = bool(ev.get("cgroup_oom_kills")) or r["rc"] < 0
        if running:
            running[-1]["outcome"] = "killed" if out["killed"] else "unfinished"
    elif out["error"]:
        # the finder itself ended in an exception (not the kernel): say where, briefly
        kind = "an out-of-memory" if rec.get("error_is_oom") else out["error"].split(":")[0]
        out["summary"] = (f"crashed: {kind} raised " + (f"in `{rec['error_where']}`" if rec.get("error_where") else "")
                          + (" during a trial" if rec.get("error_in_trial") else ", outside its trials")
                          + " and not caught by the finder")
    it[tool] = out
    log(f"{mech}/{script}: {tool}: answer {out['answer']} after {len(trials)} trials, {r['seconds']:.0f} s"
        + (f"; {out['error']}" if out.get("error") else ""))


# ------------------------------------------------------------------------------------------------------
# the doc section
# ------------------------------------------------------------------------------------------------------

def seq(trials, mark_confirm=False):
    sym = {"fits": "✓", "oom": "✗", "failed": "✗", "killed": "☠", "running": "…", "unfinished": "…"}
    return " ".join(f"{t['batch']}{'/' + str(t['steps']) if mark_confirm and t.get('purpose') == 'confirm' else ''}"
                    f"{sym.get(t.get('outcome'), '(' + str(t.get('outcome')) + ')')}" for t in trials or [])


def truth_cell(t):
    if not t or t.get("max") is None:
        return "—" if not t.get("error") else f"error: {t['error']}"
    band = t.get("band")
    if t.get("stable") is False and band:
        return f"{t['max']} (not reproducible; band {band.get('fits_twice')}–{band.get('fails_twice')})"
    return f"{t['max']}" + (" (re-run: same)" if t.get("stable") else "")


def verdicts(it):
    """{tool: (ratio, above)} against the item's truth."""
    t = it.get("truth") or {}
    tm = t.get("max")
    out = {}
    for tool in ("batchfit", "lightning", "accelerate"):
        a = (it.get(tool) or {}).get("answer")
        if a is None or not tm:
            out[tool] = (None, None)
        else:
            out[tool] = (a / tm, a > tm)
    return out


def render(res, args):
    cfg, m = res.get("config", {}), res.get("machine", {})
    B, N = cfg.get("budget"), cfg.get("steps")
    L = []
    w = L.append
    w("## `--exec` against the finders users run in their scripts (CPU, real runs)")
    w("")
    w("The same training scripts (a plain loop and a Lightning module, the latter also in a wide shape) probed three "
      "ways under the same memory limit: `batchfit probe --exec` "
      "(every trial the unchanged script in a fresh process), Lightning's `Tuner.scale_batch_size` and "
      "Accelerate's `find_executable_batch_size` (inside the script's own process, as their users run them); "
      "each answer divided by the script's **true maximum**: the largest batch at which a fresh run of the same "
      f"command completes {N} optimizer steps under the same limit, applied the same way. Produced by "
      "`benches/exec_peers/run.sh`, which rewrites only this section; raw results in `benches/data/exec_peers.json`.")
    w("")
    w("### Setup")
    w("")
    g = res.get("git", {})
    w(f"* **Date** {res.get('date', '?')} (stages ended {res.get('first_stage_end', '?')} to "
      f"{res.get('last_stage_end', '?')}); batchfit commit `{g.get('commit', '?')}`"
      + (f" (`src/` as of `{g['src_commit']}`)" if g.get("src_commit") and g.get("src_commit") != g.get("commit") else "")
      + (" with uncommitted changes under `src/`" if g.get("src_dirty") else "")
      + f", `batchfit` sha256 `{cfg.get('batchfit_sha256', '?')}…`.")
    la0 = " / ".join(m.get("loadavg") or ["?"])
    w(f"* **Machine** {m.get('nproc', '?')} cores ({m.get('cpu', '?')}), {gib(m.get('mem_total') or 0)} RAM, Linux "
      f"{m.get('kernel', '?')}, memory cgroups {((m.get('cgroup_parent') or ['?'])[0])}. **Shared with other agents' "
      f"builds and tests**: load average {la0} when the run started (1 / 5 / 15 min; 2 cores), per stage in the "
      "details below; every run under `nice -n " + str(cfg.get("nice", "?")) + "`. Wall times are loaded times "
      "with noise of tens of percent.")
    w(f"* **Software** Python {m.get('python', '?')}, torch {m.get('torch', '?')}, Lightning {m.get('lightning', '?')}, "
      f"Accelerate {m.get('accelerate', '?')}, numpy {m.get('numpy', '?')} (the benchmark venv: "
      "`~/.cache/batchfit/bench-venv`, torch through a `.pth` file from the libtorch venv).")
    w("* **Scripts** (`tests/support/exec/`): `train_mlp.py`, a plain PyTorch loop (AdamW, `torch.randn` inputs "
      "drawn per step), and `train_lightning.py`, the same model as a `LightningModule` trained by "
      "`Trainer(max_steps, accumulate_grad_batches)` whose `train_dataloader()` yields whole random batches of "
      "`self.batch_size` (the layout Lightning's finder needs). Both with `--input 65536 --hidden 16` (65536 → 16 "
      "→ 10, 1 048 762 parameters): 256 KiB of input per sample, little compute; and `lightning-wide`, the "
      "Lightning script with `--input 64 --hidden 8192` (64 → 8192 → 10, 614 410 parameters): 256 bytes of input "
      "and 32 KiB per activation per sample, so that the batch Lightning's data fetcher pre-fetches after a failed "
      "trial is small (with the first shape its finder crashed there under `RLIMIT_DATA`). Environment of every run: "
      "`OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1`, `PYTHONPATH` = the helper `batchfit_trial.py` (the scripts "
      "report each trial to batchfit through it); no malloc tuning.")
    bands = sorted({(it.get("batchfit") or {}).get("limit_mechanism"): B - (it.get("batchfit") or {}).get("limit_bytes")
                    for it in (res.get("items") or {}).values()
                    if (it.get("batchfit") or {}).get("limit_bytes")}.items())
    band_text = "; ".join(f"`{k}`: {v} bytes ({mib(v)})" for k, v in bands) or "?"
    w(f"* **Limit B = {B} bytes ({gib(B)})**: batchfit `--memory-budget {B} --margin 0` (its trials run under B less its "
      f"guard band, the plan's `limit_bytes`; the band: {band_text}, the measured noise of a job's peak, "
      "docs/soundness.md), "
      "with `--cpu-limit cgroup` (a memory cgroup around each trial's process tree; the OOM killer ends a process "
      "over it) or `--cpu-limit rlimit` (`RLIMIT_DATA` on each process; an allocation over it fails). The true "
      "maximum and the peers use the plan's mechanism with the job's limit B: a new cgroup per run, made under the "
      "parent cgroup batchfit makes its trial groups in, or `RLIMIT_DATA`. Lightning and Accelerate run the whole "
      "script process (imports, model, every trial) in one such cgroup or under one such `RLIMIT_DATA`.")
    w(f"* **batchfit** `probe --exec` with its defaults otherwise: `--strategy guided`, 3 steps per trial, the answer "
      f"confirmed with 5. **Lightning** `scale_batch_size(mode=\"binsearch\", max_val=1048576)` (its defaults "
      "otherwise: init_val 2, max_trials 25, steps_per_trial 3, margin 0.05). **Accelerate** "
      f"`find_executable_batch_size(starting_batch_size={cfg.get('accelerate_start')})` around 3 training steps "
      "(a start above every true maximum here: it only goes down, by ×0.9 after each out-of-memory; from its "
      "default 128 it would answer 128 after one trial).")
    w(f"* **True maximum**: from batchfit's bracket, gallop out and bisect to one sample, one fresh process per "
      f"run ({N} steps, accumulation 1, batchfit's `BATCHFIT_*` variables set as in a trial); then the boundary "
      "(largest completing size and the next) is run once more; where that re-run disagrees, the band between "
      "the largest size that completed twice and the smallest that failed twice is searched and given.")
    w("")
    w("### Results")
    w("")
    w("| limit | script | tool | trials | wall time | answer | true max | answer / true max | above true max? |")
    w("|---|---|---|---:|---:|---:|---:|---:|---|")
    for key, it in (res.get("items") or {}).items():
        mech, script = key.split("/")
        t = it.get("truth") or {}
        v = verdicts(it)
        lm = (it.get("batchfit") or {}).get("limit_mechanism") or mech
        for tool, name in (("batchfit", "batchfit `--exec`"), ("lightning", "Lightning binsearch"),
                           ("accelerate", "Accelerate")):
            s = it.get(tool)
            if s is None:
                continue
            if s.get("not_applicable"):
                w(f"| `{lm}` | {script} | {name} | — | — | n/a | {truth_cell(t)} | — | — |")
                continue
            ans = s.get("answer")
            ans_text = str(ans) if ans is not None else "**none**: " + str(s.get("summary") or s.get("error") or "?")[:160]
            ratio, above = v[tool]
            wall = fmt_s(s.get("wall_seconds"))
            w(f"| `{lm}` | {script} | {name} | {s.get('n_trials', '—')} | {wall} | {ans_text} | {truth_cell(t)} | "
              f"{'%.3f' % ratio if ratio is not None else '—'} | "
              f"{'—' if above is None else ('**yes**' if above else 'no')} |")
    w("")
    w("Wall time: the whole command, start to exit (batchfit: the probe with every trial process; a peer: its "
      "script's process, Python start-up and imports included). Trials: batchfit's include the confirmation; "
      "Lightning's and Accelerate's count every size they ran.")
    w("")
    tg = targets(res)
    if tg:
        w("### Targets (issue #13)")
        w("")
        for line in tg:
            w(f"* {line}")
        w("")
    w("### Details")
    w("")
    for key, it in (res.get("items") or {}).items():
        bf, t = it.get("batchfit") or {}, it.get("truth") or {}
        w(f"**{key}**")
        w("")
        if bf:
            w(f"* batchfit: {bf.get('n_trials')} trials ({fmt_s(bf.get('trial_seconds'))} inside trials, "
              f"{fmt_s(bf.get('wall_seconds'))} wall), exit {bf.get('exit_code')}, stop `{bf.get('stop_reason')}`, "
              f"limit `{bf.get('limit_mechanism')}`; answer {bf.get('answer')}, first failing "
              f"{bf.get('first_failing_batch')}; load at its end {' / '.join(bf.get('loadavg_end') or ['?'])}. "
              "Sequence (✓ fits, ✗ out of memory, /5 confirmation): " + seq(bf.get("trials"), True)
              + (f". Error: {bf['error']}" if bf.get("error") else "") + ".")
        if t.get("probes"):
            w(f"* true maximum ({fmt_s(t.get('wall_seconds'))}): "
              + " ".join(f"{p['batch']}{'✓' if p['outcome'] == 'fits' else '✗' if p['outcome'] == 'oom' else '(' + p['outcome'] + ')'}"
                         f"{'(again)' if p.get('recheck') else ''}" for p in t["probes"])
              + f" → {t.get('max')} completes, {t.get('first_fail')} does not"
              + ("" if t.get("stable") in (True, None) else " — **not reproducible on re-run**"
                 + (f"; {t['band'].get('fits_twice')} completed twice, {t['band'].get('fails_twice')} failed twice"
                    if t.get("band") else ""))
              + f"; load at its end {' / '.join(t.get('loadavg_end') or ['?'])}.")
        elif t.get("error"):
            w(f"* true maximum: {t['error']}")
        for tool in ("lightning", "accelerate"):
            s = it.get(tool)
            if not s or s.get("not_applicable"):
                continue
            w(f"* {tool.capitalize()}: `{s.get('call')}`; {seq(s.get('trials'))} → {s.get('answer')}"
              + (f"; **{s.get('summary') or s['error']}**" + (f" (`{s['error'][:200]}`)" if s.get("summary") else "")
                 if s.get("error") else "")
              + f"; {fmt_s(s.get('search_seconds'))} searching, {fmt_s(s.get('wall_seconds'))} wall (exit "
              f"{s.get('exit_code')}"
              + (f", the cgroup's OOM kills: {s.get('cgroup_oom_kills')}" if s.get("cgroup_oom_kills") else "")
              + f"); load at its end {' / '.join(s.get('loadavg_end') or ['?'])}.")
        w("")
    obs = res.get("observations") or []
    if obs:
        w("### Observations")
        w("")
        for o in obs:
            w(f"* {o}")
        w("")
    w("### Commands")
    w("")
    w("```sh")
    w("# once: a venv with Lightning and Accelerate that uses the libtorch venv's torch (tests/support/exec/MEASUREMENTS.md)")
    w(f"benches/exec_peers/run.sh                      # everything (B = {B}, N = {N}); its stages took "
      f"{fmt_s(res.get('total_seconds'))} here")
    w("benches/exec_peers/run.sh --mechanisms rlimit --scripts plain --stages batchfit,truth,doc")
    for key, it in (res.get("items") or {}).items():
        for tool in ("batchfit", "lightning", "accelerate"):
            c = (it.get(tool) or {}).get("command")
            if c:
                w(f"# {key}: {tool}")
                w(c)
                break
    w("```")
    w("")
    return "\n".join(L).rstrip() + "\n"


def targets(res):
    """Which of issue #13's targets each item meets, computed from the numbers."""
    out = []
    for key, it in (res.get("items") or {}).items():
        v = verdicts(it)
        ratio, above = v["batchfit"]
        t = it.get("truth") or {}
        if ratio is None:
            out.append(f"`{key}`: batchfit ≥ 0.98 of the truth and never above: **not measured** "
                       f"({(it.get('batchfit') or {}).get('error') or t.get('error') or 'no answer or no truth'})")
        else:
            ok = ratio >= 0.98 and not above
            band = t.get("band") or {}
            note = ""
            if above and band.get("fails_twice") and (it["batchfit"]["answer"] < band["fails_twice"]):
                note = f" (inside the truth's noise band {band.get('fits_twice')}–{band.get('fails_twice')})"
            out.append(f"`{key}`: batchfit ≥ 0.98 of the truth and never above: **{'met' if ok else 'NOT met'}** "
                       f"({ratio:.3f}{', above' + note if above else ''})")
        li, bf = it.get("lightning") or {}, it.get("batchfit") or {}
        if li and not li.get("not_applicable"):
            if li.get("answer") is None:
                out.append(f"`{key}`: wall time ≤ 1.5 × Lightning binsearch: **not measurable**: Lightning gave no "
                           f"answer ({li.get('summary') or li.get('error')}); batchfit {fmt_s(bf.get('wall_seconds'))}, "
                           f"Lightning {fmt_s(li.get('wall_seconds'))} until it ended after {li.get('n_trials')} trials"
                           + (f" ({bf['wall_seconds'] / li['wall_seconds']:.1f}×)" if li.get("wall_seconds") and
                              bf.get("wall_seconds") else ""))
            elif bf.get("wall_seconds"):
                r = bf["wall_seconds"] / li["wall_seconds"]
                out.append(f"`{key}`: wall time ≤ 1.5 × Lightning binsearch: **{'met' if r <= 1.5 else 'NOT met'}** "
                           f"({fmt_s(bf['wall_seconds'])} vs {fmt_s(li['wall_seconds'])}: {r:.2f}×)")
    return out


# ------------------------------------------------------------------------------------------------------

def main():
    args = parse_args()
    os.makedirs(args.work, exist_ok=True)
    res = load(args.results)
    measuring = [s for s in args.stages if s != "doc"]
    if measuring:
        if not res.get("date") or "batchfit" in measuring:
            res["date"] = now_utc()
        res["machine"] = machine(args)
        res["git"] = git_info()
        res["config"] = {"budget": args.budget, "steps": args.steps, "nice": args.nice, "recheck": bool(args.recheck),
                         "accelerate_start": args.accelerate_start, "hf_start": args.hf_start,
                         "fresh_runs": args.fresh_runs, "above_runs": args.above_runs,
                         "bin_dir": show([args.bin_dir]), "bin_commit": args.bin_commit,
                         "batchfit_sha256": (sha256_of(os.path.join(args.bin_dir, "batchfit")) or "?")[:16]}
        save(args.results, res)
    t_all = time.monotonic()
    # script by script, each under every mechanism, every stage of one before the next: a row is complete
    # (answer, peer, fresh runs) before the next starts, so a run cut short leaves whole rows
    for script in args.scripts:
        for mech in args.mechanisms:
            for s in measuring:
                t0 = time.monotonic()
                if s == "batchfit":
                    stage_batchfit(args, res, mech, script)
                elif s == "truth":
                    stage_truth(args, res, mech, script)
                elif s in ("fresh10", "fresh-budget"):
                    stage_fresh(args, res, mech, script, s)
                else:
                    stage_peer(args, res, mech, script, s)
                res.setdefault("stage_seconds", {})[f"{mech}/{script}/{s}"] = round(time.monotonic() - t0, 1)
                res.setdefault("first_stage_end", now_utc())
                res["last_stage_end"] = now_utc()
                save(args.results, res)
    if measuring:
        res["total_seconds"] = round(sum((res.get("stage_seconds") or {}).values()), 1)
        res["last_call_seconds"] = round(time.monotonic() - t_all, 1)
        save(args.results, res)
    if "doc" in args.stages:
        if args.section == "fresh":
            replace_section(args.doc, FRESH_BEGIN, FRESH_END, render_fresh(res))
        else:
            replace_section(args.doc, BEGIN, END, render(res, args))
        log(f"doc: rewrote the exec-{args.section} section of {os.path.relpath(args.doc, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
