#!/usr/bin/env python3
"""Real side-by-side benchmark on CPU: batchfit versus Lightning's batch-size finder (and Accelerate's).

Normally started by ``benches/side_by_side/run.sh`` (which builds batchfit and finds the libtorch venv).
Python standard library only; the Lightning side runs in ``lightning_probe.py`` under the venv's Python.

Stages (each writes its results into --results as soon as it ends, so a crash keeps the earlier ones):

  floor             smallest data limit (to 16 MiB) at which each tool's trainer runs 3 steps of batch 1

  batchfit          batchfit probe --backend cpu --memory-budget B --margin 0 --threads T --out PLAN
  lightning         Tuner.scale_batch_size(mode="binsearch", steps_per_trial=3, max_trials=25, init_val=2,
                    max_val=1048576) under RLIMIT_DATA = B; writes benches/data/lightning_real_sequence.json
  accelerate        find_executable_batch_size(starting_batch_size=128) around a 3-step Lightning fit;
                    writes benches/data/accelerate_real_sequence.json
  truth-batchfit    largest b at which a fresh `batchfit-train --plan PLAN --steps N --micro-batch b
                    --accumulation 1 --memory-limit plan --force -q` exits 0 (6 = out of memory)
  truth-lightning   largest b at which a fresh Lightning fit of N steps completes under the same limit
  doc               renders the results between the side-by-side markers of docs/benchmarks.md

Each true-maximum scan starts from the tool's own bracket (largest size seen fitting, smallest seen
failing), gallops outward until it holds a fitting size b and a failing size b + k in fresh processes,
bisects to k = 1, and (with --recheck) runs b and b + 1 once more to see that the boundary is stable.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))  # the harnesses' shared package
from harness.files import load_json as load, save_json as save, replace_section, sha256_of, log  # noqa: E402
from harness.procs import run_cmd, outcome_of  # noqa: E402
from harness.scan import true_max_scan  # noqa: E402
from harness.units import mib, gib, seconds_then_minutes as fmt_s  # noqa: E402
from harness import units  # noqa: E402

STAGES = ["floor", "batchfit", "lightning", "accelerate", "truth-batchfit", "truth-lightning", "doc"]
BEGIN, END = "<!-- side-by-side:begin -->", "<!-- side-by-side:end -->"


def parse_size(s):
    n = units.parse_size(s)
    if n is None:
        raise argparse.ArgumentTypeError(f"bad size {s!r} (e.g. 1342177280, 1.25GiB, 1280MiB)")
    return n


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", type=parse_size, default=parse_size("1.25GiB"),
                   help="memory limit B for both tools (RLIMIT_DATA); default 1.25GiB")
    p.add_argument("--steps", type=int, default=5, help="N: steps of each true-maximum probe (default 5)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "target", "release"),
                   help="where batchfit and batchfit-train are")
    p.add_argument("--python", default=sys.executable, help="the Python with torch and Lightning")
    p.add_argument("--results", default=os.path.join(ROOT, "benches", "data", "side_by_side.json"))
    p.add_argument("--data-dir", default=os.path.join(ROOT, "benches", "data"))
    p.add_argument("--work", default=os.path.join(ROOT, "target", "side-by-side"), help="plan and logs")
    p.add_argument("--doc", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    p.add_argument("--nice", type=int, default=5, help="niceness of the heavy runs")
    p.add_argument("--recheck", type=int, default=1, help="re-run the final b and b+1 of each scan (1) or not (0)")
    p.add_argument("--probe-timeout", type=int, default=900, help="seconds per true-maximum probe")
    p.add_argument("--accelerate-start", type=int, default=128)
    a = p.parse_args()
    a.stages = [s.strip() for s in a.stages.split(",") if s.strip()]
    bad = [s for s in a.stages if s not in STAGES]
    if bad:
        p.error(f"unknown stage(s) {bad}; choose from {STAGES}")
    return a


# ------------------------------------------------------------------------------------------------------
# the run's context
# ------------------------------------------------------------------------------------------------------

def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw).stdout.strip()


def machine(args):
    info = {"nproc": os.cpu_count(), "kernel": platform.release()}
    try:
        cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")]
        info["cpu"] = cpu[0] if cpu else "?"
        mem = {l.split(":")[0]: int(l.split()[1]) * 1024 for l in open("/proc/meminfo")
               if l.startswith(("MemTotal", "MemAvailable"))}
        info["mem_total"] = mem.get("MemTotal")
        info["mem_available"] = mem.get("MemAvailable")
        info["loadavg"] = open("/proc/loadavg").read().split()[:3]
    except OSError:
        pass
    vers = sh([args.python, "-c", "import torch, lightning, importlib.metadata as m\n"
               "try: acc = m.version('accelerate')\nexcept Exception: acc = None\n"
               "import json, sys; print(json.dumps({'python': sys.version.split()[0], 'torch': torch.__version__, "
               "'lightning': lightning.__version__, 'accelerate': acc}))"])
    try:
        info.update(json.loads(vers))
    except json.JSONDecodeError:
        pass
    return info


def git_info():
    head = sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
    dirty = sh(["git", "-C", ROOT, "status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock", "build.rs"])
    return {"commit": head, "src_dirty": bool(dirty), "dirty_files": dirty.splitlines()}


# ------------------------------------------------------------------------------------------------------
# stages
# ------------------------------------------------------------------------------------------------------

def niced(args, cmd):
    return ["nice", "-n", str(args.nice)] + cmd if args.nice else cmd


def rel(p):
    return os.path.relpath(p, ROOT)


def show(cmd):
    """A command line for the doc: repository paths relative, the home directory as ~."""
    home = os.path.expanduser("~")
    parts = []
    for c in cmd:
        if c.startswith(ROOT + os.sep):
            c = rel(c)
        elif c.startswith(home + os.sep):
            c = "~" + c[len(home):]
        parts.append(shlex.quote(c) if not c.startswith("~") else c)
    return " ".join(parts)


def stage_batchfit(args, res):
    plan = os.path.join(args.work, "plan.json")
    cmd = [os.path.join(args.bin_dir, "batchfit"), "probe", "--backend", "cpu", "--memory-budget", str(args.budget),
           "--margin", "0", "--threads", str(args.threads), "--out", plan, "--format", "json"]
    if os.path.exists(plan):
        os.remove(plan)
    log("batchfit: " + " ".join(map(shlex.quote, cmd)))
    interrupted = []
    for attempt in range(3):
        t0 = time.monotonic()
        with open(os.path.join(args.work, "batchfit.stderr"), "w") as err:
            p = subprocess.run(niced(args, cmd), stdout=subprocess.DEVNULL, stderr=err)
        wall = time.monotonic() - t0
        if p.returncode not in (130, 143):
            break
        # SIGINT/SIGTERM from outside (another job on a shared machine): record it and start again.
        interrupted.append({"exit_code": p.returncode, "after_seconds": round(wall, 1)})
        log(f"batchfit: interrupted from outside (exit {p.returncode}) after {wall:.0f} s; starting again")
    out = {"interrupted_attempts": interrupted, "command": show(niced(args, cmd)),
           "exit_code": p.returncode, "wall_seconds": round(wall, 1)}
    try:
        pl = json.load(open(plan))
    except (OSError, json.JSONDecodeError) as e:
        out["error"] = f"no plan: {e}"
        res["batchfit"] = out
        return
    rec = pl.get("recommendation") or {}
    trials = pl.get("trials", [])
    out.update(
        limit_bytes=pl.get("limit_bytes"),
        limit_equals_budget=pl.get("limit_bytes") == args.budget,
        status=pl.get("status"),
        stop_reason=pl.get("stop_reason"),
        strategy=(pl.get("search") or {}).get("strategy"),
        answer=rec.get("max_fitting_batch"),
        first_failing_batch=rec.get("first_failing_batch"),
        peak_bytes=rec.get("peak_bytes"),
        samples_per_second=rec.get("samples_per_second"),
        n_trials=len(trials),
        trial_seconds=round(sum(t.get("seconds", 0) for t in trials), 1),
        trials=[{"batch": t["batch"], "steps": t["steps"], "purpose": t.get("purpose"), "outcome": t["outcome"],
                 "peak_bytes": t.get("peak_bytes"), "seconds": round(t.get("seconds", 0), 2)} for t in trials],
        tool=pl.get("tool"),
    )
    res["batchfit"] = out
    log(f"batchfit: answer {out['answer']} after {out['n_trials']} trials, {wall:.0f} s (exit {p.returncode})")


def floor_search(probe, lo, hi, res_bytes=16 << 20):
    """Smallest limit in (lo, hi] at which probe(limit) is True, to res_bytes; lo fails, hi works."""
    tried = []
    if not probe(hi):
        return None, [(hi, False)]
    tried.append((hi, True))
    while hi - lo > res_bytes:
        mid = (lo + hi) // 2
        ok = probe(mid)
        tried.append((mid, ok))
        if ok:
            hi = mid
        else:
            lo = mid
    return hi, tried


def stage_floor(args, res):
    plan = os.path.join(args.work, "floor_plan.json")
    # a tiny sim plan would be refused by batchfit-train; make a real one quickly (batch 1..2, no search)
    subprocess.run([os.path.join(args.bin_dir, "batchfit"), "probe", "--backend", "cpu", "--memory-budget",
                    str(args.budget), "--margin", "0", "--threads", str(args.threads), "--max-batch", "2",
                    "--out", plan, "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = {}

    def rust(limit):
        p = subprocess.run([os.path.join(args.bin_dir, "batchfit-train"), "--plan", plan, "--steps", "3",
                            "--micro-batch", "1", "--accumulation", "1", "--memory-limit", str(limit), "--force",
                            "-q"], capture_output=True, text=True)
        return p.returncode == 0

    def py(limit):
        p = subprocess.run(lightning_cmd(args, "fit", "--limit", str(limit), "--threads", str(args.threads),
                                         "--batch", "1", "--steps", "3"), capture_output=True, text=True)
        return p.returncode == 0

    if os.path.exists(plan):
        f, tried = floor_search(rust, 256 << 20, args.budget)
        out["batchfit_train"] = {"min_limit": f, "tried": tried}
        log(f"floor: batchfit-train runs batch 1 from {mib(f) if f else '?'}")
    else:
        out["batchfit_train"] = {"error": "could not make a plan"}
    f, tried = floor_search(py, 512 << 20, args.budget)
    out["lightning"] = {"min_limit": f, "tried": tried}
    log(f"floor: a Lightning fit runs batch 1 from {mib(f) if f else '?'}")
    res["floor"] = out


def lightning_cmd(args, *rest):
    return [args.python, os.path.join(HERE, "lightning_probe.py"), *rest]


def run_logged(args, what, cmd, logname):
    """Runs cmd (niced) with its output to WORK/logname; returns (exit status, wall seconds)."""
    log(f"{what}: " + " ".join(map(shlex.quote, cmd)))
    t0 = time.monotonic()
    with open(os.path.join(args.work, logname), "w") as lf:
        p = subprocess.run(niced(args, cmd), stdout=lf, stderr=subprocess.STDOUT)
    return p.returncode, time.monotonic() - t0


def stage_lightning(args, res):
    seq = os.path.join(args.data_dir, "lightning_real_sequence.json")
    rep = os.path.join(args.work, "lightning_finder.json")
    cmd = lightning_cmd(args, "finder", "--limit", str(args.budget), "--threads", str(args.threads),
                        "--init-val", "2", "--max-val", "1048576", "--max-trials", "25", "--steps-per-trial", "3",
                        "--out", seq, "--report", rep)
    for f in (rep,):
        if os.path.exists(f):
            os.remove(f)
    rc, wall = run_logged(args, "lightning", cmd, "lightning_finder.log")
    r = load(rep)
    trials = r.get("trials", [])
    fits = [t["batch"] for t in trials if t["outcome"] == "fits"]
    best = max(fits) if fits else None
    fails_above = [t["batch"] for t in trials if t["outcome"] != "fits" and (best is None or t["batch"] > best)]
    out = {
        "command": show(niced(args, cmd)),
        "call": 'Tuner(trainer).scale_batch_size(model, mode="binsearch", steps_per_trial=3, max_trials=25, '
                'init_val=2, max_val=1048576)  # margin: default 0.05',
        "exit_code": rc, "wall_seconds": round(wall, 1),
        "answer": r.get("answer"), "error": r.get("error"), "n_trials": len(trials),
        "n_fits": len(fits), "largest_fit_seen": best,
        "smallest_failure_above": min(fails_above) if fails_above else None,
        "stopped_by_max_trials": len(fits) >= 25,
        "setup_seconds": r.get("setup_seconds"), "search_seconds": r.get("search_seconds"),
        "trials": trials, "sequence_file": rel(seq),
    }
    res["lightning"] = out
    log(f"lightning: answer {out['answer']} after {len(trials)} trials, {wall:.0f} s (exit {rc})")


def stage_accelerate(args, res):
    seq = os.path.join(args.data_dir, "accelerate_real_sequence.json")
    rep = os.path.join(args.work, "accelerate.json")
    cmd = lightning_cmd(args, "accelerate", "--limit", str(args.budget), "--threads", str(args.threads),
                        "--starting-batch-size", str(args.accelerate_start), "--steps", "3", "--out", seq,
                        "--report", rep)
    rc, wall = run_logged(args, "accelerate", cmd, "accelerate.log")
    r = load(rep)
    res["accelerate"] = {
        "command": show(niced(args, cmd)),
        "call": f"find_executable_batch_size(starting_batch_size={args.accelerate_start}) around a 3-step Lightning fit",
        "exit_code": rc, "wall_seconds": round(wall, 1), "answer": r.get("answer"),
        "error": r.get("error"), "n_trials": len(r.get("trials", [])), "trials": r.get("trials", []),
        "sequence_file": rel(seq),
    }
    log(f"accelerate: answer {r.get('answer')} after {len(r.get('trials', []))} trials, {wall:.0f} s")


def truth_scan(args, res, key, cmd_for, lo, hi, what, log_lines=None):
    """A true-maximum scan (harness.scan.true_max_scan) of the command cmd_for(b): one fresh process per
    probe, under --probe-timeout; each probe's output goes to WORK/<key>.log (only its last log_lines lines
    when given), and res[key] is saved after every probe."""
    stage = key.replace("_", "-")
    logf = open(os.path.join(args.work, f"{key}.log"), "a")

    def probe(b):
        c = niced(args, cmd_for(b))
        r = run_cmd(c, args.probe_timeout)
        text = r["stdout"] + r["stderr"]
        if log_lines:
            text = "\n".join(text.strip().splitlines()[-log_lines:])
        logf.write(f"$ {' '.join(c)}\nexit {r['rc']}{' (timed out)' if r['timed_out'] else ''}\n{text}\n")
        logf.flush()
        o = outcome_of(r, "exit {rc}")
        log(f"{stage}: b={b}: {o}")
        return o

    out = {"command": show(niced(args, cmd_for("B_PLACEHOLDER"))).replace("B_PLACEHOLDER", "b"),
           "steps": args.steps}

    def on_probe(pr):
        out["probes"] = pr
        res[key] = out
        save(args.results, res)

    t0 = time.monotonic()
    r = true_max_scan(probe, lo, hi, args.recheck, on_probe)
    out.update(r, wall_seconds=round(time.monotonic() - t0, 1))
    res[key] = out
    log(f"{stage}: largest completing {what} {r['max']} ({r['first_fail']} does not), stable={r['stable']}")


def truth_batchfit(args, res):
    bf = res.get("batchfit") or {}
    plan = os.path.join(args.work, "plan.json")
    if not os.path.exists(plan) or bf.get("answer") is None:
        res["truth_batchfit"] = {"error": "needs the batchfit stage's plan (run --stages batchfit first)"}
        return
    train = os.path.join(args.bin_dir, "batchfit-train")

    def cmd_for(b):
        return [train, "--plan", plan, "--steps", str(args.steps), "--micro-batch", str(b), "--accumulation", "1",
                "--memory-limit", "plan", "--force", "-q"]

    truth_scan(args, res, "truth_batchfit", cmd_for, bf.get("answer"), bf.get("first_failing_batch"),
               "micro-batch")


def truth_lightning(args, res):
    li = res.get("lightning") or {}
    lo = li.get("largest_fit_seen") or li.get("answer") or 1024
    hi = li.get("smallest_failure_above")

    def cmd_for(b):
        return lightning_cmd(args, "fit", "--limit", str(args.budget), "--threads", str(args.threads), "--batch", str(b),
                             "--steps", str(args.steps))

    truth_scan(args, res, "truth_lightning", cmd_for, lo, hi, "batch", log_lines=3)


# ------------------------------------------------------------------------------------------------------
# the doc section
# ------------------------------------------------------------------------------------------------------

def seq_text(trials, key_ok="fits"):
    parts = []
    for t in trials:
        ok = t.get("fits") if "fits" in t else t.get("outcome") == key_ok
        parts.append(f"{t['batch']}{'✓' if ok else '✗'}")
    return " ".join(parts)


def render(res):
    cfg = res.get("config", {})
    m = res.get("machine", {})
    g = res.get("git", {})
    bf, li, ac = res.get("batchfit", {}), res.get("lightning", {}), res.get("accelerate", {})
    tb, tl = res.get("truth_batchfit", {}), res.get("truth_lightning", {})
    B = cfg.get("budget")
    N = cfg.get("steps")
    L = []
    w = L.append
    w("## Side by side on CPU: batchfit vs Lightning's batch-size finder (real runs)")
    w("")
    w("Both tools search for the largest micro-batch of the same model under the same memory limit, with real "
      "libtorch training steps, on the same machine; then a separate scan finds each tool's **true maximum**: the "
      f"largest batch at which a fresh training process of that tool completes {N} optimizer steps under the same "
      "limit. Produced by `benches/side_by_side/run.sh`, which rewrites only this section; raw results in "
      "`benches/data/side_by_side.json`, Lightning's trial sequence in `benches/data/lightning_real_sequence.json`"
      + (", Accelerate's in `benches/data/accelerate_real_sequence.json`" if ac.get("answer") is not None else "")
      + ".")
    w("")
    w("### Setup")
    w("")
    # the batchfit stage's own build, when it was recorded (later stages may have run at another commit)
    bst = (res.get("stage_runs") or {}).get("batchfit") or {}
    commit, dirty = bst.get("commit", g.get("commit", "?")), bst.get("src_dirty", g.get("src_dirty"))
    w(f"* **Date** {bst.get('ended', res.get('date', '?'))}; batchfit commit `{commit}` (`git rev-parse --short HEAD` "
      "when its stage ran)"
      + (" with uncommitted changes under `src/` (binaries built from that working tree"
         + (f"; `batchfit` sha256 `{bst['batchfit_sha256']}…`" if bst.get("batchfit_sha256") else "") + ")"
         if dirty else "")
      + (f"; binaries from `{cfg.get('bin_dir_rel')}`"
         + (" (copies of `target/release/` taken when the run started)" if cfg.get("bin_dir_rel") ==
            "target/side-by-side/bin" else "") if cfg.get("bin_dir_rel") not in (None, "target/release") else "")
      + ".")
    w(f"* **Machine** {m.get('nproc', '?')} cores ({m.get('cpu', '?')}), {gib(m.get('mem_total', 0))} RAM, "
      f"Linux {m.get('kernel', '?')}; shared with other jobs (load average {' / '.join(m.get('loadavg', ['?']))} at "
      f"the start, {' / '.join(res.get('loadavg_end', ['?']))} at the end), so wall times carry noise of tens of "
      "percent. Heavy runs under `nice -n 5`.")
    w(f"* **Software** Python {m.get('python', '?')}, torch {m.get('torch', '?')} (the libtorch batchfit links), "
      f"Lightning {m.get('lightning', '?')}" + (f", Accelerate {m.get('accelerate')}" if m.get("accelerate") else "")
      + ".")
    w("* **Model** batchfit's default MLP: 1024 → 2048 → 2048 → 10 (6 316 042 parameters), ReLU, cross-entropy, "
      "Adam (lr 1e-3), fp32, synthetic data (`randn` inputs, `randint` labels, drawn per batch). On the Lightning "
      "side the same network as a `LightningModule` (`benches/side_by_side/lightning_probe.py`) whose "
      "`train_dataloader` yields whole random batches (a `BatchSampler` over a 2²¹-long dataset, so Lightning's "
      "dataset-length stop never triggers).")
    w(f"* **Limit B = {B} bytes ({gib(B)})** of `RLIMIT_DATA` for both: batchfit with `--margin 0` (its plan's "
      f"`limit_bytes` = {bf.get('limit_bytes')}, "
      + ("equal to B" if bf.get("limit_equals_budget") else "**not** equal to B") + "); the Python process sets "
      "the same soft and hard limit before importing torch. Both run with `MALLOC_MMAP_THRESHOLD_=65536` and "
      "`MALLOC_ARENA_MAX=2` (batchfit via `mallopt`, Python via the environment) and "
      f"{cfg.get('threads')} intra-op threads (`--threads {cfg.get('threads')}`, `torch.set_num_threads("
      f"{cfg.get('threads')})`).")
    fl = res.get("floor") or {}
    fb, fp = (fl.get("batchfit_train") or {}).get("min_limit"), (fl.get("lightning") or {}).get("min_limit")
    if fb or fp:
        w(f"* **Floor**: the smallest data limit (to 16 MiB) under which 3 steps at batch 1 complete: "
          f"`batchfit-train` {mib(fb) if fb else '?'}, a Lightning fit {mib(fp) if fp else '?'}. Above its floor each "
          f"tool has {mib(B - fb) if fb else '?'} (batchfit) and {mib(B - fp) if fp else '?'} (Lightning) of B for "
          "the batch, so their true maxima differ; each answer is judged against its own tool's true maximum.")
    w("")
    w("### Results")
    w("")
    w(f"**True maximum**: the largest batch at which a fresh process of the tool's own trainer completes {N} "
      "optimizer steps under B (`batchfit-train` for batchfit, a Lightning `Trainer.fit` for Lightning), found by "
      "galloping out from the tool's own bracket and bisecting, one fresh process per probe, to a completing size b "
      "and a failing size b + 1"
      + (", then both run once more" if cfg.get("recheck") else "") + ". Where that re-run disagreed, the table "
      "also gives the band between the largest size that completed twice and the smallest that failed twice.")
    w("")
    w("| tool | trials | wall time | answer | true max | answer / true max | answer above true max? |")
    w("|---|---:|---:|---:|---:|---:|---|")

    def truth_text(t):
        tm = t.get("max")
        if tm is None:
            return "—"
        band = t.get("band")
        if t.get("stable") is False and band:
            return f"{tm} (not reproducible; band {band.get('fits_twice')}–{band.get('fails_twice')})"
        if t.get("stable") is False:
            return f"{tm} (not reproducible)"
        return str(tm)

    def row(name, st, truth):
        ans = st.get("answer")
        tm = truth.get("max")
        ratio = f"{ans / tm:.3f}" if ans is not None and tm else "—"
        above = "—" if ans is None or tm is None else ("**yes**" if ans > tm else "no")
        w(f"| {name} | {st.get('n_trials', '—')} | {fmt_s(st.get('wall_seconds'))} | {ans if ans is not None else '—'} "
          f"| {truth_text(truth)} | {ratio} | {above} |")

    row("batchfit probe (" + str(bf.get("strategy", "?")) + ")", bf, tb)
    row("Lightning `scale_batch_size` binsearch", li, tl)
    if ac.get("answer") is not None or ac.get("error"):
        row(f"Accelerate `find_executable_batch_size` (start {cfg.get('accelerate_start', 128)})", ac, tl)
    w("")
    w("Accelerate's row is compared with Lightning's true maximum (its trials are Lightning fits in the same kind of "
      "process)." if ac.get("answer") is not None else "")
    w("")
    w("Details:")
    w("")
    if bf:
        w(f"* **batchfit**: {bf.get('n_trials')} trials (each a fresh process; {fmt_s(bf.get('trial_seconds'))} "
          f"inside trials, {fmt_s(bf.get('wall_seconds'))} wall), exit {bf.get('exit_code')}, stop "
          f"`{bf.get('stop_reason')}`; answer {bf.get('answer')} (first failing {bf.get('first_failing_batch')}); "
          f"its peak at the answer {bf.get('peak_bytes')} bytes of the {bf.get('limit_bytes')} limit. Sequence "
          "(✓ fits, ✗ out of memory, /5 = confirmation): "
          + " ".join(f"{t['batch']}{'/' + str(t['steps']) if t.get('purpose') == 'confirm' else ''}"
                     f"{'✓' if t['outcome'] == 'fits' else '✗'}" for t in bf.get("trials", [])))
    if li:
        w(f"* **Lightning**: {li.get('n_trials')} trials in one process ({fmt_s(li.get('search_seconds'))} in "
          f"`scale_batch_size`, {fmt_s(_setup(li))} to start Python, import and set up, {fmt_s(li.get('wall_seconds'))} "
          f"wall), answer {li.get('answer')}"
          + (f" = int({li.get('largest_fit_seen') if not li.get('stopped_by_max_trials') else _last_fit(li)} × 0.95), "
             "its default 5 % margin" if li.get("answer") is not None else "")
          + (f"; error: {li.get('error')}" if li.get("error") else "")
          + (". It stopped because 25 trials had succeeded (`max_trials` counts successes), not because the bracket "
             "closed" if li.get("stopped_by_max_trials") else "")
          + f"; largest size it saw fit {li.get('largest_fit_seen')}, smallest it saw fail above that "
          f"{li.get('smallest_failure_above')}. Sequence: {seq_text(li.get('trials', []))}")
        n8192 = sum(1 for i, t in enumerate(li.get("trials", [])) if t["batch"] == 8192 and i > 0
                    and li["trials"][i - 1]["outcome"] != "fits")
        if n8192:
            w(f"  * {n8192} of those trials re-ran 8192 right after an out-of-memory trial: after an OOM, "
              "`_run_binsearch_scaling` calls `_adjust_batch_size(..., value=midval)` without `max_val`, so the "
              "next size is capped at that function's default 8192 even though `max_val` was raised; the success "
              "at 8192 then also resets the bracket's low end to 8192.")
    if ac.get("answer") is not None or ac.get("error"):
        w(f"* **Accelerate**: {seq_text(ac.get('trials', []))} → {ac.get('answer')}"
          + (f" (error: {ac.get('error')})" if ac.get("error") else "")
          + f", {fmt_s(ac.get('wall_seconds'))} wall. It only ever goes down from its start.")
    for name, t in (("batchfit", tb), ("Lightning", tl)):
        if t.get("probes"):
            w(f"* **True-max scan, {name}** ({fmt_s(t.get('wall_seconds'))}): "
              + " ".join(f"{p['batch']}{'✓' if p['outcome'] == 'fits' else '✗' if p['outcome'] == 'oom' else '(' + p['outcome'] + ')'}"
                         f"{'(again)' if p.get('recheck') else ''}" for p in t["probes"])
              + f" → {t.get('max')} completes, {t.get('first_fail')} does not"
              + ("" if t.get("stable") in (True, None) else
                 " — **not reproducible on re-run**"
                 + (f"; {t['band'].get('fits_twice')} completed twice, {t['band'].get('fails_twice')} failed twice"
                    if t.get("band") else "")) + ".")
    w("")
    w("### Commands")
    w("")
    w("```sh")
    ss = res.get("stage_seconds") or {}
    tot = sum(v for k, v in ss.items() if k in STAGES)
    w(f"# once: the venv of scripts/setup-libtorch.sh plus the two Python tools")
    w(f"~/.cache/batchfit/libtorch-2.11.0/bin/pip install lightning=={m.get('lightning', '2.6.6')}"
      + (f" accelerate=={m['accelerate']}" if m.get("accelerate") else ""))
    w(f"# the whole benchmark (B = {B}, N = {N}); stages, B, N, rechecks are flags (--help)"
      + (f"; its stages took {tot / 60:.0f} min here" if tot else ""))
    w(f"benches/side_by_side/run.sh --budget {B} --steps {N}")
    home = os.path.expanduser("~") + "/"
    for k, what in (("batchfit", "batchfit's search"), ("lightning", "Lightning's finder (writes the sequence)"),
                    ("accelerate", "Accelerate's finder"),
                    ("truth_batchfit", "one probe of batchfit's true-maximum scan (exit 0 completes, 6 out of memory)"),
                    ("truth_lightning", "one probe of Lightning's true-maximum scan (exit 0 completes, 6 out of memory)")):
        if res.get(k, {}).get("command"):
            w(f"# {what}")
            w(res[k]["command"].replace(home, "~/"))
    w("```")
    w("")
    obs = observations(res)
    if obs:
        w("### Observations")
        w("")
        for n in obs:
            w(f"* {n}")
        w("")
    if res.get("run_notes"):
        w("### How this run went")
        w("")
        for n in res["run_notes"]:
            w(f"* {n}")
        w("")
    runs = res.get("stage_runs") or {}
    if runs:
        w("Stages of the recorded run (end time, commit, sha256 prefix of the `batchfit` binary): " + "; ".join(
            f"{k} {v.get('ended')}, `{v.get('commit')}`{'+dirty src' if v.get('src_dirty') else ''}"
            + (f", `{v.get('batchfit_sha256')}`" if v.get("batchfit_sha256") and k in ("batchfit", "truth-batchfit",
                                                                                       "floor") else "")
            for k, v in runs.items()) + ".")
        w("")
    return "\n".join(L).rstrip() + "\n"


def observations(res):
    """Findings computed from the numbers (so they stay true when the run is repeated)."""
    out = []
    bf, li = res.get("batchfit", {}), res.get("lightning", {})
    tb, tl = res.get("truth_batchfit", {}), res.get("truth_lightning", {})
    fl = res.get("floor") or {}
    if bf.get("wall_seconds") and li.get("wall_seconds"):
        r = bf["wall_seconds"] / li["wall_seconds"]
        out.append(f"**Cost**: batchfit took {bf.get('n_trials')} trials and {fmt_s(bf['wall_seconds'])}, Lightning "
                   f"{li.get('n_trials')} trials and {fmt_s(li['wall_seconds'])}: batchfit's wall time is {r:.2f}× "
                   "Lightning's, although every batchfit trial pays a fresh process start (≈ 0.3 s, plus libtorch "
                   "set-up) and Lightning's trials share one process."
                   + (f" One run is one sample: on the cross-check build below batchfit needed {xc['n_trials']} "
                      f"trials and {fmt_s(xc['wall_seconds'])} ({xc['wall_seconds'] / li['wall_seconds']:.2f}× "
                      "Lightning's)." if (xc := (res.get("crosscheck_head") or {}).get("batchfit")) else ""))
    if bf.get("answer") is not None and tb.get("max"):
        d = tb["max"] - bf["answer"]
        if d > 0:
            ff = bf.get("first_failing_batch")
            out.append(f"**batchfit is exact for its own trials, and {d} samples ({100 * d / tb['max']:.2f} %) "
                       f"conservative for its trainer**: the probe saw {ff} run out of memory in a 3-step trial, but a "
                       f"fresh `batchfit-train` completes {N_or(res)} steps up to {tb['max']}. The trial child needs a "
                       "little more memory than the trainer at the same batch (it is a different process: the hidden `__trial` "
                       "subcommand of `batchfit`, which among other things samples its VmData from a second thread), so "
                       "the error is on the safe side.")
        elif d == 0:
            out.append("**batchfit's answer equals its trainer's true maximum**.")
        else:
            out.append(f"**batchfit's answer is {-d} above what its trainer completes** — a plan that fails in "
                       "training.")
    if li.get("answer") is not None and tl.get("max"):
        lf, sf = li.get("largest_fit_seen"), li.get("smallest_failure_above")
        parts = [f"**Lightning's answer is {100 * (1 - li['answer'] / tl['max']):.1f} % below its true maximum**"]
        parts.append(f"the 5 % margin accounts for {_last_fit(li) - li['answer']} samples of it")
        if li.get("stopped_by_max_trials"):
            parts.append(f"the rest comes from stopping at 25 successful trials with the bracket still open (last "
                         f"success {_last_fit(li)}, largest seen {lf}, smallest failure {sf})")
        if sf and tl["max"] >= sf:
            parts.append(f"and from its in-process trials being more pessimistic than a fresh fit: {sf} ran out of "
                         f"memory inside the finder's process, but a fresh fit completes up to {tl['max']}")
        out.append("; ".join(parts) + ".")
    fb, fp = (fl.get("batchfit_train") or {}).get("min_limit"), (fl.get("lightning") or {}).get("min_limit")
    if fb and fp and tb.get("max") and tl.get("max"):
        out.append(f"**The two true maxima differ because the processes do**: a Lightning process needs {mib(fp - fb)} "
                   f"more data segment than `batchfit-train` before its first sample, leaving less of B for the batch "
                   f"({tl['max']} vs {tb['max']} samples). The answers are therefore compared with each tool's own "
                   "trainer, not with each other.")
    for name, t in (("batchfit-train", tb), ("the Lightning fit", tl)):
        if t.get("stable") is False:
            bd = t.get("band") or {}
            out.append(f"**Noise**: for {name}, the boundary {t.get('max')}/{t.get('first_fail')} did not reproduce "
                       + (f"(sizes from {bd.get('fits_twice')} down completed twice, from {bd.get('fails_twice')} up "
                          "failed twice)" if bd else "").rstrip()
                       + ": under a hard limit, run-to-run differences of a few samples decide a fit.")
    return out


def N_or(res):
    return (res.get("config") or {}).get("steps", "N")


def _setup(li):
    if li.get("wall_seconds") is not None and li.get("search_seconds") is not None:
        return li["wall_seconds"] - li["search_seconds"]
    return None


def _last_fit(li):
    fits = [t["batch"] for t in li.get("trials", []) if t["outcome"] == "fits"]
    return fits[-1] if fits else "?"


# ------------------------------------------------------------------------------------------------------

def main():
    args = parse_args()
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.data_dir, exist_ok=True)
    res = load(args.results)
    if any(s != "doc" for s in args.stages):
        res["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        res["machine"] = machine(args)
        res["git"] = git_info()
        res["config"] = {"budget": args.budget, "steps": args.steps, "threads": args.threads, "nice": args.nice,
                         "recheck": bool(args.recheck), "accelerate_start": args.accelerate_start,
                         "bin_dir_rel": rel(args.bin_dir) if os.path.abspath(args.bin_dir).startswith(ROOT)
                         else args.bin_dir}
        sha = sha256_of(os.path.join(args.bin_dir, "batchfit"))
        if sha:
            res["config"]["batchfit_sha256"] = sha[:16]
        save(args.results, res)
    t_all = time.monotonic()
    table = {"floor": stage_floor, "batchfit": stage_batchfit, "lightning": stage_lightning, "accelerate": stage_accelerate,
             "truth-batchfit": truth_batchfit, "truth-lightning": truth_lightning}
    for s in args.stages:
        if s == "doc":
            continue
        t0 = time.monotonic()
        table[s](args, res)
        res.setdefault("stage_seconds", {})[s] = round(time.monotonic() - t0, 1)
        res.setdefault("stage_runs", {})[s] = {
            "ended": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": res["git"].get("commit"), "src_dirty": res["git"].get("src_dirty"),
            "batchfit_sha256": res["config"].get("batchfit_sha256")}
        try:
            res["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
        except OSError:
            pass
        save(args.results, res)
    if any(s != "doc" for s in args.stages):
        res.setdefault("stage_seconds", {})["last_run_total"] = round(time.monotonic() - t_all, 1)
        save(args.results, res)
    if "doc" in args.stages:
        replace_section(args.doc, BEGIN, END, render(res))
        log(f"doc: rewrote the side-by-side section of {rel(args.doc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
