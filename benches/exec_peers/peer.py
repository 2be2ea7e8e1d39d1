#!/usr/bin/env python3
"""The peers of benches/exec_peers/: Lightning's and Accelerate's batch-size finders run *inside* a user's
training script, in one process, as their users run them.

    peer.py lightning  --script S --record R.json [--init-val 2 --max-val 1048576 --max-trials 25
                       --steps-per-trial 3] -- SCRIPT ARGS...
    peer.py accelerate --script S --record R.json [--start 4096 --steps 3] -- SCRIPT ARGS...
    peer.py hf         --script S --record R.json [--start 4096 --steps 3] -- SCRIPT ARGS...

S is one of the benchmark's training scripts (tests/support/exec/train_mlp.py, train_lightning.py); it is
imported as a module (its ``main()`` does not run) and its own functions build what it trains, parsed from
its own arguments (``parse_args``): the lines a user adds to call a finder, nothing else.

* lightning (a Lightning script: ``build_model``, ``make_trainer``): ``Tuner(trainer).scale_batch_size(model,
  mode="binsearch", steps_per_trial=3, init_val=2, max_trials=25, max_val=1048576)`` -- Lightning's defaults
  except max_val, raised from 8192. Every trial is recorded by wrapping Lightning's own trial runner
  ``batch_size_scaling._try_loop_run``.
* accelerate: ``accelerate.utils.find_executable_batch_size(starting_batch_size=start)`` around a training
  function of `steps` optimizer steps at the batch size it is given: the script's ``train()`` (a plain
  PyTorch script) or a fresh model and trainer's ``fit`` (a Lightning script). Each call is recorded.
* hf (a Hugging Face Trainer script: ``make_trainer``): the script's Trainer with
  ``TrainingArguments(auto_find_batch_size=True, per_device_train_batch_size=start, max_steps=steps)`` and
  ``trainer.train()``: the Trainer wraps its own inner training loop in Accelerate's finder. Each call of
  that loop (``Trainer._inner_training_loop``) is recorded; the answer is the size it trained at.

No error is translated: an error the finder does not take for an out-of-memory ends its search, as it would
for the user. The record (JSON) is rewritten before and after every trial, so a process the kernel kills (a
cgroup's OOM killer) leaves the trial it died in as ``running``. Exit 0 with an answer, 1 when the search
ended in an error (in the record).
"""
import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))  # harness
from harness.files import save_json  # noqa: E402
from harness.peers import each_trial, first_line, import_accelerate, import_lightning  # noqa: E402
from harness.procs import proc_status  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["lightning", "accelerate", "hf"])
    p.add_argument("--script", required=True)
    p.add_argument("--record", required=True)
    p.add_argument("--init-val", type=int, default=2)
    p.add_argument("--max-val", type=int, default=1 << 20)
    p.add_argument("--max-trials", type=int, default=25)
    p.add_argument("--steps-per-trial", type=int, default=3)
    p.add_argument("--start", type=int, default=4096, help="accelerate, hf: the starting batch size")
    p.add_argument("--steps", type=int, default=3, help="accelerate, hf: optimizer steps per try")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = p.parse_args(argv[:cut])
    a.script_args = argv[cut + 1:]
    return a


class Record:
    def __init__(self, path, base):
        self.path, self.res, self.t0 = path, dict(base, trials=[]), time.monotonic()
        self.flush()

    def flush(self):
        self.res["seconds"] = round(time.monotonic() - self.t0, 3)
        self.res["vm_data_bytes"] = proc_status("VmData")
        save_json(self.path, self.res)

    def update(self, **kw):
        self.res.update(kw)
        self.flush()


