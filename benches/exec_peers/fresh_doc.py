"""The exec-fresh section of docs/benchmarks.md (``run.py --section fresh --stages doc``): per script and
mechanism batchfit's answer, its cost, how many fresh runs of the script completed at the answer and one
guard band above it under the plan's own limit, and the peer's answer; then every run's peak against the
plan's figure at the answer."""
from harness.units import mib, seconds_then_minutes as fmt_s

FRESH_BEGIN, FRESH_END = "<!-- exec-fresh:begin -->", "<!-- exec-fresh:end -->"
PEER_NAMES = {"lightning": "Lightning binsearch", "accelerate": "Accelerate `find_executable_batch_size`",
              "hf": "Trainer `auto_find_batch_size`"}


def _mb(b):
    return "—" if b is None else f"{b / 1048576:+.1f}"


def peer_cells(it):
    cells = []
    for tool, name in PEER_NAMES.items():
        s = it.get(tool)
        if not s or s.get("not_applicable"):
            continue
        ans = s.get("answer")
        why = s.get("error") or s.get("summary") or "?"
        cells.append(f"{name}: " + (f"**{ans}**" if ans is not None else f"none (`{why[:110]}`)")
                     + f", {fmt_s(s.get('wall_seconds'))}")
    return "; ".join(cells) or "—"


def counts(f, size):
    """'fits/runs' of one size's runs; under RLIMIT_DATA 'completed c, within the limit by the tree's summed
    memory m / runs' when the two differ (batchfit counts a completed run above it as over-budget)."""
    runs = [r for r in f.get("runs") or [] if r["size"] == size]
    done = sum(r["outcome"] == "fits" for r in runs)
    within = sum(r["outcome"] == "fits" and not r.get("over_budget") for r in runs)
    text = f"{within}/{len(runs)}" if done == within else f"{within}/{len(runs)} (completed {done}/{len(runs)})"
    return f"**{text}**" if size == "answer" and within < len(runs) else text


def fresh_cells(f):
    if not f or f.get("error"):
        return "—", "—", (f or {}).get("error", "not run")
    if not f.get("runs"):
        return "running", "—", "—"
    at = counts(f, "answer")
    up = f"{f.get('above')}: {counts(f, 'above')}"
    at_runs = [r for r in f["runs"] if r["size"] == "answer"]
    xs = [r["excess_bytes"] for r in at_runs if r.get("excess_bytes") is not None]
    ex = f"{_mb(min(xs))} to {_mb(max(xs))}" if xs else "—"
    pss = (f.get("plan_at_answer") or {}).get("tree_pss")
    if f.get("mechanism") == "rlimit-data" and pss:
        ts = [r["tree_pss_peak"] - pss for r in at_runs if r.get("tree_pss_peak")]
        if ts:
            ex = f"VmData {ex}; tree {_mb(min(ts))} to {_mb(max(ts))}"
    return at, up, ex


def budget_cell(f):
    if not f or not f.get("runs"):
        return "not run"
    cell = counts(f, "answer")
    if any(r["size"] == "above" for r in f["runs"]):
        cell += f"; {f.get('above')}: {counts(f, 'above')}"
    return cell


def observations(key, f):
    out = []
    for r in (f or {}).get("runs") or []:
        if r["size"] == "answer" and (r["outcome"] != "fits" or r.get("over_budget")):
            if r.get("over_budget"):
                pa = (f.get("plan_at_answer") or {}).get("tree_pss")
                out.append(f"`{key}`: a fresh run at the answer {f['answer']} completed, but its tree's summed "
                           f"Pss_Anon + Pss_Shmem peaked at {mib(r.get('tree_pss_peak') or 0)}, above the "
                           f"{mib(f.get('limit_bytes') or 0)} limit (the plan's trial at the answer: "
                           f"{mib(pa or 0)}; batchfit calls such a trial over-budget); largest VmData "
                           f"{_mb(r.get('excess_bytes'))} MiB against the plan's.")
            else:
                out.append(f"`{key}`: a fresh run at the answer {f['answer']} did not fit ({r['outcome']}: "
                           f"{r.get('why') or ''}); its peak ({r.get('excess_measure')}) was "
                           f"{_mb(r.get('excess_bytes'))} MiB against the plan's at the answer.")
    return out


