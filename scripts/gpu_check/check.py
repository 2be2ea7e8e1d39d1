#!/usr/bin/env python3
"""Orchestrator of scripts/gpu-check.sh (Python standard library and scripts/harness only; it never imports torch).

  check.py init   --out DIR --mode gpu|cpu --bin DIR --python PY --root ROOT --time-budget S
                  --stamp-device LINE --commit C [--set KEY=VALUE ...] [--redo]
  check.py stage  N --out DIR         run stage N (1 to 4); writes DIR/stageN.json after every item
  check.py finish N --out DIR --rc RC --seconds S    record the stage's exit code and wall time
  check.py report --out DIR           regenerate DIR/results.md (and, on a GPU run, docs/gpu-results.md)
  check.py summary --out DIR          a short summary on stdout; exit 0 when every stage run is ok

Stages:
  1  batchfit doctor; per model: batchfit probe (CUDA, or CPU with --cpu-smoke), then batchfit-train with the
     plan for train_steps steps under the plan's limit (an out-of-memory there fails the stage)
  2  per model: the true maximum, by a fine scan of fresh `batchfit-train --micro-batch N --force` runs on
     the whole device (cpu: under the probe's whole budget, before its margin): from a prediction, up by
     growing steps until one runs out of memory, then bisection to scan_tol
  3  the Python peers (peers.py): a model check, then Lightning's scale_batch_size(mode="binsearch") and
     Accelerate's find_executable_batch_size on each model
  4  per model of exec_models: `batchfit probe --exec` of the model's plain PyTorch job (job.py, the peers'
     model; the helper from `batchfit python-helper`), then the job's true maximum by stage 2's fine scan
     of fresh runs of the job (gpu: the whole GPU; cpu: the exec probe's budget, limited by its plan's
     limit_mechanism: a memory cgroup per run, or RLIMIT_DATA)

Results from earlier calls in the same --out are kept: an item that already succeeded with the same
batchfit binary is not run again (unless --redo), so a second call with --stages finishes what the first
left for lack of time.
"""
import argparse
import datetime
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # scripts/: the harnesses' shared package
from harness import procs  # noqa: E402
from harness.files import load_json as load, save_json as save, write_text, sha256_of, log as _log  # noqa: E402
from harness.procs import run_cmd, outcome_of  # noqa: E402
from harness.scan import gallop_bisect, growing_steps  # noqa: E402
from harness.limits import CgroupError, Limit  # noqa: E402
from harness.units import MiB, parse_size, fmt_bytes, minutes_and_seconds as fmt_s  # noqa: E402

# ------------------------------------------------------------------------------------------------------
# the models of each mode
# ------------------------------------------------------------------------------------------------------

# A model: batchfit's --model name, the architecture (batchfit's model.config.architecture, which the
# Python peers build), the precision, and the peers' starting points when stage 1 left no plan.
GPU_SLOTS = [
    {"key": "resnet50-fp32", "model": "resnet50", "precision": "fp32",
     "arch": {"name": "resnet50", "image_size": 224, "classes": 1000},
     "lightning_init": 128, "accelerate_start": 2048},
    {"key": "resnet50-amp-bf16", "model": "resnet50", "precision": "amp-bf16",
     "arch": {"name": "resnet50", "image_size": 224, "classes": 1000},
     "lightning_init": 256, "accelerate_start": 4096},
    {"key": "gpt2-small-amp-bf16", "model": "gpt2-small", "precision": "amp-bf16",
     "arch": {"name": "gpt", "layers": 12, "d_model": 768, "heads": 12, "seq_len": 1024, "vocab": 50257},
     "lightning_init": 32, "accelerate_start": 512},
]

# --cpu-smoke: tiny models, a budget of (the model's batch-1 footprint + headroom) / (1 - margin), measured
# first. Two models cover the code paths of the GPU run's three (fp32 and bf16; an MLP and a GPT; the
# peers' ResNet runs in the model check). No ResNet probe: it takes minutes on CPU (and bf16 convolutions
# are very slow on CPUs without bf16 units); tests/models.rs probes a ResNet-18 at the limit instead.
CPU_SLOTS = [
    {"key": "mlp-fp32", "model": "mlp", "precision": "fp32",
     "arch": {"name": "mlp", "input": 4096, "hidden": [8], "classes": 10},
     "headroom": 32 * MiB, "lightning_init": 64, "accelerate_start": 1024},
    {"key": "gpt-bf16", "model": "gpt", "precision": "bf16",
     "arch": {"name": "gpt", "layers": 1, "d_model": 64, "heads": 2, "seq_len": 64, "vocab": 1000},
     "headroom": 16 * MiB, "lightning_init": 8, "accelerate_start": 64},
]


def model_args(slot):
    """batchfit's model flags for a slot (from its architecture, so the two cannot disagree)."""
    a = slot["arch"]
    args = ["--model", slot["model"]]
    if a["name"] in ("resnet18", "resnet50"):
        args += ["--image-size", str(a["image_size"])]
    elif a["name"] == "gpt" and slot["model"] == "gpt":
        args += ["--layers", str(a["layers"]), "--d-model", str(a["d_model"]), "--heads", str(a["heads"]),
                 "--seq-len", str(a["seq_len"]), "--vocab", str(a["vocab"])]
    elif a["name"] == "mlp":
        args += ["--mlp-input", str(a["input"]), "--mlp-hidden", ",".join(str(h) for h in a["hidden"]),
                 "--mlp-classes", str(a["classes"])]
    return args + ["--precision", slot["precision"]]


def label(slot):
    a = slot["arch"]
    if a["name"] in ("resnet18", "resnet50"):
        what = f"{slot['model']} {a['image_size']}×{a['image_size']}"
    elif a["name"] == "gpt":
        what = (f"{slot['model']} ({a['layers']} layers, d{a['d_model']}, {a['heads']} heads, sequence "
                f"{a['seq_len']}, vocabulary {a['vocab']})")
    else:
        what = f"mlp {a['input']}-{'-'.join(str(h) for h in a['hidden'])}-{a['classes']}"
    return f"{what}, {slot['precision']}"


KNOBS = {
    # key: (gpu default, cpu default, meaning)
    "probe_time_limit": (120, 60, "batchfit probe --time-limit, seconds"),
    "probe_trial_timeout": (60, 30, "batchfit probe --trial-timeout, seconds"),
    "probe_extra": ("", "", "extra batchfit probe flags, space-separated (e.g. '--multiple-of 8')"),
    "margin": ("", "0.01", "batchfit probe --margin (empty: batchfit's default, 0.05)"),
    "threads": (0, 1, "batchfit probe --threads (0: its default, all cores); the smoke uses 1: under a data-segment "
                      "limit, OpenMP's lazily created threads can fail to start (libgomp exits 1)"),
    "global_batch": (0, 0, "batchfit probe --global-batch (0: none, the micro-batch is the largest that fits)"),
    "train_steps": (50, 5, "batchfit-train --steps with each recommendation"),
    "train_limit": ("plan", "plan", "batchfit-train --memory-limit for stage 1 (plan or none)"),
    "train_timeout": (180, 60, "seconds per training run"),
    "scan_steps": (3, 3, "batchfit-train --steps of each fine-scan run"),
    "scan_seconds": (60, 60, "seconds per model for the fine scan"),
    "scan_run_timeout": (60, 30, "seconds per fine-scan run"),
    "scan_grow": (0.02, 0.1, "the scan's first step above a completing size (a fraction of it; doubles each step)"),
    "scan_tol": (0.005, 0.02, "the scan stops when (first failing - largest fitting) <= max(1, tol x largest fitting)"),
    "peer_steps": (3, 3, "training steps per Lightning/Accelerate trial"),
    "lightning_max_trials": (25, 10, "Lightning max_trials (it counts successful trials)"),
    "lightning_seconds": (150, 120, "seconds per Lightning search"),
    "accelerate_seconds": (60, 60, "seconds per Accelerate search"),
    "modelcheck_seconds": (120, 90, "seconds for the peers' model check"),
    "exec_models": ("resnet50-amp-bf16,gpt2-small-amp-bf16", "mlp-fp32",
                    "stage 4: the models whose Python job (scripts/gpu_check/job.py) is probed with --exec"),
    "exec_probe_time_limit": (90, 150, "stage 4: batchfit probe --exec --time-limit, seconds"),
    "exec_trial_timeout": (60, 60, "stage 4: batchfit probe --exec --trial-timeout, seconds"),
    # (cpu smoke: RLIMIT_DATA, not a memory cgroup: with the smoke's small headroom, a job near a cgroup's
    # limit had the kernel reclaim its library pages and fault them back in -- minutes of thrashing, the
    # trial timing out -- rather than an out-of-memory; measured 2026-12-03)
    "exec_probe_extra": ("", "--multiple-of 32 --cpu-limit rlimit",
                         "stage 4: extra batchfit probe --exec flags, space-separated"),
    "exec_scan_seconds": (60, 90, "stage 4: seconds per model for the fine scan of the Python job"),
    "min_item_scale": (1.0, 0.25, "scales the least time an item needs to be started (probe 90 s, training 45 s, "
                                  "scan 30 s, Lightning 45 s, Accelerate 30 s, model check 20 s)"),
}

MIN_SECONDS = {"probe": 90, "train": 45, "scan": 30, "lightning": 45, "accelerate": 30, "modelcheck": 20,
               "scan_run": 10}

STAGE_TITLES = {
    "1": "doctor, probes, training with each recommendation",
    "2": "true maximum by a fine scan",
    "3": "Lightning and Accelerate on the same models",
    "4": "batchfit probe --exec of the Python job, and its true maximum",
}


# ------------------------------------------------------------------------------------------------------
# small helpers
# ------------------------------------------------------------------------------------------------------

def now_utc():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def log(msg):
    _log(msg, "gpu-check")


def pow2_floor(n):
    return 1 << max(0, int(n).bit_length() - 1)


def pow2_ceil(n):
    n = max(1, int(math.ceil(n)))
    return 1 << (n - 1).bit_length()


def tail(path, n=3000):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def first_meaningful_line(text):
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line[:400]
    return ""


# ------------------------------------------------------------------------------------------------------
# the run's state
# ------------------------------------------------------------------------------------------------------

