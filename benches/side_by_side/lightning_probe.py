#!/usr/bin/env python3
"""Lightning (and Accelerate) side of the batchfit side-by-side benchmark.

The model is batchfit's default MLP written as a LightningModule: 1024 -> 2048 -> 2048 -> 10, ReLU,
cross-entropy, Adam (lr 1e-3, betas 0.9/0.999, eps 1e-8, no weight decay), synthetic random data
(``randn`` inputs, ``randint`` labels, generated per batch like batchfit's ``Synthetic`` source).

Every mode runs under ``RLIMIT_DATA = --limit`` (set first thing, before torch is imported, soft and hard)
with ``MALLOC_MMAP_THRESHOLD_=65536`` and ``MALLOC_ARENA_MAX=2`` in the environment (the script re-executes
itself once to put them there, since glibc reads them at start-up), and ``torch.set_num_threads(--threads)``.
That is the set-up of a batchfit trial process.

Modes:
  finder      Tuner(trainer).scale_batch_size(model, mode="binsearch", ...) in one process; records every
              batch size tried and whether it fit (by wrapping Lightning's own trial runner), the wall time
              and the answer, and writes the sequence JSON.
  accelerate  accelerate.utils.find_executable_batch_size(starting_batch_size=...) around a Lightning fit of
              --steps steps; records the same.
  fit         one fresh Lightning fit of --steps steps at --batch. Exit 0 when it completes, 6 when it runs
              out of memory (libtorch's "can't allocate memory" or Python's MemoryError), 7 for another error.
              Used by run.sh to scan for the true maximum (one fresh process per probe).
"""
import argparse
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))  # harness
from harness.files import save_json  # noqa: E402
from harness.peers import (each_trial, first_line, import_accelerate, lightning_is_oom_error,  # noqa: E402
                           lightning_trainer)
from harness.procs import EXIT_OOM, limit_data, proc_status, reexec_with_malloc_env  # noqa: E402