def render_fresh(res):
    cfg, m, g = res.get("config", {}), res.get("machine", {}), res.get("git", {})
    L = []
    w = L.append
    w("## `--exec`: does the answer hold in fresh runs? (CPU, real runs)")
    w("")
    w("For each script and limit mechanism: `batchfit probe --exec` gives an answer; then the same command is run "
      f"again, each time a fresh process, **{cfg.get('fresh_runs')} times at the answer** and "
      f"**{cfg.get('above_runs')} times at the size one guard band above it**, under the very limit the plan's "
      "trials had (the plan's `limit_bytes`, applied by its `limit_mechanism`), with the plan's confirmation steps "
      "and accumulation 1. The promise: every run at the answer completes. The size above is the answer plus the "
      "fewest samples that add one guard band (`guard_band_bytes`) by the plan's fitted line "
      "(`capacity_model.per_sample_bytes`). The peer (the finder the script's framework ships) runs in the same "
      f"sitting under the job's budget (B = {cfg.get('budget')} bytes, batchfit's `--memory-budget` with "
      "`--margin 0`). Where time allowed, the answer was also run under B itself (the limit the user's job has; "
      "the trials' limit is B less the guard band): column \"at the answer under B\". Produced by `benches/exec_peers/run.sh --results benches/data/exec_everyday.json --section "
      "fresh --stages batchfit,lightning,accelerate,hf,fresh-budget,doc --scripts plain,lightning,lightning-wide,"
      "workers,accelerate-workers,hf-trainer`; raw results in `benches/data/exec_everyday.json`.")
    w("")
    la = " / ".join(m.get("loadavg") or ["?"])
    w(f"* **Date** {res.get('date', '?')} (stages ended {res.get('first_stage_end', '?')} to "
      f"{res.get('last_stage_end', '?')}). Binaries: `{cfg.get('bin_dir', '?')}`, built from main at "
      f"`{cfg.get('bin_commit') or g.get('commit', '?')}` (sha256 `{cfg.get('batchfit_sha256', '?')}…`).")
    w(f"* **Machine** {m.get('nproc', '?')} cores ({m.get('cpu', '?')}), Linux {m.get('kernel', '?')}, memory cgroups "
      f"{((m.get('cgroup_parent') or ['?'])[0])}; **shared with other agents' builds and tests** (load average "
      f"{la} at the start, 2 cores; per run in the raw results); every run under `nice -n {cfg.get('nice')}`. Wall "
      "times are loaded times.")
    w(f"* **Software** Python {m.get('python', '?')}, torch {m.get('torch', '?')}, Lightning {m.get('lightning', '?')}, "
      f"Accelerate {m.get('accelerate', '?')}, transformers {m.get('transformers', '?')}, numpy {m.get('numpy', '?')}.")
    w("")
    w("| script | limit | batchfit answer | trials | wall time | fresh at answer | one band above: size, fits | "
      "fresh peak − plan's peak at the answer, MiB | at the answer under B | peer: answer, wall time |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    obs = []
    for key, it in (res.get("items") or {}).items():
        mech, script = key.split("/")
        bf, f = it.get("batchfit") or {}, it.get("fresh10") or {}
        at, up, ex = fresh_cells(f)
        ans = bf.get("answer") if bf.get("answer") is not None else f"none ({(bf.get('error') or bf.get('stop_reason') or '?')[:80]})"
        w(f"| {script} | `{bf.get('limit_mechanism') or mech}` | {ans} | {bf.get('n_trials', '—')} | "
          f"{fmt_s(bf.get('wall_seconds'))} | {at} | {up} | {ex} | {budget_cell(it.get('fresh-budget'))} | "
          f"{peer_cells(it)} |")
        obs += observations(key, f)
        obs += observations(key + " under B", it.get("fresh-budget"))
    w("")
    w("Peaks compared: under a cgroup the group's anonymous + shmem memory (`memory.stat`; the kernel's own peak "
      "counts page cache and reads ~100 % near the limit), against the plan's `details.cgroup_anon_peak_bytes`; "
      "under `RLIMIT_DATA` the largest `VmData` of any process of the tree, against the plan's `peak_bytes`, and "
      "(\"tree\") the tree's summed `Pss_Anon + Pss_Shmem` (`/proc/PID/smaps_rollup`, the trainer read before "
      "its workers in each round) against the plan's `details.tree_pss_peak_bytes`: the figure batchfit holds a "
      "command's tree to under `RLIMIT_DATA` (above the limit a trial is `over-budget`, never a fit), so a fresh "
      "run that completed with its tree above the limit counts here as not fitting. "
      "Sampled every 10 ms from outside the run (more slowly while the machine is loaded): a spike shorter than "
      "that (a batch's allocation just before the OOM killer ends the run) is missed, so a killed run's figure is "
      "a lower bound. Batchfit's trials run 3 steps and the confirmation 5; the fresh runs the confirmation's "
      "steps.")
    w("")
    w("### Details")
    w("")
    for key, it, f in [(k + (" under B" if n == "fresh-budget" else ""), it, it.get(n) or {})
                       for k, it in (res.get("items") or {}).items() for n in ("fresh10", "fresh-budget")]:
        if not f.get("runs"):
            continue
        pa = f.get("plan_at_answer") or {}
        w(f"* `{key}`: limit {f.get('limit_bytes')} bytes ({mib(f.get('limit_bytes') or 0)}), guard band "
          f"{mib(f.get('guard_band_bytes') or 0)}, {round(f.get('per_sample_bytes') or 0)} bytes per sample "
          f"({f.get('above_from')}); the plan at {f.get('answer')}: peak {mib(pa.get('peak_bytes') or 0)}"
          + (f", cgroup anon {mib(pa['cgroup_anon'])}" if pa.get("cgroup_anon") else "")
          + (f", tree PSS {mib(pa['tree_pss'])}" if pa.get("tree_pss") else "")
          + ". Runs: " + ", ".join(
              f"{r['batch']}{'✓' if r['outcome'] == 'fits' and not r.get('over_budget') else '✗'}"
              f"({_mb(r.get('excess_bytes'))}, {r['seconds']:.0f}s)" for r in f["runs"])
          + f"; {fmt_s(f.get('wall_seconds'))} in all.")
    w("")
    w("### Observations")
    w("")
    for o in obs or ["Every fresh run at the answer completed."]:
        w(f"* {o}")
    for o in res.get("fresh_observations") or []:
        w(f"* {o}")
    w("")
    return "\n".join(L).rstrip() + "\n"