class Run:
    def __init__(self, out):
        self.out = os.path.abspath(out)
        self.cfg = load(os.path.join(self.out, "config.json"))
        if not self.cfg:
            sys.exit(f"check.py: no {self.out}/config.json (run `check.py init` first)")
        self.mode = self.cfg["mode"]
        self.k = self.cfg["knobs"]
        self.bin = self.cfg["bin"]
        self.logs = os.path.join(self.out, "logs")
        self.plans = os.path.join(self.out, "plans")
        os.makedirs(self.logs, exist_ok=True)
        os.makedirs(self.plans, exist_ok=True)
        self.slots = GPU_SLOTS if self.mode == "gpu" else CPU_SLOTS

    # -- files
    def stage_path(self, n):
        return os.path.join(self.out, f"stage{n}.json")

    def stage(self, n):
        return load(self.stage_path(n), {"stage": int(n), "items": {}})

    def remaining(self):
        return self.cfg["deadline"] - time.time()

    def exe(self, name):
        return os.path.join(self.bin, name)

    def plan_path(self, key):
        return os.path.join(self.plans, f"{key}.json")

    def plan(self, key):
        """The complete plan of stage 1, or None."""
        p = load(self.plan_path(key), None)
        return p if p and p.get("status") == "complete" else None

    def capacity(self, plan):
        """What 'peak / capacity' divides by: the GPU's memory; on cpu the probe's budget (before its margin)."""
        if not plan:
            return None
        if self.mode == "gpu":
            return (plan.get("device") or {}).get("total_bytes")
        return plan.get("budget_bytes")

    def gpu_apps(self):
        return gpu_apps() if self.mode == "gpu" else None


def gpu_apps():
    """Compute processes on the GPU now (a leftover would distort every measurement after it)."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        return [l.strip() for l in r.stdout.splitlines() if l.strip()]
    except (OSError, subprocess.SubprocessError) as e:
        return [f"nvidia-smi failed: {e}"]


class Items:
    """A stage's JSON, rewritten (and the report regenerated) after every item."""

    def __init__(self, run, n):
        self.run, self.n = run, str(n)
        self.data = run.stage(n)
        self.data.setdefault("items", {})
        self.sha = run.cfg.get("batchfit_sha256")

    def get(self, name):
        return self.data["items"].get(name)

    def keep(self, name, plan=None):
        """An item that succeeded in an earlier call with the same binaries (and, for items that use a
        plan, the same plan) is kept (unless --redo)."""
        it = self.get(name)
        if self.run.cfg.get("redo") or not it or it.get("status") != "ok":
            return False
        if it.get("batchfit_sha256") != self.sha:
            return False
        if plan is not None and it.get("plan_created") != plan.get("created_unix"):
            return False
        if it.get("kept") is None:
            it["kept"] = f"from an earlier call ({it.get('ended', '?')})"
        return True

    def put(self, name, item):
        item.setdefault("ended", now_utc())
        item["batchfit_sha256"] = self.sha
        self.data["items"][name] = item
        self.data["updated"] = now_utc()
        save(self.run.stage_path(self.n), self.data)
        try:
            render_all(self.run)
        except Exception as e:  # noqa: BLE001 - a report bug must not stop the measurements
            log(f"report: {type(e).__name__}: {e}")

    def time_for(self, cap, kind):
        """Seconds this item may take: min(cap, what the time budget leaves); None when that is less than
        the item needs to be worth starting."""
        t = min(float(cap), self.run.remaining())
        return t if t >= MIN_SECONDS[kind] * float(self.run.k["min_item_scale"]) else None

    def not_run(self, name, why="time budget exhausted"):
        self.put(name, {"status": "not-run", "reason": f"{why}; run this stage again with --stages {self.n}"})


# ------------------------------------------------------------------------------------------------------
# stage 1: doctor, probes, training
# ------------------------------------------------------------------------------------------------------

def plan_summary(plan):
    rec = plan.get("recommendation") or {}
    trials = plan.get("trials") or []
    gpu = plan.get("gpu") or {}
    return {
        "status_plan": plan.get("status"), "stop_reason": plan.get("stop_reason"),
        "stop_detail": plan.get("stop_detail"),
        "answer": rec.get("max_fitting_batch"), "micro_batch": rec.get("micro_batch"),
        "accumulation": rec.get("accumulation"), "global_batch": rec.get("global_batch"),
        "first_failing_batch": rec.get("first_failing_batch"), "peak_bytes": rec.get("peak_bytes"),
        "samples_per_second": rec.get("samples_per_second"),
        "limit_bytes": plan.get("limit_bytes"), "budget_bytes": plan.get("budget_bytes"),
        "margin": plan.get("margin"), "device": plan.get("device"), "model": (plan.get("model") or {}).get("name"),
        "parameters": (plan.get("model") or {}).get("parameter_count"),
        "architecture": ((plan.get("model") or {}).get("config") or {}).get("architecture"),
        "tool": plan.get("tool"), "warnings": plan.get("warnings"),
        "footprint_method": gpu.get("footprint_method"), "other_processes_bytes": gpu.get("other_processes_bytes"),
        "fake_gpu": gpu.get("fake"),
        "n_trials": len(trials), "trial_seconds": round(sum(t.get("seconds") or 0 for t in trials), 1),
        "trials": [{"batch": t.get("batch"), "steps": t.get("steps"), "purpose": t.get("purpose"),
                    "outcome": t.get("outcome"), "peak_bytes": t.get("peak_bytes"),
                    "seconds": round(t.get("seconds") or 0, 2), "message": t.get("message")} for t in trials],
    }


def doctor(run, items):
    name = "doctor"
    if items.keep(name):
        return
    r = run_cmd([run.exe("batchfit"), "doctor", "--json"], 60, os.path.join(run.logs, "doctor.json"),
                os.path.join(run.logs, "doctor.err"))
    rep = load(os.path.join(run.logs, "doctor.json"))
    item = {"rc": r["rc"], "seconds": r["seconds"], "ok": rep.get("ok"), "error": rep.get("error"),
            "driver_version": rep.get("driver_version"),
            "gpus": [{k: g.get(k) for k in ("index", "name", "total_bytes", "free_bytes", "used_bytes",
                                            "processes", "processes_unavailable")} for g in rep.get("gpus", [])],
            "findings": rep.get("findings", []), "advice": rep.get("advice", [])}
    if run.mode == "gpu":
        item["status"] = "ok" if r["rc"] == 0 and rep.get("ok") else "failed"
        if item["status"] == "failed":
            item["reason"] = f"doctor exit {r['rc']}: {rep.get('error') or first_meaningful_line(tail(os.path.join(run.logs, 'doctor.err')))}"
    else:
        item["status"] = "ok"
        item["note"] = (f"no GPU here (doctor exit {r['rc']}), as expected on --cpu-smoke" if r["rc"] != 0
                        else "doctor ran")
    items.put(name, item)


def cpu_budget(run, slot):
    """--cpu-smoke: measure the model's batch-1 footprint with a one-trial probe, then
    budget = (footprint + headroom) / (1 - margin), so the limit is footprint + headroom. (The smoke's
    margin is 1 %: 5 % of a CPU budget, mostly libtorch's own footprint, would dwarf the headroom.)"""
    floor_plan = os.path.join(run.plans, f"{slot['key']}.floor.json")
    partial = floor_plan[:-len(".json")] + ".partial.json"
    cmd = [run.exe("batchfit"), "probe", "--backend", "cpu", *model_args(slot), "--memory-budget", "2GiB",
           "--max-batch", "1", "--max-trials", "1", "--no-cache", "--quiet", "--out", floor_plan]
    if int(run.k["threads"] or 0) > 0:
        cmd += ["--threads", str(run.k["threads"])]
    r = run_cmd(cmd, 120, os.path.join(run.logs, f"floor-{slot['key']}.out"),
                os.path.join(run.logs, f"floor-{slot['key']}.err"))
    p = load(floor_plan) or load(partial)
    peaks = [t.get("peak_bytes") for t in p.get("trials", []) if t.get("outcome") == "fits" and t.get("peak_bytes")]
    if r["rc"] not in (0, 5) or not peaks:  # 5: stopped by --max-trials, as asked
        err = first_meaningful_line(tail(os.path.join(run.logs, f"floor-{slot['key']}.err")))
        return None, None, f"floor probe exit {r['rc']}: {err}"
    floor = max(peaks)
    margin = float(run.k["margin"] or 0.05)
    budget = int((floor + slot["headroom"]) / (1 - margin)) + 1
    return floor, budget, None


def probe_start(run, items, name, slot, plan_file, cap, t, budget_of, args):
    """The start shared by the zoo probe and the exec probe: the item's record, no plan left from an
    earlier call, `batchfit probe ARGS` with its backend and, on CPU, the budget `budget_of(run, slot)`
    gives (floor, budget, error), then the time left for it (`t` on a GPU, asked again after the CPU
    budget's own trial). Returns (item, cmd, seconds), or None when the item already ended (recorded
    as failed or not run)."""
    item = {"slot": slot["key"], "label": label(slot), "gpu_apps_before": run.gpu_apps()}
    partial = plan_file[:-len(".json")] + ".partial.json"
    for f in (plan_file, partial):
        if os.path.exists(f):
            os.remove(f)
    cmd = [run.exe("batchfit"), "probe", *args]
    if run.mode == "gpu":
        cmd += ["--backend", "cuda"]
    else:
        floor, budget, err = budget_of(run, slot)
        if err:
            item.update(status="failed", reason=err)
            items.put(name, item)
            return None
        item.update(cpu_floor_bytes=floor, cpu_headroom_bytes=slot["headroom"])
        cmd += ["--backend", "cpu", "--memory-budget", str(budget)]
        t = items.time_for(cap, "probe")
        if t is None:
            items.not_run(name)
            return None
    return item, cmd, t