def load_script(path):
    spec = importlib.util.spec_from_file_location("user_training_script", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def recorder(rec, batch_of):
    """begin/fitted/failed for harness.peers.each_trial: each trial recorded as it starts and ends."""
    def begin(*a, **kw):
        t = {"batch": int(batch_of(*a, **kw)), "outcome": "running"}
        rec.res["trials"].append(t)
        rec.flush()
        return t, time.monotonic()

    def fitted(token):
        t, t0 = token
        t.update(outcome="fits", seconds=round(time.monotonic() - t0, 3))
        rec.flush()

    def failed(token, e):
        t, t0 = token
        t.update(outcome="failed", error_type=type(e).__name__, message=first_line(e),
                 seconds=round(time.monotonic() - t0, 3))
        rec.flush()
        return e  # unchanged: the finder decides what it is

    return begin, fitted, failed


def mode_lightning(a, rec, mod, args):
    pl, Tuner, bss, pkg = import_lightning()
    from lightning.pytorch.utilities.memory import is_oom_error

    begin, fitted, failed = recorder(rec, lambda tr, params: tr.lightning_module.batch_size)

    def failed_and_judged(token, e):
        token[0]["lightning_is_oom_error"] = isinstance(e, RuntimeError) and bool(is_oom_error(e))
        return failed(token, e)

    bss._try_loop_run = each_trial(bss._try_loop_run, begin, fitted, failed_and_judged)
    call = dict(mode="binsearch", steps_per_trial=a.steps_per_trial, init_val=a.init_val,
                max_trials=a.max_trials, max_val=a.max_val)
    rec.update(call=f"Tuner(trainer).scale_batch_size(model, {', '.join(f'{k}={v!r}' for k, v in call.items())})",
               framework=pkg)
    with tempfile.TemporaryDirectory(prefix="exec-peers-lightning-") as root:
        model = mod.build_model(args, a.init_val)
        trainer = mod.make_trainer(1, 1, default_root_dir=root)
        rec.update(setup_seconds=round(time.monotonic() - rec.t0, 3))
        t0 = time.monotonic()
        try:
            answer = Tuner(trainer).scale_batch_size(model, **call)
        finally:
            rec.update(search_seconds=round(time.monotonic() - t0, 3))
    return answer


def mode_accelerate(a, rec, mod, args):
    find_executable_batch_size, _ = import_accelerate()
    lightning_script = hasattr(mod, "make_trainer")

    def train(batch_size):
        if lightning_script:
            model = mod.build_model(args, batch_size)
            trainer = mod.make_trainer(a.steps, 1)
            trainer.fit(model)
        else:
            mod.train(args, batch_size, a.steps, 1, log=False)
        return int(batch_size)

    begin, fitted, failed = recorder(rec, lambda batch_size: batch_size)
    rec.update(call=f"find_executable_batch_size(starting_batch_size={a.start}) around "
                    + (f"build_model + make_trainer({a.steps}, 1).fit" if lightning_script
                       else f"train(args, batch_size, {a.steps}, 1)"))
    rec.update(setup_seconds=round(time.monotonic() - rec.t0, 3))
    t0 = time.monotonic()
    try:
        return find_executable_batch_size(each_trial(train, begin, fitted, failed), starting_batch_size=a.start)()
    finally:
        rec.update(search_seconds=round(time.monotonic() - t0, 3))


def mode_hf(a, rec, mod, args):
    begin, fitted, failed = recorder(rec, lambda batch_size, *rest, **kw: batch_size)
    rec.update(call=f"Trainer(args=TrainingArguments(auto_find_batch_size=True, per_device_train_batch_size={a.start}, "
                    f"max_steps={a.steps}, ...)).train()")
    with tempfile.TemporaryDirectory(prefix="exec-peers-hf-") as out:
        trainer = mod.make_trainer(args, a.start, a.steps, 1, out, auto_find_batch_size=True)
        # Trainer.train() looks the loop up on the instance, so this wrapper is what its finder calls
        trainer._inner_training_loop = each_trial(trainer._inner_training_loop, begin, fitted, failed)
        rec.update(setup_seconds=round(time.monotonic() - rec.t0, 3))
        t0 = time.monotonic()
        try:
            trainer.train()
        finally:
            rec.update(search_seconds=round(time.monotonic() - t0, 3))
        fits = [t for t in rec.res["trials"] if t.get("outcome") == "fits"]
        return fits[-1]["batch"] if fits else None


def framework_frame(e):
    """The innermost frame of Lightning's or Accelerate's own code in the exception's traceback
    ("file.py:function"), i.e. where in the finder it ended; None when none is there."""
    where = None
    for f in traceback.extract_tb(e.__traceback__):
        if any(f"{os.sep}{pkg}{os.sep}" in f.filename for pkg in ("lightning", "pytorch_lightning", "accelerate", "transformers")):
            where = f"{os.path.basename(f.filename)}:{f.name}"
    return where


def main():
    a = parse_args()
    rec = Record(a.record, {"tool": a.mode, "script": a.script, "script_args": a.script_args, "pid": os.getpid()})
    try:
        mod = load_script(a.script)
        args = mod.parse_args(a.script_args)
        answer = {"lightning": mode_lightning, "accelerate": mode_accelerate, "hf": mode_hf}[a.mode](a, rec, mod, args)
    except BaseException as e:  # noqa: BLE001 - recorded, whatever it is
        running = [t for t in rec.res["trials"] if t.get("outcome") == "running"]
        rec.update(error=f"{type(e).__name__}: {first_line(e)}", traceback=traceback.format_exc()[-3000:],
                   error_where=framework_frame(e), error_in_trial=bool(running),
                   error_is_oom=isinstance(e, MemoryError) or "can't allocate memory" in str(e)
                   or "out of memory" in str(e))
        print(f"peer {a.mode}: {type(e).__name__}: {first_line(e)}", file=sys.stderr, flush=True)
        return 1
    rec.update(answer=int(answer) if answer is not None else None, done=True)
    print(json.dumps({"answer": rec.res["answer"], "trials": len(rec.res["trials"])}), flush=True)
    return 0 if answer is not None else 1


if __name__ == "__main__":
    sys.exit(main())
