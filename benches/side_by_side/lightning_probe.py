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

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_ARENA_MAX": "2", "PYTHONUNBUFFERED": "1"}
EXIT_OOM = 6
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
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
        env = dict(os.environ, **MALLOC_ENV)
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    if args.limit > 0:
        resource.setrlimit(resource.RLIMIT_DATA, (args.limit, args.limit))


def vm_data():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


def build(args):
    """Imports torch/Lightning and returns (module class, trainer factory, is_oom)."""
    import torch
    from torch import nn
    from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler
    import lightning.pytorch as pl
    from lightning.pytorch.utilities.memory import is_oom_error

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
        def __init__(self, batch_size, input=1024, hidden=(2048, 2048), classes=10, lr=1e-3):
            super().__init__()
            dims = [input, *hidden, classes]
            layers = []
            for i in range(len(dims) - 1):
                layers.append(nn.Linear(dims[i], dims[i + 1]))
                if i + 2 < len(dims):
                    layers.append(nn.ReLU())
            self.net = nn.Sequential(*layers)
            self.batch_size = batch_size
            self.lr = lr
            self.input, self.classes = input, classes
            self.steps_run = 0

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.steps_run += 1
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=self.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

        def train_dataloader(self):
            # longer than max_val so Lightning's "batch size >= dataset length" stop never triggers
            ds = SyntheticBatches(1 << 21, self.input, self.classes)
            sampler = BatchSampler(SequentialSampler(range(len(ds))), batch_size=self.batch_size, drop_last=False)
            return DataLoader(ds, sampler=sampler, batch_size=None, num_workers=0)

    def trainer(max_steps, root):
        return pl.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=max_steps,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
            num_sanity_val_steps=0,
            default_root_dir=root,
        )

    torch.manual_seed(args.seed)
    return Mlp, trainer, is_oom_error


def classify(exc, is_oom_error):
    if isinstance(exc, MemoryError) or is_oom_error(exc):
        return "oom"
    return "error"


def first_line(exc):
    s = str(exc).strip().splitlines()
    return (s[0] if s else type(exc).__name__)[:300]


def write_json(path, obj):
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


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
    report.update(seconds=round(time.monotonic() - t0, 3), vm_data_end=vm_data(),
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
    original = bss._try_loop_run

    def recording_try_loop_run(tr, params):
        model = tr.lightning_module
        b = int(model.batch_size)
        before = model.steps_run
        t0 = time.monotonic()
        try:
            original(tr, params)
        except BaseException as e:
            kind = classify(e, is_oom_error)
            trials.append({"batch": b, "fits": False})
            details.append({"batch": b, "outcome": kind, "seconds": round(time.monotonic() - t0, 3),
                            "steps_run": model.steps_run - before, "message": first_line(e)})
            flush(None)
            raise
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

    bss._try_loop_run = recording_try_loop_run
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
    from accelerate.utils import find_executable_batch_size

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
        @find_executable_batch_size(starting_batch_size=args.starting_batch_size)
        def train(batch_size):
            model = Mlp(batch_size)
            t0 = time.monotonic()
            try:
                trainer(args.steps, root).fit(model)
            except BaseException as e:
                trials.append({"batch": batch_size, "fits": False})
                details.append({"batch": batch_size, "outcome": classify(e, is_oom_error),
                                "seconds": round(time.monotonic() - t0, 3), "message": first_line(e)})
                flush(None)
                raise
            trials.append({"batch": batch_size, "fits": True})
            details.append({"batch": batch_size, "outcome": "fits", "seconds": round(time.monotonic() - t0, 3),
                            "steps_run": model.steps_run})
            flush(None)
            return batch_size

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