def probe(run, items, slot):
    key = slot["key"]
    name = f"probe:{key}"
    if items.keep(name):
        return
    cap = int(run.k["probe_time_limit"]) + int(run.k["probe_trial_timeout"]) + 30
    t = items.time_for(cap, "probe")
    if t is None:
        return items.not_run(name)
    plan_file = run.plan_path(key)
    started = probe_start(run, items, name, slot, plan_file, cap, t, cpu_budget, model_args(slot))
    if started is None:
        return
    item, cmd, t = started
    time_limit = max(10, min(int(run.k["probe_time_limit"]), int(t) - int(run.k["probe_trial_timeout"]) - 20))
    cmd += ["--time-limit", str(time_limit), "--trial-timeout", str(run.k["probe_trial_timeout"]),
            "--no-cache", "--format", "text", "--out", plan_file]
    if int(run.k["threads"] or 0) > 0:
        cmd += ["--threads", str(run.k["threads"])]
    if str(run.k["margin"]).strip():
        cmd += ["--margin", str(run.k["margin"]).strip()]
    if int(run.k["global_batch"] or 0) > 0:
        cmd += ["--global-batch", str(run.k["global_batch"])]
    cmd += [a for a in str(run.k["probe_extra"] or "").split() if a]
    item["command"] = " ".join(cmd)
    log(f"stage 1: probe {key} (time limit {time_limit} s)")
    r = run_cmd(cmd, t, os.path.join(run.logs, f"probe-{key}.txt"), os.path.join(run.logs, f"probe-{key}.err"))
    item.update(rc=r["rc"], wall_seconds=r["seconds"], timed_out=r["timed_out"])
    plan = load(plan_file) or load(partial)
    if plan:
        item.update(plan_summary(plan))
        item["plan_file"] = os.path.relpath(plan_file if os.path.exists(plan_file) else partial, run.out)
    cut = time_limit < int(run.k["probe_time_limit"]) or t < cap  # shortened by the time budget
    if r["rc"] == 0 and plan.get("status") == "complete" and (plan.get("recommendation") or {}).get("micro_batch"):
        item["status"] = "ok"
    elif cut and (r["timed_out"] or plan.get("stop_reason") == "time-limit"):
        item.update(status="incomplete", reason=f"stopped by this call's time budget ({int(t)} s left for it)")
    else:
        err = first_meaningful_line("\n".join(l for l in tail(os.path.join(run.logs, f"probe-{key}.err")).splitlines()
                                              if "error" in l.lower())) or plan.get("stop_detail", "")
        item.update(status="failed", reason=f"probe exit {r['rc']}{' (killed: time)' if r['timed_out'] else ''}"
                    f": {err or 'no complete plan'}")
    items.put(name, item)


OOM_TEXT = re.compile(r"bad_alloc|can't allocate memory|out of memory|Cannot allocate memory|"
                      r"memory allocation of \d+ bytes failed")

TRAINED = re.compile(r"trained (\d+) steps of (\d+) samples in ([\d.]+) s: final loss (\S+), ([\d.]+) samples/s, (.*)$")


def parse_trained(text):
    for line in reversed((text or "").splitlines()):
        m = TRAINED.search(line)
        if m:
            peak_text = m.group(6).strip()
            return {"steps_done": int(m.group(1)), "samples_per_step": int(m.group(2)),
                    "train_seconds": float(m.group(3)), "final_loss": m.group(4),
                    "samples_per_second": float(m.group(5)), "peak_text": peak_text,
                    "peak_bytes": parse_size(peak_text.split()[-2] + " " + peak_text.split()[-1])
                    if len(peak_text.split()) >= 2 else None}
    return {}


def train(run, items, slot):
    key = slot["key"]
    name = f"train:{key}"
    plan = run.plan(key)
    if items.keep(name, plan or {}):
        return
    if not plan:
        return items.put(name, {"status": "blocked", "reason": "no complete plan from the probe"})
    t = items.time_for(run.k["train_timeout"], "train")
    if t is None:
        return items.not_run(name)
    steps = int(run.k["train_steps"])
    cmd = [run.exe("batchfit-train"), "--plan", run.plan_path(key), "--steps", str(steps), "--quiet",
           "--memory-limit", str(run.k["train_limit"])]
    log(f"stage 1: train {key} ({steps} steps)")
    item = {"slot": key, "command": " ".join(cmd), "steps": steps, "memory_limit": run.k["train_limit"],
            "plan_created": plan.get("created_unix"),
            "micro_batch": (plan.get("recommendation") or {}).get("micro_batch"),
            "accumulation": (plan.get("recommendation") or {}).get("accumulation"),
            "capacity_bytes": run.capacity(plan)}
    out, err = os.path.join(run.logs, f"train-{key}.txt"), os.path.join(run.logs, f"train-{key}.err")
    r = run_cmd(cmd, t, out, err)
    item.update(rc=r["rc"], wall_seconds=r["seconds"], timed_out=r["timed_out"], **parse_trained(tail(out)))
    if r["rc"] == 0 and item.get("steps_done") == steps:
        item.update(status="ok", outcome="completed")
    elif r["timed_out"] and t < float(run.k["train_timeout"]):
        item.update(status="incomplete", outcome="stopped by the time budget",
                    reason=f"stopped by this call's time budget after {int(t)} s (no out-of-memory seen)")
    else:
        outcome = {6: "OUT OF MEMORY", 5: "plan refused", 3: "environment/training error", 2: "bad usage"}.get(
            r["rc"], "timeout" if r["timed_out"] else f"exit {r['rc']}")
        item.update(status="failed", outcome=outcome,
                    reason=f"batchfit-train {outcome}: {first_meaningful_line(tail(err))}")
    items.put(name, item)


def stage1(run):
    items = Items(run, 1)
    doctor(run, items)
    for slot in run.slots:
        probe(run, items, slot)
        train(run, items, slot)
    return items


# ------------------------------------------------------------------------------------------------------
# stage 2: true maximum by a fine scan
# ------------------------------------------------------------------------------------------------------

def predict(plan, capacity):
    """Largest batch whose footprint stays under `capacity`, from a least-squares line through the plan's
    fitting trials (peak = a + b × batch); None without two distinct sizes."""
    pts = {}
    for t in plan.get("trials") or []:
        if t.get("outcome") == "fits" and t.get("peak_bytes"):
            pts[t["batch"]] = max(pts.get(t["batch"], 0), t["peak_bytes"])
    if len(pts) < 2:
        return None
    xs, ys = list(pts), [pts[x] for x in pts]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    if b <= 0:
        return None
    return int((capacity - a) / b)


def scan(run, items, s1, slot):
    key = slot["key"]
    name = f"scan:{key}"
    plan = run.plan(key)
    if items.keep(name, plan or {}):
        return
    if not plan:
        return items.put(name, {"status": "blocked", "reason": "no complete plan from stage 1 (run stage 1 first)"})
    steps = int(run.k["scan_steps"])
    # the memory the trainer may use: the whole GPU (no limit); cpu: the probe's budget, before its margin
    limit_args = ["--memory-limit", str(plan["budget_bytes"])] if run.mode == "cpu" else ["--memory-limit", "none"]
    item = {"memory_limit": "none (the whole GPU)" if run.mode == "gpu" else f"{plan['budget_bytes']} bytes (the budget)"}

    def run_one(b, to):
        cmd = [run.exe("batchfit-train"), "--plan", run.plan_path(key), "--steps", str(steps), "--micro-batch",
               str(b), "--accumulation", "1", "--force", "--quiet", *limit_args]
        out, err = os.path.join(run.logs, f"scan-{key}-{b}.txt"), os.path.join(run.logs, f"scan-{key}-{b}.err")
        r = run_cmd(cmd, to, out, err)
        outcome = outcome_of(r)
        entry = {"batch": b, "outcome": outcome, "rc": r["rc"], "seconds": r["seconds"]}
        if outcome == "error" and (r["rc"] < 0 or r["rc"] >= 128) and OOM_TEXT.search(tail(err)):
            # killed by a signal (an abort) after an allocation failed: the C++ runtime's way of running out
            # of memory where no exception can pass; counted as out of memory, and marked
            outcome = entry["outcome"] = "oom"
            entry["note"] = f"the process died (exit {r['rc']}) after a failed allocation"
        elif outcome == "error" and run.mode == "cpu" and "Thread creation failed" in tail(err):
            # cpu: OpenMP starts its threads lazily; under the data-segment limit their stacks cannot be
            # mapped, and libgomp exits 1. That is the limit being reached: out of memory, marked
            outcome = entry["outcome"] = "oom"
            entry["note"] = "libgomp could not create its threads under the data-segment limit (exit 1)"
        parsed = parse_trained(tail(out))
        if parsed.get("peak_bytes"):
            entry["peak_bytes"] = parsed["peak_bytes"]
        if outcome != "fits":
            entry["message"] = first_meaningful_line("\n".join(
                l for l in tail(err).splitlines() if "warning" not in l and "override" not in l))[:300]
        return outcome, entry

    tr = (s1.get("items") or {}).get(f"train:{key}") or {}
    answer = plan["recommendation"]["max_fitting_batch"]
    verified = None
    if tr.get("status") == "ok" and tr.get("micro_batch") == answer and tr.get("plan_created") == plan.get("created_unix"):
        verified = f"stage 1: {tr.get('steps')} training steps at {answer}"
    fine_scan(run, items, name, key, plan, item, run_one, "batchfit-train", verified)