EXIT_OTHER = 7


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["finder", "accelerate", "fit"])
    p.add_argument("--limit", type=int, required=True, help="RLIMIT_DATA in bytes (0: none)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, help="fit: the batch size")
    p.add_argument("--steps", type=int, default=5, help="fit/accelerate: optimizer steps")
    p.add_argument("--init-val", type=int, default=2)
    p.add_argument("--max-val", type=int, default=1048576)
    p.add_argument("--max-trials", type=int, default=25)
    p.add_argument("--steps-per-trial", type=int, default=3)
    p.add_argument("--starting-batch-size", type=int, default=128, help="accelerate")
    p.add_argument("--out", help="finder/accelerate: the sequence JSON to write")
    p.add_argument("--report", help="a JSON file for timing and details (all modes)")
    return p.parse_args()


def setup_process(args):
    """Malloc environment (re-exec once), then the data limit: before torch is imported."""
    reexec_with_malloc_env()
    if args.limit > 0:
        limit_data(args.limit)


def build(args):
    """Imports torch/Lightning and returns (module class, trainer factory, is_oom)."""
    import torch
    from torch import nn
    from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler
    import lightning.pytorch as pl
    from harness.models import adam, build_mlp

    torch.set_num_threads(args.threads)

    class SyntheticBatches(Dataset):
        """Indexed by a list of indices (from a BatchSampler): returns a whole random batch at once, so
        no per-sample tensors are collated (batchfit draws each batch with one randn/randint call)."""

        def __init__(self, length, features, classes):
            self.length, self.features, self.classes = length, features, classes

        def __len__(self):
            return self.length

        def __getitem__(self, indices):
            n = len(indices)
            return torch.randn(n, self.features), torch.randint(self.classes, (n,))

    class Mlp(pl.LightningModule):
        def __init__(self, batch_size, input=1024, hidden=(2048, 2048), classes=10):
            super().__init__()
            self.net = build_mlp(input, hidden, classes)
            self.batch_size = batch_size
            self.input, self.classes = input, classes
            self.steps_run = 0

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.steps_run += 1
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return adam(self.parameters())  # lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight decay

        def train_dataloader(self):
            # longer than max_val so Lightning's "batch size >= dataset length" stop never triggers
            ds = SyntheticBatches(1 << 21, self.input, self.classes)
            sampler = BatchSampler(SequentialSampler(range(len(ds))), batch_size=self.batch_size, drop_last=False)
            return DataLoader(ds, sampler=sampler, batch_size=None, num_workers=0)

    def trainer(max_steps, root):
        return lightning_trainer(pl, max_steps, root)

    torch.manual_seed(args.seed)
    return Mlp, trainer, lightning_is_oom_error()


def classify(exc, is_oom_error):
    if isinstance(exc, MemoryError) or is_oom_error(exc):
        return "oom"
    return "error"


def write_json(path, obj):
    if path:
        save_json(path, obj)


def mode_fit(args):
    import tempfile

    t0 = time.monotonic()
    Mlp, trainer, is_oom_error = build(args)
    report = {"mode": "fit", "batch": args.batch, "steps": args.steps, "limit": args.limit}
    with tempfile.TemporaryDirectory() as root:
        model = Mlp(args.batch)
        try:
            trainer(args.steps, root).fit(model)
            ok = model.steps_run == args.steps
            report.update(outcome="fits" if ok else "error", steps_run=model.steps_run)
        except BaseException as e:  # noqa: BLE001 - classify everything, MemoryError included
            report.update(outcome=classify(e, is_oom_error), message=first_line(e), steps_run=model.steps_run)
    report.update(seconds=round(time.monotonic() - t0, 3), vm_data_end=proc_status("VmData") or 0,
                  rss_peak=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    write_json(args.report, report)
    print(json.dumps(report), flush=True)
    return {"fits": 0, "oom": EXIT_OOM}.get(report["outcome"], EXIT_OTHER)


def mode_finder(args):
    import tempfile
    import lightning.pytorch.tuner.batch_size_scaling as bss

    t_start = time.monotonic()
    Mlp, trainer, is_oom_error = build(args)
    from lightning.pytorch.tuner import Tuner

    trials = []
    details = []
    state = {}

    def begin(tr, params):
        model = tr.lightning_module
        return int(model.batch_size), model, model.steps_run, time.monotonic()

    def failed(token, e):
        b, model, before, t0 = token
        kind = classify(e, is_oom_error)
        trials.append({"batch": b, "fits": False})
        details.append({"batch": b, "outcome": kind, "seconds": round(time.monotonic() - t0, 3),
                        "steps_run": model.steps_run - before, "message": first_line(e)})
        flush(None)

    def fitted(token):
        b, model, before, t0 = token
        trials.append({"batch": b, "fits": True})
        details.append({"batch": b, "outcome": "fits", "seconds": round(time.monotonic() - t0, 3),
                        "steps_run": model.steps_run - before})
        flush(None)

    def flush(answer, done=False, error=None):
        seq = {"tool": "lightning-binsearch", "max_val": args.max_val, "init_val": args.init_val,
               "steps_per_trial": args.steps_per_trial, "trials": trials, "answer": answer}
        if done:
            write_json(args.out, seq)
        rep = {"mode": "finder", "limit": args.limit, "threads": args.threads, "done": done, "answer": answer,
               "error": error, "trials": details, "n_trials": len(trials),
               "seconds": round(time.monotonic() - t_start, 3),
               "setup_seconds": state.get("setup_seconds"), "search_seconds": state.get("search_seconds")}
        write_json(args.report, rep)

    bss._try_loop_run = each_trial(bss._try_loop_run, begin, fitted, failed)
    with tempfile.TemporaryDirectory() as root:
        model = Mlp(args.init_val)
        tr = trainer(1, root)
        tuner = Tuner(tr)
        state["setup_seconds"] = round(time.monotonic() - t_start, 3)
        t0 = time.monotonic()
        try:
            answer = tuner.scale_batch_size(model, mode="binsearch", steps_per_trial=args.steps_per_trial,
                                            max_trials=args.max_trials, init_val=args.init_val,
                                            max_val=args.max_val)
        except BaseException as e:  # noqa: BLE001
            state["search_seconds"] = round(time.monotonic() - t0, 3)
            flush(None, done=False, error=f"{type(e).__name__}: {first_line(e)}")
            print(f"lightning finder failed: {type(e).__name__}: {first_line(e)}", file=sys.stderr)
            return 1
        state["search_seconds"] = round(time.monotonic() - t0, 3)
    flush(int(answer), done=True)
    print(json.dumps({"answer": int(answer), "trials": trials, "seconds": round(time.monotonic() - t_start, 3)}))
    return 0


def mode_accelerate(args):
    import tempfile
    find_executable_batch_size, _ = import_accelerate()

    t_start = time.monotonic()
    Mlp, trainer, is_oom_error = build(args)
    trials, details = [], []

    def flush(answer, done=False, error=None):
        if done:
            write_json(args.out, {"tool": "accelerate", "init_val": args.starting_batch_size,
                                  "starting_batch_size": args.starting_batch_size,
                                  "steps_per_trial": args.steps, "trials": trials, "answer": answer})
        write_json(args.report, {"mode": "accelerate", "limit": args.limit, "done": done, "answer": answer,
                                 "error": error, "trials": details, "n_trials": len(trials),
                                 "seconds": round(time.monotonic() - t_start, 3)})

    with tempfile.TemporaryDirectory() as root:
        cur = {}  # the trial running now: batch, model, start time

        def begin(batch_size):
            cur.clear()  # frees the last trial's model before this one's is built
            model = Mlp(batch_size)
            cur.update(batch=batch_size, model=model, t0=time.monotonic())
            return cur

        def fit_steps(batch_size):
            trainer(args.steps, root).fit(cur["model"])
            return batch_size

        def failed(token, e):
            trials.append({"batch": token["batch"], "fits": False})
            details.append({"batch": token["batch"], "outcome": classify(e, is_oom_error),
                            "seconds": round(time.monotonic() - token["t0"], 3), "message": first_line(e)})
            flush(None)

        def fitted(token):
            trials.append({"batch": token["batch"], "fits": True})
            details.append({"batch": token["batch"], "outcome": "fits",
                            "seconds": round(time.monotonic() - token["t0"], 3),
                            "steps_run": token["model"].steps_run})
            flush(None)

        train = find_executable_batch_size(each_trial(fit_steps, begin, fitted, failed),
                                           starting_batch_size=args.starting_batch_size)

        try:
            answer = train()
        except BaseException as e:  # noqa: BLE001
            flush(None, error=f"{type(e).__name__}: {first_line(e)}")
            print(f"accelerate failed: {type(e).__name__}: {first_line(e)}", file=sys.stderr)
            return 1
    flush(int(answer), done=True)
    print(json.dumps({"answer": int(answer), "trials": trials, "seconds": round(time.monotonic() - t_start, 3)}))
    return 0


def main():
    args = parse_args()
    setup_process(args)
    if args.mode == "fit":
        if not args.batch:
            sys.exit("fit needs --batch")
        return mode_fit(args)
    if args.mode == "finder":
        return mode_finder(args)
    return mode_accelerate(args)


if __name__ == "__main__":
    sys.exit(main())
