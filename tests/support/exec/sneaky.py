#!/usr/bin/env python3
"""Fake training command for tests/exec_sound.rs: standard library only. Each mode is a way a job can
exit 0 (or fail) while a naive reading of it would lie about whether the batch fits.

  sneaky.py MODE BATCH [--fits-up-to N] [--helper DIR]

Sizes up to N (default 8) "fit" (exit 0 after the mode's trick); above N the job runs out of memory
for real (oom.py: its data segment taken to RLIMIT_DATA, then MemoryError), so the search has a proof
either way. Modes (applied to every size):

  child-oom      a child touches 512 MiB (the kernel's OOM killer kills it under a smaller cgroup
                 limit); the root ignores the child's death and exits 0
  child-killed   a child is SIGKILLed and stays a zombie for a moment; the root exits 0
  leave-behind   a grandchild in its own session sleeps on; the root exits 0
  log-lines      prints lines that mention memory, then raises ValueError above N (not MemoryError)
  cuda-ooms      reports (helper format) a CUDA allocator that counted 2 OOMs; exits 0
  shared         touches 256 MiB of shared anonymous memory (not in RLIMIT_DATA); exits 0
  nan            reports a step time of NaN
  short-dataset  reports `samples` = min(batch, 5) (a dataset of 5 samples)
  ranks-missing  reports world size 2 as rank 0 but writes no rank 1 report
  ranks-batch    reports world size 2; rank 1's report says another batch
  ranks-world    reports world size 3 (all three ranks' reports), while the plan is for 1
  maxrss         does nothing (a trial shorter than anything it could allocate)
  grows          holds `batch` MiB a moment (hold.py): an honest job whose memory grows
  ignore-batch   holds 8 MiB at every size and never runs out (a script that ignores its {batch})
  retry-silent   above N each attempt takes the data segment to RLIMIT_DATA (its allocation fails
                 there), then the job halves its batch until it is at most N (an out-of-memory
                 retry inside the job, saying nothing), holds that many MiB, exits 0
  retry-logged   the same, logging each caught out-of-memory in PyTorch's words on stderr
  clamp          trains min(batch, N) samples whatever it is given (a dataset of N samples without
                 drop_last, a size clamped in the script): holds that many MiB, exits 0
  retry-reported above N each attempt is refused at once, before it touches a page (as a caching
                 allocator refuses a block), and the job halves its batch until it is at most N,
                 holds that many MiB and writes a report that says it read and ran the size it was
                 given (a finder inside the job behind the helper's batch_size())
"""
import json
import mmap
import os
import subprocess
import sys
import time

mode, batch = sys.argv[1], int(sys.argv[2])
fits_up_to = 8
helper = None
args = sys.argv[3:]
while args:
    if args[0] == "--fits-up-to":
        fits_up_to = int(args[1])
    elif args[0] == "--helper":
        helper = args[1]
    args = args[2:]

if mode == "log-lines":
    print("INFO MemoryErrorHandler installed", flush=True)
    print("Tip: if you see CUDA out of memory, lower the batch", file=sys.stderr, flush=True)
    if batch > fits_up_to:
        raise ValueError(f"label {batch} is out of range")
    sys.exit(0)

if mode == "retry-reported":
    import hold  # next to this file

    ran = batch
    while ran > fits_up_to:
        try:
            bytearray(ran << 40)  # more than any machine: refused before a page is touched
        except MemoryError:
            ran //= 2
    buf = hold.hold(ran)
    with open(os.environ["BATCHFIT_RESULT"], "w") as f:
        json.dump({"schema": "batchfit-trial-report/1", "batch": batch, "reads_batch": True,
                   "steps": int(os.environ.get("BATCHFIT_STEPS", "1")),
                   "accumulation": int(os.environ.get("BATCHFIT_ACCUMULATION", "1")),
                   "reads_accumulation": True, "step_seconds": [0.01], "rank": 0,
                   "world_size": 1, "cuda": None}, f)
    sys.exit(0)

if mode == "clamp":
    import hold  # next to this file

    hold.hold(min(batch, fits_up_to))
    sys.exit(0)

if mode in ("grows", "ignore-batch", "retry-silent", "retry-logged"):
    import hold  # next to this file

    ran = 8 if mode == "ignore-batch" else batch
    while mode.startswith("retry") and ran > fits_up_to:
        import oom

        del oom.reach_limit(hold=0.1)[:]  # the attempt ran out at the limit (RLIMIT_DATA only)
        if mode == "retry-logged":
            print(f"caught torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {ran} MiB; "
                  f"retrying with batch {ran // 2}", file=sys.stderr, flush=True)
        ran //= 2
    if ran > fits_up_to:
        import oom

        oom.run_out()
    hold.hold(ran)
    sys.exit(0)

if batch > fits_up_to:
    import oom  # next to this file

    oom.run_out()


def report(path, **over):
    obj = {
        "schema": "batchfit-trial-report/1",
        "batch": batch,
        "steps": int(os.environ.get("BATCHFIT_STEPS", "1")),
        "accumulation": int(os.environ.get("BATCHFIT_ACCUMULATION", "1")),
        "reads_accumulation": True,
        "step_seconds": [0.01],
        "rank": 0,
        "world_size": 1,
        "cuda": None,
    }
    obj.update(over)
    with open(path, "w") as f:
        f.write(json.dumps(obj))


result = os.environ.get("BATCHFIT_RESULT")
if mode == "child-oom":
    code = "b = bytearray(512 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
    subprocess.run([sys.executable, "-c", code])  # its death by SIGKILL is ignored
elif mode == "child-killed":
    p = subprocess.Popen(["sleep", "30"])
    time.sleep(0.05)
    os.kill(p.pid, 9)
    time.sleep(0.5)  # a zombie for a while
    p.wait()
elif mode == "leave-behind":
    subprocess.Popen(["setsid", "sleep", "30"], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.1)
elif mode == "cuda-ooms":
    report(result, cuda={"device": "cuda:0", "peak_allocated_bytes": 1, "peak_reserved_bytes": 1,
                         "reserved_bytes": 1, "alloc_retries": 2, "ooms": 2})
elif mode == "shared":
    m = mmap.mmap(-1, 256 << 20)  # MAP_SHARED | MAP_ANONYMOUS: shmem, outside the data segment
    for i in range(0, len(m), 4096):
        m[i] = 1
    time.sleep(0.2)
elif mode == "nan":
    with open(result, "w") as f:
        f.write('{"schema": "batchfit-trial-report/1", "batch": %d, "steps": 1, "accumulation": 1, '
                '"reads_accumulation": false, "step_seconds": [NaN], "rank": 0, "world_size": 1}' % batch)
elif mode == "short-dataset":
    report(result, samples=min(batch, 5))
elif mode == "ranks-missing":
    report(result, world_size=2)
elif mode == "ranks-batch":
    report(result, world_size=2)
    report(result + ".rank1", world_size=2, rank=1, batch=batch + 1)
elif mode == "ranks-world":
    report(result, world_size=3)
    report(result + ".rank1", world_size=3, rank=1)
    report(result + ".rank2", world_size=3, rank=2)
elif mode == "maxrss":
    pass
else:
    sys.exit(f"sneaky.py: unknown mode {mode}")
time.sleep(0.05)
sys.exit(0)