def fine_scan(run, items, name, key, plan, item, run_one, trainer, verified=None, seconds=None):
    """The true maximum above a plan's answer, in fresh processes: run_one(b, timeout) -> (outcome, entry)
    runs size b once ("fits", "oom", "error", "timeout"); from the answer (run first unless `verified` says
    it completed already), up from a prediction by growing steps until a size fails, then bisection to
    scan_tol, within scan_seconds. Writes item (with the plan's answer, the runs, the result) as `name`."""
    t_total = items.time_for(run.k["scan_seconds"] if seconds is None else seconds, "scan")
    if t_total is None:
        return items.not_run(name)
    deadline = time.time() + t_total
    rec = plan["recommendation"]
    answer = rec["max_fitting_batch"]
    tol = float(run.k["scan_tol"])
    scan_cap = plan["budget_bytes"]
    item.update({"slot": key, "answer": answer, "first_failing_batch": rec.get("first_failing_batch"),
                 "steps": int(run.k["scan_steps"]), "plan_created": plan.get("created_unix"), "runs": [],
                 "capacity_bytes": run.capacity(plan), "gpu_apps_before": run.gpu_apps()})
    t0 = time.monotonic()

    def attempt(b):
        left = deadline - time.time()
        to = min(float(run.k["scan_run_timeout"]), left)
        if to < MIN_SECONDS["scan_run"] * float(run.k["min_item_scale"]):
            return None
        outcome, entry = run_one(b, to)
        item["runs"].append(entry)
        item["seconds"] = round(time.monotonic() - t0, 1)
        items.put(name, dict(item, status="running"))
        log(f"stage {items.n}: {key} batch {b}: {outcome} ({entry.get('seconds', 0):.1f} s)")
        return outcome

    lo, hi = None, None
    if verified:
        lo = answer
        item["answer_verified_by"] = verified
    else:
        o = attempt(answer)
        if o is None:
            return items.not_run(name)
        if o == "fits":
            lo = answer
        elif o == "oom":
            hi = answer
            lo = 0
            item["answer_fails"] = True
        else:  # an error or a timeout at the answer: nothing above it can be learned this way
            msg = item["runs"][-1].get("message", "")
            item.update(status="failed", seconds=round(time.monotonic() - t0, 1), n_runs=len(item["runs"]),
                        reason=f"{trainer} at the answer {answer}: {o} (exit {item['runs'][-1].get('rc')}): {msg}")
            return items.put(name, item)
    pred = predict(plan, scan_cap) if lo else None
    cand = None
    if lo:
        ratio_guess = int(answer * scan_cap / max(1, plan["limit_bytes"]))
        cand = pred if pred is not None else ratio_guess
        cand = max(lo + 1, min(cand, int(answer * 1.5) + 1))
        item["prediction"] = cand
    bound_by_error = False

    def fits(b):
        nonlocal bound_by_error
        o = attempt(b)
        if o is None:
            return None  # out of time
        if o not in ("fits", "oom"):
            bound_by_error = True
        return o == "fits"

    def errors_twice():
        # errors, not out-of-memory: stop and report them
        return sum(1 for r_ in item["runs"] if r_["outcome"] not in ("fits", "oom")) >= 2

    # up from the prediction by growing steps until a size fails, then bisection to the tolerance
    lo, hi = gallop_bisect(fits, lo, hi, first=cand, next_up=growing_steps(float(run.k["scan_grow"])),
                           narrow=lambda lo, hi: hi - lo <= max(1, int(lo * tol)), stop=errors_twice)
    exact = hi is not None and hi - lo <= 1
    converged = hi is not None and hi - lo <= max(1, int(lo * tol))
    item.update(true_max=lo if lo else None, first_fail=hi, exact=exact, converged=converged,
                bound_by_error=bound_by_error, seconds=round(time.monotonic() - t0, 1), n_runs=len(item["runs"]))
    if item.get("answer_fails"):
        item.update(status="failed", reason=f"the answer {answer} runs out of memory in a fresh {trainer} "
                                            + ("on the whole device" if run.mode == "gpu" else "under the budget"))
    elif bound_by_error:
        item.update(status="failed", reason="a scan run ended in an error or timeout, not out of memory: see runs")
    elif not converged:
        item.update(status="incomplete", reason=f"time ran out with the true maximum in [{lo}, {hi})"
                    if hi else f"time ran out before any size failed (largest completing: {lo})")
    else:
        item["status"] = "ok"
    items.put(name, item)


def stage2(run):
    s1 = run.stage(1)
    items = Items(run, 2)
    for slot in run.slots:
        scan(run, items, s1, slot)
    return items


# ------------------------------------------------------------------------------------------------------
# stage 3: Lightning and Accelerate
# ------------------------------------------------------------------------------------------------------

def peer_base_args(run, slot, plan):
    arch = ((plan or {}).get("model") or {}).get("config", {}).get("architecture") or slot["arch"]
    args = ["--arch", json.dumps(arch), "--precision", slot["precision"],
            "--device", "cuda" if run.mode == "gpu" else "cpu", "--steps", str(run.k["peer_steps"])]
    if run.mode == "cpu":
        threads = ((plan or {}).get("runtime") or {}).get("threads")
        if threads:
            args += ["--threads", str(threads)]
    return args, arch


def cpu_headroom(run, s1, slot, plan):
    """--cpu-smoke: the peer gets batchfit's room above its own loaded size: budget − batch-1 footprint."""
    pr = (s1.get("items") or {}).get(f"probe:{slot['key']}") or {}
    if plan and pr.get("cpu_floor_bytes"):
        return max(8 * MiB, plan["budget_bytes"] - pr["cpu_floor_bytes"])
    return slot.get("headroom", 32 * MiB)


def modelcheck(run, items):
    name = "modelcheck"
    if items.keep(name):
        return
    t = items.time_for(run.k["modelcheck_seconds"], "modelcheck")
    if t is None:
        return items.not_run(name)
    archs, seen = [], set()
    for slot in run.slots:
        plan = run.plan(slot["key"])
        arch = ((plan or {}).get("model") or {}).get("config", {}).get("architecture") or slot["arch"]
        if json.dumps(arch, sort_keys=True) in seen:
            continue
        seen.add(json.dumps(arch, sort_keys=True))
        archs.append({"arch": arch, "expected_parameters": ((plan or {}).get("model") or {}).get("parameter_count")})
    out = os.path.join(run.out, "peers", "modelcheck.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    cmd = [run.cfg["python"], os.path.join(HERE, "peers.py"), "modelcheck", "--archs", json.dumps(archs),
           "--device", "cuda" if run.mode == "gpu" else "cpu",
           "--precisions", "fp32,amp-bf16" if run.mode == "gpu" else "fp32", "--out", out]
    log("stage 3: model check")
    r = run_cmd(cmd, t, os.path.join(run.logs, "modelcheck.out"), os.path.join(run.logs, "modelcheck.err"))
    res = load(out)
    item = {"rc": r["rc"], "seconds": r["seconds"], "checks": res.get("checks"), "steps": res.get("steps"),
            "versions": res.get("versions")}
    if res.get("skipped"):
        item.update(status="skipped", reason=res["skipped"])
    elif r["rc"] == 0 and res.get("ok"):
        item["status"] = "ok"
    else:
        item.update(status="failed", reason=res.get("error") or first_meaningful_line(tail(os.path.join(run.logs, "modelcheck.err"), 1500))
                    or f"exit {r['rc']}")
    items.put(name, item)


def peer(run, items, s1, slot, tool):
    key = slot["key"]
    name = f"{tool}:{key}"
    if items.keep(name):
        return
    cap = run.k["lightning_seconds"] if tool == "lightning" else run.k["accelerate_seconds"]
    t = items.time_for(cap, tool)
    if t is None:
        return items.not_run(name)
    plan = run.plan(key)
    rec = (plan or {}).get("recommendation") or {}
    args, arch = peer_base_args(run, slot, plan)
    item = {"slot": key, "gpu_apps_before": run.gpu_apps()}
    if tool == "lightning":
        if rec.get("max_fitting_batch"):
            init = max(2, pow2_floor(max(2, rec["max_fitting_batch"] // 4)))
            item["init_val_from"] = f"largest power of two <= batchfit's answer / 4 ({rec['max_fitting_batch']})"
        else:
            init = slot["lightning_init"]
            item["init_val_from"] = "the model's default (no stage-1 plan)"
        args += ["--init-val", str(init), "--max-trials", str(run.k["lightning_max_trials"]), "--max-val", str(1 << 20)]
        item.update(init_val=init, max_val=1 << 20)
    else:
        sc = (run.stage(2).get("items") or {}).get(f"scan:{key}") or {}
        if sc.get("first_fail"):
            start = pow2_ceil(1.25 * sc["first_fail"])
            item["start_from"] = "smallest power of two >= 1.25 × the first failing size of the stage-2 scan"
        elif rec.get("max_fitting_batch"):
            start = pow2_ceil(1.25 * (rec.get("first_failing_batch") or rec["max_fitting_batch"] + 1))
            item["start_from"] = "smallest power of two >= 1.25 × batchfit's first failing size"
        else:
            start = slot["accelerate_start"]
            item["start_from"] = "the model's default (no stage-1 plan)"
        args += ["--start", str(start)]
        item["starting_batch_size"] = start
    if run.mode == "cpu":
        args += ["--cpu-headroom", str(cpu_headroom(run, s1, slot, plan))]
    out = os.path.join(run.out, "peers", f"{tool}-{key}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    if os.path.exists(out):
        os.remove(out)
    tmp = os.path.join(run.out, "tmp")
    cmd = [run.cfg["python"], os.path.join(HERE, "peers.py"), tool, *args, "--tmp", tmp, "--out", out]
    item["command"] = " ".join(cmd)
    log(f"stage 3: {tool} {key}")
    r = run_cmd(cmd, t, os.path.join(run.logs, f"{tool}-{key}.out"), os.path.join(run.logs, f"{tool}-{key}.err"))
    res = load(out)
    item.update(rc=r["rc"], wall_seconds=r["seconds"], timed_out=r["timed_out"],
                **{k: res.get(k) for k in ("answer", "trials", "search_seconds", "seconds", "error", "model_source",
                                           "parameters", "call", "device", "versions", "cpu_limit", "note",
                                           "recording", "lightning_margin")})
    if res.get("skipped"):
        item.update(status="skipped", reason=res["skipped"])
    elif r["rc"] == 0 and res.get("answer") is not None:
        item["status"] = "ok"
    elif r["timed_out"]:
        item.update(status="incomplete", reason=f"stopped after {int(t)} s (time cap) with {len(res.get('trials') or [])} trials")
    else:
        item.update(status="failed", reason=res.get("error") or first_meaningful_line(tail(
            os.path.join(run.logs, f"{tool}-{key}.err"), 1500)) or f"exit {r['rc']}")
    items.put(name, item)


def stage3(run):
    s1 = run.stage(1)
    items = Items(run, 3)
    modelcheck(run, items)
    for slot in run.slots:
        peer(run, items, s1, slot, "lightning")
        peer(run, items, s1, slot, "accelerate")
    return items


# ------------------------------------------------------------------------------------------------------
# stage 4: batchfit probe --exec of the Python job, and the job's own true maximum
# ------------------------------------------------------------------------------------------------------

# what a Python job prints when it runs out of memory (torch on CUDA and on CPU, Python, the C++ runtime)
JOB_OOM_TEXT = re.compile(r"OutOfMemoryError|CUDA out of memory|can't allocate memory|MemoryError|bad_alloc|"
                          r"Cannot allocate memory")
JOB_PEAK = re.compile(r"CUDA peak reserved (\d+) bytes")


def exec_slots(run):
    keys = [k.strip() for k in str(run.k["exec_models"]).split(",") if k.strip()]
    return [s_ for s_ in run.slots if s_["key"] in keys]


def exec_dir(run):
    d = os.path.join(run.out, "exec")
    os.makedirs(d, exist_ok=True)
    return d


def exec_plan_path(run, key):
    return os.path.join(run.plans, f"{key}.exec.json")


def exec_plan(run, key):
    p = load(exec_plan_path(run, key), None)
    return p if p and p.get("status") == "complete" else None


def job_cmd(run, slot, batch, steps):
    """The Python job (job.py) of a slot at `batch` and `steps` (strings: the placeholders, for --exec)."""
    arch_file = os.path.join(exec_dir(run), f"{slot['key']}.arch.json")
    if not os.path.exists(arch_file):
        save(arch_file, slot["arch"])
    return [run.cfg["python"], os.path.join(HERE, "job.py"), "--arch-file", arch_file, "--precision",
            slot["precision"], "--device", "cuda" if run.mode == "gpu" else "cpu", "--batch-size", str(batch),
            "--steps", str(steps)]


def job_env(run):
    """The job's environment: the helper importable (batchfit_trial.py, from `batchfit python-helper`), no
    BATCHFIT_* left over; on cpu the smoke's thread count (batchfit's --threads sets the same for trials)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHFIT_")}
    env["PYTHONPATH"] = exec_dir(run) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if run.mode == "cpu" and int(run.k["threads"] or 0) > 0:
        env["OMP_NUM_THREADS"] = str(run.k["threads"])
    return env


def helper(run, items):
    """`batchfit python-helper` into OUT/exec/batchfit_trial.py; None, or why it failed."""
    path = os.path.join(exec_dir(run), "batchfit_trial.py")
    r = run_cmd([run.exe("batchfit"), "python-helper"], 30, path, os.path.join(run.logs, "python-helper.err"))
    if r["rc"] != 0 or os.path.getsize(path) == 0:
        return f"batchfit python-helper exit {r['rc']}: {first_meaningful_line(tail(os.path.join(run.logs, 'python-helper.err')))}"
    return None


def exec_cpu_budget(run, slot):
    """--cpu-smoke: the job's batch-1 footprint from a one-trial --exec probe (as its limit measures it: the
    memory cgroup's peak, or the largest data segment), then budget = (footprint + headroom) / (1 - margin)."""
    key = slot["key"]
    floor_plan = os.path.join(run.plans, f"{key}.exec-floor.json")
    partial = floor_plan[:-len(".json")] + ".partial.json"
    cmd = [run.exe("batchfit"), "probe", "--backend", "cpu", "--memory-budget", "4GiB", "--max-batch", "1",
           "--max-trials", "1", "--no-cache", "--quiet", "--out", floor_plan]
    if int(run.k["threads"] or 0) > 0:
        cmd += ["--threads", str(run.k["threads"])]
    # measured the way the probe will limit it (the cgroup's peak and a data segment are different numbers)
    extra = str(run.k["exec_probe_extra"] or "").split()
    if "--cpu-limit" in extra[:-1]:
        cmd += ["--cpu-limit", extra[extra.index("--cpu-limit") + 1]]
    cmd += ["--exec", "--", *job_cmd(run, slot, "{batch}", "{steps}")]
    r = run_cmd(cmd, 180, os.path.join(run.logs, f"exec-floor-{key}.out"),
                os.path.join(run.logs, f"exec-floor-{key}.err"), env=job_env(run))
    p = load(floor_plan) or load(partial)
    peaks = [t.get("peak_bytes") for t in p.get("trials", []) if t.get("outcome") == "fits" and t.get("peak_bytes")]
    if r["rc"] not in (0, 5) or not peaks:
        err = first_meaningful_line(tail(os.path.join(run.logs, f"exec-floor-{key}.err")))
        return None, None, f"floor probe of the job exit {r['rc']}: {err}"
    floor = max(peaks)
    margin = float(run.k["margin"] or 0.05)
    return floor, int((floor + slot["headroom"]) / (1 - margin)) + 1, None


def exec_probe(run, items, slot, helper_error):
    key = slot["key"]
    name = f"exec-probe:{key}"
    if items.keep(name):
        return
    if helper_error:
        return items.put(name, {"status": "failed", "reason": helper_error})
    cap = int(run.k["exec_probe_time_limit"]) + int(run.k["exec_trial_timeout"]) + 30
    t = items.time_for(cap, "probe")
    if t is None:
        return items.not_run(name)
    plan_file = exec_plan_path(run, key)
    started = probe_start(run, items, name, slot, plan_file, cap, t, exec_cpu_budget, [])
    if started is None:
        return
    item, cmd, t = started
    time_limit = max(10, min(int(run.k["exec_probe_time_limit"]), int(t) - int(run.k["exec_trial_timeout"]) - 20))
    trial_logs = os.path.join(run.logs, f"exec-trials-{key}")
    cmd += ["--time-limit", str(time_limit), "--trial-timeout", str(run.k["exec_trial_timeout"]),
            "--no-cache", "--format", "text", "--out", plan_file, "--logs", trial_logs]
    if int(run.k["threads"] or 0) > 0:
        cmd += ["--threads", str(run.k["threads"])]
    if str(run.k["margin"]).strip():
        cmd += ["--margin", str(run.k["margin"]).strip()]
    cmd += [a for a in str(run.k["exec_probe_extra"] or "").split() if a]
    job = job_cmd(run, slot, "{batch}", "{steps}")
    cmd += ["--exec", "--fingerprint-file", job[1], "--fingerprint-file", job[3], "--", *job]
    item["command"] = " ".join(cmd)
    log(f"stage 4: probe --exec of the Python job {key} (time limit {time_limit} s)")
    r = run_cmd(cmd, t, os.path.join(run.logs, f"exec-probe-{key}.txt"), os.path.join(run.logs, f"exec-probe-{key}.err"),
                env=job_env(run))
    item.update(rc=r["rc"], wall_seconds=r["seconds"], timed_out=r["timed_out"])
    plan = load(plan_file) or load(partial)
    if plan:
        item.update(plan_summary(plan))
        item["plan_file"] = os.path.relpath(plan_file if os.path.exists(plan_file) else partial, run.out)
        item["limit_mechanism"] = plan.get("limit_mechanism")
        item["model_kind"] = (plan.get("model") or {}).get("kind")
        reports = [((t_.get("details") or {}).get("report") or {}) for t_ in plan.get("trials") or []
                   if t_.get("outcome") == "fits"]
        item["fits_with_report"] = sum(1 for rep in reports if rep.get("batch") is not None)
    cut = time_limit < int(run.k["exec_probe_time_limit"]) or t < cap
    if r["rc"] == 0 and plan.get("status") == "complete" and (plan.get("recommendation") or {}).get("micro_batch"):
        item["status"] = "ok"
    elif cut and (r["timed_out"] or plan.get("stop_reason") == "time-limit"):
        item.update(status="incomplete", reason=f"stopped by this call's time budget ({int(t)} s left for it)")
    else:
        err = first_meaningful_line("\n".join(l for l in tail(os.path.join(run.logs, f"exec-probe-{key}.err")).splitlines()
                                              if "error" in l.lower())) or plan.get("stop_detail", "")
        item.update(status="failed", reason=f"probe --exec exit {r['rc']}{' (killed: time)' if r['timed_out'] else ''}"
                    f": {err or 'no complete plan'}")
    items.put(name, item)


def exec_scan(run, items, slot):
    key = slot["key"]
    name = f"exec-scan:{key}"
    plan = exec_plan(run, key)
    if items.keep(name, plan or {}):
        return
    if not plan:
        return items.put(name, {"status": "blocked", "reason": "no complete --exec plan (the exec probe above)"})
    steps = int(run.k["scan_steps"])
    mechanism = plan.get("limit_mechanism") if run.mode == "cpu" else None
    item = {"memory_limit": "none (the whole GPU)" if run.mode == "gpu" else
            f"{plan['budget_bytes']} bytes (the budget) by {mechanism}, as the probe's trials"}
    env = job_env(run)

    def run_one(b, to):
        cmd = job_cmd(run, slot, b, steps)
        out, err = os.path.join(run.logs, f"exec-scan-{key}-{b}.txt"), os.path.join(run.logs, f"exec-scan-{key}-{b}.err")
        ev = {}
        if mechanism:
            try:
                with Limit(mechanism, plan["budget_bytes"], "gpu-check-exec") as lim:
                    r = run_cmd(cmd, to, out, err, env=env, child_setup=lim.child_setup, stdin=subprocess.DEVNULL)
                    ev = lim.evidence()
            except CgroupError as e:
                return "error", {"batch": b, "outcome": "error", "rc": None, "seconds": 0.0,
                                 "message": f"cannot apply the plan's limit ({mechanism}): {e}"}
        else:
            r = run_cmd(cmd, to, out, err, env=env, stdin=subprocess.DEVNULL)
        entry = {"batch": b, "rc": r["rc"], "seconds": r["seconds"], **ev}
        if r["rc"] == 0:
            outcome = "fits"
        elif r["timed_out"]:
            outcome = "timeout"
        elif ev.get("cgroup_oom_kills"):
            outcome = "oom"
            entry["note"] = "the kernel's OOM killer ended the job in its memory cgroup"
        elif JOB_OOM_TEXT.search(tail(err)):
            outcome = "oom"
        else:
            outcome = "error"
        entry["outcome"] = outcome
        m = JOB_PEAK.search(tail(out))
        if m:
            entry["peak_bytes"] = int(m.group(1))
        if outcome != "fits":
            lines = [l for l in tail(err).splitlines() if l.strip() and "warning" not in l.lower()]
            entry["message"] = (lines[-1].strip() if lines else "")[:300]
        return outcome, entry

    fine_scan(run, items, name, key, plan, item, run_one, "run of job.py", seconds=run.k["exec_scan_seconds"])


def stage4(run):
    items = Items(run, 4)
    why = helper(run, items)
    for slot in exec_slots(run):
        exec_probe(run, items, slot, why)
        exec_scan(run, items, slot)
    if not exec_slots(run):
        items.put("exec", {"status": "skipped", "reason": f"no model of exec_models={run.k['exec_models']!r} in this mode"})
    return items


# ------------------------------------------------------------------------------------------------------
# stage status
# ------------------------------------------------------------------------------------------------------

def stage_status(run, n):
    """ok / failed / incomplete for stage n from its items."""
    data = run.stage(n)
    its = data.get("items") or {}
    if not its:
        return "not run", []
    bad = [(k, v) for k, v in its.items() if v.get("status") == "failed"]
    missing = [(k, v) for k, v in its.items() if v.get("status") in ("not-run", "incomplete", "running", "blocked")]
    if bad:
        return "failed", [f"{k}: {v.get('reason')}" for k, v in bad]
    if missing:
        return "incomplete", [f"{k}: {v.get('reason')}" for k, v in missing]
    return "ok", []


# ------------------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------------------

def ratio(a, b):
    return f"{a / b:.3f}" if a is not None and b else "—"


def peak_text(peak, cap):
    if peak is None or not cap:
        return "—"
    return f"{fmt_bytes(peak)} / {fmt_bytes(cap)} ({100 * peak / cap:.1f} %)"


def seq_text(trials, key_outcome="outcome"):
    sym = {"fits": "✓", "oom": "✗", "retries": "↻", "timeout": "⏱", "error": "!", "failed": "✗?", "running": "…"}
    return " ".join(f"{t.get('batch')}{sym.get(t.get(key_outcome), '?')}{'*' if t.get('note') else ''}"
                    for t in trials or [])


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(run):
    cfg, meta = run.cfg, load(os.path.join(run.out, "meta.json"))
    s1, s2, s3 = run.stage(1)["items"], run.stage(2)["items"], run.stage(3)["items"]
    s4 = run.stage(4)["items"]
    stages = load(os.path.join(run.out, "stages.json"))
    L = []
    w = L.append
    gpu = run.mode == "gpu"
    if gpu:
        w("# batchfit on a real GPU")
        w("")
        w("Written by `scripts/gpu-check.sh` (only a GPU run writes this file; `--cpu-smoke` writes its table to "
          "its `--out` directory). Regenerated after every stage of every call, from the JSON in the run's "
          "`--out` directory.")
    else:
        w("# gpu-check --cpu-smoke (CPU, tiny models: not GPU results)")
        w("")
        w("The stages of `scripts/gpu-check.sh` run on CPU with tiny models, so the script stays working. "
          "The numbers say nothing about GPUs.")
    w("")
    w("| | |")
    w("|---|---|")
    w(f"| device | `{cell(cfg.get('stamp_device'))}` |")
    w(f"| commit | `{cell(cfg.get('commit'))}` ({cell(cfg.get('commit_source', '?'))}) |")
    w(f"| batchfit | {cell(meta.get('batchfit_version', '?'))}, binary sha256 `{(cfg.get('batchfit_sha256') or '?')[:16]}`, "
      f"batchfit-train `{(cfg.get('batchfit_train_sha256') or '?')[:16]}` |")
    v = meta.get("versions") or {}
    w(f"| Python side | Python {v.get('python', '?')}, torch {v.get('torch', '?')}, Lightning "
      f"{v.get('lightning') or v.get('pytorch-lightning') or 'not installed'}, Accelerate "
      f"{v.get('accelerate') or 'not installed'}, torchvision {v.get('torchvision') or 'not installed'} |")
    w(f"| calls | {cell('; '.join(meta.get('calls', [])))} |")
    fakes = [s_["slot"] for s_ in s1.values() if isinstance(s_, dict) and s_.get("fake_gpu")]
    if fakes:
        w("")
        w(f"**FAKE GPU (BATCHFIT_FAKE_GPUS): the plans of {', '.join(fakes)} come from simulated trials; this is a "
          "test of the script, not a GPU result.**")
    w("")
    w("## Stages")
    w("")
    w("| stage | what | status | wall time | ended |")
    w("|---|---|---|---:|---|")
    for n in ("1", "2", "3", "4"):
        st, why = stage_status(run, n)
        rec = stages.get(n) or {}
        extra = ""
        if rec.get("rc") not in (None, 0) and st == "ok":
            st = f"exit {rec.get('rc')}"
        if why:
            extra = ": " + "; ".join(w_[:160] + ("…" if len(w_) > 160 else "") for w_ in why[:3]) + \
                (f" (+{len(why) - 3} more)" if len(why) > 3 else "")
        w(f"| {n} | {STAGE_TITLES[n]} | {cell(st + extra)} | {fmt_s(rec.get('seconds'))} | {rec.get('ended', '—')} |")
    w("")
    w("## Results")
    w("")
    w("Answer: the largest micro-batch each tool reports. True max: the largest micro-batch a fresh "
      f"`batchfit-train` completes {run.k['scan_steps']} steps of "
      + ("on the whole GPU (no limit)" if gpu else "under the probe's whole budget (before the margin)")
      + ", from stage 2. Peak / capacity: "
      + ("batchfit's measured footprint (NVML: the process's memory on the card, CUDA context included) at its "
         "answer; for Lightning and Accelerate the CUDA caching allocator's peak reserved bytes of the largest "
         "size that fit (context not included); capacity is the GPU's total memory."
         if gpu else "batchfit's peak data segment at its answer over the budget; not measured for the Python "
         "peers on CPU."))
    w("")
    w("| model | tool | trials | wall time | answer | true max | answer / true max | peak / capacity |")
    w("|---|---|---:|---:|---:|---:|---:|---|")
    for slot in run.slots:
        key = slot["key"]
        pr, sc = s1.get(f"probe:{key}") or {}, s2.get(f"scan:{key}") or {}
        plan = run.plan(key)
        cap = run.capacity(plan) or (pr.get("device") or {}).get("total_bytes")
        tm = sc.get("true_max")
        tm_text = "—"
        if tm:
            tm_text = str(tm) if sc.get("exact") else f"{tm}–{(sc.get('first_fail') or 0) - 1}" if sc.get("first_fail") else f"≥ {tm}"
        if sc.get("status") in ("not-run", "skipped", "blocked"):
            tm_text = f"{sc['status']}"
        model = f"`{key}`"
        # batchfit
        if pr.get("status") in ("ok", "failed") and pr.get("n_trials") is not None:
            ans = pr.get("answer")
            ans_text = f"{ans}" if ans is not None else "—"
            if ans is not None and pr.get("accumulation") and (pr.get("accumulation") > 1 or pr.get("micro_batch") != ans):
                ans_text += f" (micro {pr.get('micro_batch')} × {pr.get('accumulation')})"
            if pr.get("status") == "failed":
                ans_text = f"failed: {cell(pr.get('reason', ''))[:200]}"
            w(f"| {model} | batchfit probe | {pr.get('n_trials')} | {fmt_s(pr.get('wall_seconds'))} | {ans_text} | {tm_text} "
              f"| {ratio(pr.get('answer'), tm)} | {peak_text(pr.get('peak_bytes'), cap)} |")
        else:
            st_text = pr.get("status", "not run") + (f": {pr['reason']}" if pr.get("reason") else "")
            w(f"| {model} | batchfit probe | {pr.get('n_trials', '—')} | {fmt_s(pr.get('wall_seconds'))} | {cell(st_text)} "
              f"| {tm_text} | — | — |")
        for tool, tool_label in (("lightning", "Lightning `scale_batch_size` binsearch"),
                                 ("accelerate", "Accelerate `find_executable_batch_size`")):
            it = s3.get(f"{tool}:{key}") or {}
            st = it.get("status")
            if st in ("skipped", "not-run") or not it:
                w(f"| {model} | {tool_label} | — | — | {cell((st or 'not run') + ': ' + str(it.get('reason', 'stage 3 not run')))} | "
                  f"{tm_text} | — | — |")
                continue
            trials = it.get("trials") or []
            fits = [t for t in trials if t.get("outcome") == "fits"]
            big = max(fits, key=lambda t: t.get("batch") or 0) if fits else None
            peak = (big or {}).get("peak_reserved_bytes") if gpu else None
            ans = it.get("answer")
            ans_text = str(ans) if ans is not None else f"{st}: {cell(it.get('reason', ''))[:200]}"
            w(f"| {model} | {tool_label} | {len(trials)} | {fmt_s(it.get('search_seconds'))} ({fmt_s(it.get('wall_seconds'))} "
              f"with start-up) | {ans_text} | {tm_text} | {ratio(ans, tm)} | {peak_text(peak, cap)} |")
    w("")
    w("## Training with each recommendation (stage 1)")
    w("")
    w("| model | micro-batch × accumulation | steps | memory limit | result | wall time | samples/s | peak / capacity |")
    w("|---|---:|---:|---|---|---:|---:|---|")
    for slot in run.slots:
        key = slot["key"]
        tr = s1.get(f"train:{key}") or {}
        if not tr:
            w(f"| `{key}` | — | — | — | not run | — | — | — |")
            continue
        res = tr.get("outcome") or tr.get("status")
        if tr.get("status") != "ok":
            res = f"**{cell(tr.get('status'))}**: {cell(tr.get('reason', ''))[:200]}"
        w(f"| `{key}` | {tr.get('micro_batch', '—')} × {tr.get('accumulation', '—')} | {tr.get('steps_done', tr.get('steps', '—'))} "
          f"| {tr.get('memory_limit', '—')} | {res} | {fmt_s(tr.get('wall_seconds'))} | "
          f"{tr.get('samples_per_second') if tr.get('samples_per_second') is not None else '—'} | "
          f"{peak_text(tr.get('peak_bytes'), tr.get('capacity_bytes')) if tr.get('peak_bytes') else cell(tr.get('peak_text', '—'))} |")
    w("")
    w("Peak in training: " + ("the CUDA caching allocator's peak reserved bytes, as `batchfit-train` prints it."
                              if gpu else "`batchfit-train`'s peak RSS, as it prints it."))
    w("")
    w("## batchfit's probes (stage 1)")
    w("")
    for slot in run.slots:
        key = slot["key"]
        pr = s1.get(f"probe:{key}") or {}
        if not pr.get("trials"):
            continue
        w(f"* `{key}` ({label(slot)}): {pr.get('n_trials')} trials, {fmt_s(pr.get('wall_seconds'))} wall "
          f"({fmt_s(pr.get('trial_seconds'))} inside trials), stop `{pr.get('stop_reason')}`; budget "
          f"{fmt_bytes(pr.get('budget_bytes'))}, limit {fmt_bytes(pr.get('limit_bytes'))} (margin {pr.get('margin')}); "
          f"answer {pr.get('answer')}, first failing {pr.get('first_failing_batch')}, "
          f"{pr.get('samples_per_second') and round(pr['samples_per_second'], 1)} samples/s. Sequence (/N = steps of a "
          "confirmation): " + " ".join(
              f"{t['batch']}{'/' + str(t['steps']) if t.get('purpose') == 'confirm' else ''}"
              f"{ {'fits': '✓', 'oom': '✗', 'retries': '↻'}.get(t.get('outcome'), '(' + str(t.get('outcome')) + ')') }"
              for t in pr["trials"])
          + (f". Other processes on the GPU at the start: {fmt_bytes(pr.get('other_processes_bytes'))}"
             if pr.get("other_processes_bytes") else "")
          + (f". Warnings: {'; '.join(pr['warnings'])}" if pr.get("warnings") else "")
          + (f". cpu smoke: batch-1 footprint {fmt_bytes(pr.get('cpu_floor_bytes'))} + headroom "
             f"{fmt_bytes(pr.get('cpu_headroom_bytes'))}" if pr.get("cpu_floor_bytes") else "") + ".")
    w("")
    w("## True maximum (stage 2)")
    w("")
    w("| model | batchfit's answer | runs (✓ completes, ✗ out of memory, ! error, ⏱ timeout) | true max | status | wall time |")
    w("|---|---:|---|---:|---|---:|")
    for slot in run.slots:
        key = slot["key"]
        sc = s2.get(f"scan:{key}") or {}
        if not sc:
            w(f"| `{key}` | — | — | — | not run | — |")
            continue
        tm = sc.get("true_max")
        tm_text = ("—" if not tm else str(tm) if sc.get("exact") else
                   f"in [{tm}, {sc['first_fail']})" if sc.get("first_fail") else f"≥ {tm}")
        st = sc.get("status", "?") + (f": {sc.get('reason')}" if sc.get("reason") and sc.get("status") != "ok" else "")
        pre = f"{sc['answer']}✓ (stage 1) " if sc.get("answer_verified_by") else ""
        w(f"| `{key}` | {sc.get('answer', '—')} | {pre}{seq_text(sc.get('runs'))} | {tm_text} | {cell(st)} | {fmt_s(sc.get('seconds'))} |")
    notes = sorted({r_["note"] for slot in run.slots for r_ in (s2.get(f"scan:{slot['key']}") or {}).get("runs") or []
                    if r_.get("note")})
    for n_ in notes:
        w(f"\n\\* {n_}.")
    w("")
    w(f"Each run: `batchfit-train --plan PLAN --steps {run.k['scan_steps']} --micro-batch N --accumulation 1 --force "
      + ("--memory-limit none` (the whole GPU)" if gpu else "--memory-limit BUDGET`") +
      f", a fresh process; from a prediction (a line through the probe's peaks, extended to the "
      + ("free memory" if gpu else "budget") + f"), up by growing steps until a size fails, then bisection until "
      f"the bracket is at most max(1, {run.k['scan_tol']} × the largest completing size) wide.")
    w("")
    w("## Lightning and Accelerate (stage 3)")
    w("")
    mc = s3.get("modelcheck") or {}
    if mc:
        if mc.get("status") in ("ok", "failed"):
            checks = "; ".join(f"{c.get('model')}: {c.get('parameters')} parameters"
                               + (" = batchfit's" if c.get("match") else f" (batchfit: {c.get('expected_parameters')}) **MISMATCH**")
                               + f" [{c.get('model_source', '?')}]" for c in mc.get("checks") or [])
            steps = "; ".join(f"{s.get('model')} {s.get('precision')}: {'ok' if s.get('ok') else 'FAILED ' + str(s.get('error', ''))}"
                              for s in mc.get("steps") or [])
            w(f"* Model check ({mc.get('status')}): {checks}. Small training steps: {steps}.")
        else:
            w(f"* Model check: {mc.get('status')}: {mc.get('reason')}")
    for slot in run.slots:
        key = slot["key"]
        for tool in ("lightning", "accelerate"):
            it = s3.get(f"{tool}:{key}") or {}
            if not it or it.get("status") in ("skipped", "not-run"):
                continue
            how = (f"init_val {it.get('init_val')} ({it.get('init_val_from')}), max_val {it.get('max_val')}, "
                   f"max_trials {run.k['lightning_max_trials']}, steps_per_trial {run.k['peer_steps']}"
                   + (f", its margin {it.get('lightning_margin')}" if it.get("lightning_margin") is not None else "")
                   if tool == "lightning" else
                   f"starting_batch_size {it.get('starting_batch_size')} ({it.get('start_from')}), {run.k['peer_steps']} "
                   "steps per try, ×0.9 after each out-of-memory")
            w(f"* `{key}`, {'Lightning' if tool == 'lightning' else 'Accelerate'} ({how}): "
              f"{seq_text(it.get('trials'))} → {it.get('answer')}"
              + (f"; **{it.get('status')}**: {it.get('reason')}" if it.get("status") not in ("ok",) else "")
              + f"; {fmt_s(it.get('search_seconds'))} searching, {fmt_s(it.get('wall_seconds'))} with Python start-up"
              + (f"; model: {it.get('model_source')}" if it.get("model_source") else "")
              + (f"; {it.get('note')}" if it.get("note") else "") + ".")
    w("")
    w("The peers train the same architecture as batchfit (models.py: torchvision's ResNet when installed, else a "
      "copy of its layout; batchfit's GPT-2 layout), with the same loss, optimizer (Adam, lr 1e-3) and precision "
      "(amp-bf16 = `torch.autocast(bfloat16)`; Lightning `bf16-mixed`), on synthetic data generated on the device. "
      "Their answers are compared with `batchfit-train`'s true maximum: the same kernels through libtorch, though "
      "torchvision's ResNet uses in-place ReLU, which batchfit's does not, so the peers may fit slightly more. "
      "Lightning's init_val and Accelerate's start are set from batchfit's answer to save device time; from "
      "Lightning's default init_val 2, its doubling would add log2(init_val / 2) trials at small sizes.")
    if not gpu:
        w("")
        w("On CPU the peers run under RLIMIT_DATA = their own loaded size + batchfit's room above its batch-1 "
          "footprint; a Python MemoryError there is counted as out of memory (peers.py). Not comparable with "
          "batchfit's numbers.")
    w("")
    if s4:
        render_exec(run, w, s1, s4, gpu)
    doc = s1.get("doctor") or {}
    if doc:
        w("## batchfit doctor (stage 1)")
        w("")
        if doc.get("gpus"):
            for g in doc["gpus"]:
                procs = g.get("processes") or []
                w(f"* GPU {g.get('index')}: {g.get('name')}, {fmt_bytes(g.get('total_bytes'))} total, "
                  f"{fmt_bytes(g.get('free_bytes'))} free, {fmt_bytes(g.get('used_bytes'))} used, "
                  f"{len(procs)} process(es){' (NVML cannot list them)' if g.get('processes_unavailable') else ''}; "
                  f"driver {doc.get('driver_version')}")
        else:
            w(f"* {doc.get('note') or doc.get('error') or doc.get('reason')}")
        for f_ in (doc.get("findings") or [])[:6]:
            w(f"* finding: {f_}")
        w("")
    if meta.get("gpu_apps_at_start"):
        w(f"Compute processes on the GPU when the run started: {'; '.join(meta['gpu_apps_at_start'])}.")
        w("")
    w("## How to run it again")
    w("")
    w("```sh")
    w("bash scripts/gpu-check.sh --bin DIR            # all stages, about 5 min of GPU time per call")
    w("bash scripts/gpu-check.sh --bin DIR --stages 3,4  # a second call: keeps what succeeded, runs the rest")
    w("bash scripts/gpu-check.sh --bin DIR --stages 4    # only --exec of the Python job (about 5 min)")
    w("bash scripts/gpu-check.sh --cpu-smoke --out /tmp/smoke   # CPU, tiny models (tests/gpu_check.rs)")
    w("```")
    w("")
    w("Raw data: `stage1.json` … `stage4.json`, `plans/`, `peers/`, `exec/`, `logs/` in the run's `--out` "
      "directory.")
    return "\n".join(L).rstrip() + "\n"


def render_exec(run, w, s1, s4, gpu):
    """Stage 4's section: batchfit's answer for its own model (stage 1), its answer for the Python job under
    --exec, and the Python job's true maximum."""
    w("## Your own script: `batchfit probe --exec` of the Python job (stage 4)")
    w("")
    w("The same model and precision as a plain PyTorch training script (`scripts/gpu_check/job.py`: the peers' "
      "model, Adam, synthetic batches on the device; it reports each trial through `batchfit python-helper`'s "
      "`batchfit_trial.py`), probed by `batchfit probe --exec`, each trial the script in a fresh process; its "
      "true maximum by the same fine scan as stage 2, of fresh runs of the script "
      + ("on the whole GPU (no limit)." if gpu else "under the exec probe's whole budget, limited the way the "
         "probe's trials were (its `limit_mechanism`: a memory cgroup per run, or RLIMIT_DATA).")
      + " The first column is stage 1's answer for batchfit's own model of the same architecture (what batchfit "
      "answers without running your script).")
    w("")
    w("| model | batchfit's own model (stage 1) | `--exec` of job.py: trials, wall time | `--exec` answer | true max of job.py | `--exec` / true max | own model / true max of job.py | limit |")
    w("|---|---:|---:|---:|---:|---:|---:|---|")
    for slot in exec_slots(run):
        key = slot["key"]
        pr, ex, sc = s1.get(f"probe:{key}") or {}, s4.get(f"exec-probe:{key}") or {}, s4.get(f"exec-scan:{key}") or {}
        zoo = pr.get("answer") if pr.get("status") == "ok" else None
        tm = sc.get("true_max")
        tm_text = "—"
        if tm:
            tm_text = str(tm) if sc.get("exact") else f"{tm}–{(sc.get('first_fail') or 0) - 1}" if sc.get("first_fail") else f"≥ {tm}"
        if sc and sc.get("status") != "ok":
            tm_text = f"{cell(sc.get('status'))}: {cell(sc.get('reason', ''))[:160]}" if not tm else tm_text + f" ({sc.get('status')})"
        ans = ex.get("answer")
        ans_text = str(ans) if ans is not None else f"{cell(ex.get('status', 'not run'))}: {cell(ex.get('reason', ''))[:160]}"
        if ans is not None and ex.get("accumulation") and (ex.get("accumulation") > 1 or ex.get("micro_batch") != ans):
            ans_text += f" (micro {ex.get('micro_batch')} × {ex.get('accumulation')})"
        w(f"| `{key}` | {zoo if zoo is not None else '—'} | {ex.get('n_trials', '—')}, {fmt_s(ex.get('wall_seconds'))} | "
          f"{ans_text} | {tm_text} | {ratio(ans, tm)} | {ratio(zoo, tm)} | "
          f"{ex.get('limit_mechanism') or '—'}, {fmt_bytes(ex.get('limit_bytes'))} |")
    w("")
    for slot in exec_slots(run):
        key = slot["key"]
        ex, sc = s4.get(f"exec-probe:{key}") or {}, s4.get(f"exec-scan:{key}") or {}
        if ex.get("trials"):
            w(f"* `{key}` `--exec`: {ex.get('n_trials')} trials, stop `{ex.get('stop_reason')}`; budget "
              f"{fmt_bytes(ex.get('budget_bytes'))}, limit {fmt_bytes(ex.get('limit_bytes'))} "
              f"({ex.get('limit_mechanism')}); {ex.get('fits_with_report', 0)} fitting trials reported through the "
              "helper. Sequence: " + " ".join(
                  f"{t['batch']}{'/' + str(t['steps']) if t.get('purpose') == 'confirm' else ''}"
                  f"{ {'fits': '✓', 'oom': '✗', 'retries': '↻'}.get(t.get('outcome'), '(' + str(t.get('outcome')) + ')') }"
                  for t in ex["trials"])
              + (f". cpu smoke: the job's batch-1 footprint {fmt_bytes(ex.get('cpu_floor_bytes'))} + headroom "
                 f"{fmt_bytes(ex.get('cpu_headroom_bytes'))}" if ex.get("cpu_floor_bytes") else "")
              + (f". Warnings: {'; '.join(ex['warnings'])}" if ex.get("warnings") else "") + ".")
        if sc.get("runs"):
            w(f"* `{key}` true maximum of job.py ({fmt_s(sc.get('seconds'))}): "
              + (f"{sc['answer']}✓ (verified) " if sc.get("answer_verified_by") else "") + seq_text(sc.get("runs"))
              + f"; {sc.get('memory_limit')}.")
    w("")


def render_all(run):
    text = render(run)
    write_text(os.path.join(run.out, "results.md"), text)
    if run.mode == "gpu" and run.cfg.get("doc"):
        write_text(run.cfg["doc"], text)


# ------------------------------------------------------------------------------------------------------
# commands
# ------------------------------------------------------------------------------------------------------

def cmd_init(a):
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    old = load(os.path.join(out, "config.json"))
    if old and old.get("mode") != a.mode:
        sys.exit(f"check.py: {out} holds a {old.get('mode')} run; use another --out for a {a.mode} run")
    knobs = {k: (v[0] if a.mode == "gpu" else v[1]) for k, v in KNOBS.items()}
    for s in a.set or []:
        k, _, val = s.partition("=")
        if k not in KNOBS:
            sys.exit(f"check.py: unknown setting {k!r}; settings: {', '.join(KNOBS)}")
        d = KNOBS[k][0]
        try:
            knobs[k] = type(d)(val) if not isinstance(d, str) else val
        except ValueError:
            sys.exit(f"check.py: {k}={val!r} is not a {type(d).__name__}")
    bin_dir = os.path.abspath(a.bin)
    cfg = {"mode": a.mode, "out": out, "bin": bin_dir, "python": a.python, "root": a.root,
           "started": time.time(), "deadline": time.time() + float(a.time_budget), "time_budget": a.time_budget,
           "stamp_device": a.stamp_device, "commit": a.commit, "commit_source": a.commit_source,
           "redo": bool(a.redo), "knobs": knobs,
           "doc": os.path.join(a.root, "docs", "gpu-results.md") if a.mode == "gpu" else None,
           "batchfit_sha256": sha256_of(os.path.join(bin_dir, "batchfit")),
           "batchfit_train_sha256": sha256_of(os.path.join(bin_dir, "batchfit-train"))}
    save(os.path.join(out, "config.json"), cfg)
    meta = load(os.path.join(out, "meta.json"))
    meta.setdefault("calls", []).append(f"{now_utc()}: stages {a.stages}, time budget {a.time_budget} s"
                                        + (" (--redo)" if a.redo else ""))
    meta["batchfit_version"] = a.batchfit_version
    meta["versions"] = versions()
    meta["env"] = {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH")}
    meta["host"] = os.uname().nodename
    meta["nproc"] = os.cpu_count()
    if a.mode == "gpu":
        meta["gpu_apps_at_start"] = gpu_apps()
    save(os.path.join(out, "meta.json"), meta)
    for n in ("1", "2", "3", "4"):
        data = load(os.path.join(out, f"stage{n}.json"))
        # an item left "running" by a killed call is not a result
        changed = False
        for k, v in (data.get("items") or {}).items():
            if v.get("status") == "running":
                v.update(status="incomplete", reason="the call running it was stopped")
                changed = True
        if changed:
            save(os.path.join(out, f"stage{n}.json"), data)
    return 0


def versions():
    from harness.pkgversions import package_versions
    return package_versions()


def cmd_stage(a):
    run = Run(a.out)
    signal.signal(signal.SIGTERM, procs.on_term)
    signal.signal(signal.SIGINT, procs.on_term)
    {"1": stage1, "2": stage2, "3": stage3, "4": stage4}[a.n](run)
    st, why = stage_status(run, a.n)
    for line in why:
        log(f"stage {a.n}: {line}")
    return {"ok": 0, "incomplete": 5}.get(st, 1)


def cmd_finish(a):
    run = Run(a.out)
    stages = load(os.path.join(run.out, "stages.json"))
    st, why = stage_status(run, a.n)
    stages[a.n] = {"rc": a.rc, "seconds": round(a.seconds, 1), "ended": now_utc(), "status": st, "why": why}
    save(os.path.join(run.out, "stages.json"), stages)
    render_all(run)
    log(f"stage {a.n}: {st} in {fmt_s(a.seconds)} (exit {a.rc}); results in {os.path.join(run.out, 'results.md')}"
        + (f" and {run.cfg['doc']}" if run.mode == "gpu" and run.cfg.get("doc") else ""))
    return 0


def cmd_report(a):
    render_all(Run(a.out))
    return 0


def cmd_summary(a):
    run = Run(a.out)
    stages = load(os.path.join(run.out, "stages.json"))
    bad, again = False, []
    for n in a.stages.split(","):
        st, why = stage_status(run, n)
        rec = stages.get(n) or {}
        print(f"stage {n} ({STAGE_TITLES[n]}): {st}, {fmt_s(rec.get('seconds'))}")
        for line in why:
            print(f"  {line}")
        if st != "ok" or rec.get("rc") not in (0, None):
            bad = True
        if st in ("incomplete", "not run"):
            again.append(n)
    print(f"results: {os.path.join(run.out, 'results.md')}"
          + (f" and {run.cfg['doc']}" if run.mode == "gpu" and run.cfg.get("doc") else ""))
    if again:
        print(f"to finish: bash scripts/gpu-check.sh{' --cpu-smoke' if run.mode == 'cpu' else ''} --out {run.out} "
              f"--bin {run.bin} --stages {','.join(again)}")
    return 1 if bad else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init")
    i.add_argument("--out", required=True)
    i.add_argument("--mode", choices=["gpu", "cpu"], required=True)
    i.add_argument("--bin", required=True)
    i.add_argument("--python", required=True)
    i.add_argument("--root", required=True)
    i.add_argument("--time-budget", type=float, required=True)
    i.add_argument("--stamp-device", default="?")
    i.add_argument("--commit", default="unknown")
    i.add_argument("--commit-source", default="?")
    i.add_argument("--batchfit-version", default="?")
    i.add_argument("--stages", default="1,2,3,4")
    i.add_argument("--set", action="append")
    i.add_argument("--redo", action="store_true")
    s = sub.add_parser("stage")
    s.add_argument("n", choices=["1", "2", "3", "4"])
    s.add_argument("--out", required=True)
    f = sub.add_parser("finish")
    f.add_argument("n", choices=["1", "2", "3", "4"])
    f.add_argument("--out", required=True)
    f.add_argument("--rc", type=int, required=True)
    f.add_argument("--seconds", type=float, required=True)
    r = sub.add_parser("report")
    r.add_argument("--out", required=True)
    m = sub.add_parser("summary")
    m.add_argument("--out", required=True)
    m.add_argument("--stages", default="1,2,3,4")
    k = sub.add_parser("knobs")
    k.add_argument("--mode", default="gpu")
    a = p.parse_args()
    if a.cmd == "knobs":
        for key, (g, c, meaning) in KNOBS.items():
            print(f"  {key:<22} gpu {g!s:<7} cpu-smoke {c!s:<7} {meaning}")
        return 0
    return {"init": cmd_init, "stage": cmd_stage, "finish": cmd_finish, "report": cmd_report,
            "summary": cmd_summary}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
