"""batchfit_trial: the optional helper for training scripts probed by ``batchfit probe --exec``.

``batchfit probe --exec -- CMD ARG...`` finds the largest micro-batch your own training command can run
by running it again and again, each time fresh, at chosen batch sizes, under a memory limit. This file
lets that command (1) read the batch size, step count and accumulation batchfit asks for and (2) tell
batchfit what it really trained, so a trial that exits 0 can be checked (the batch it was given, the
number of optimizer steps, the time per step, the CUDA allocator's peaks).

Get it with ``batchfit python-helper > batchfit_trial.py`` and put it next to your script, or install
batchfit with pip (``pip install batchfit``): then the same file is the ``batchfit`` package's
(``import batchfit``; ``batchfit.Trial``, ``batchfit.report``, ... are the names below). It needs only
the Python standard library; torch, Lightning and transformers are used when the script already uses
them and are never imported by this file on its own.

The script stays the one you run without batchfit: with no ``BATCHFIT_*`` variables in the
environment every function returns its default and ``report()`` writes nothing.

Environment contract (set by batchfit for each trial):

    BATCHFIT_BATCH         micro-batch size to train (per rank)             -> batch_size()
    BATCHFIT_STEPS         optimizer steps to run                           -> steps()
    BATCHFIT_ACCUMULATION  micro-batches per optimizer step                 -> accumulation()
    BATCHFIT_TRIAL         index of the trial (0, 1, ...)                   -> trial_index()
    BATCHFIT_RESULT        file the report goes to (rank 0; rank r > 0 writes BATCHFIT_RESULT.rank<r>)
    RANK, WORLD_SIZE       set by torchrun; 0 and 1 without it

The same values are also substituted into the command's arguments wherever they contain ``{batch}``,
``{steps}`` or ``{accumulation}``, so a script with its own ``--batch-size`` flag needs no helper at all.

The report (JSON, written atomically: a temporary file in the same directory, then ``os.replace``)::

    {"schema": "batchfit-trial-report/1",
     "batch": 64, "steps": 3, "accumulation": 1, "reads_accumulation": true,
     "reads_batch": true,     # batch_size() read BATCHFIT_BATCH and the report says that size
     "step_seconds": [0.41, 0.12, 0.12], "rank": 0, "world_size": 1,
     "cuda": null,            # or {"device": "cuda:0", "peak_allocated_bytes": ..., "peak_reserved_bytes": ...,
                              #     "reserved_bytes": ..., "alloc_retries": ..., "ooms": ...}
     "python": "3.11.7", "torch": "2.11.0+cu130"}  # torch: its __version__ when the script imported it, else null

plus ``"read_files": [...]`` (absolute paths, at most 500 in all, of which at most 200 opened: the files of the modules the job imported from
outside the standard library and site-packages/dist-packages, then the files it opened for reading after
this module was imported, in the working directory or anywhere else but the Python installation's
folders and /proc, /sys, /dev; batchfit hashes them (from 64 MiB up, keeps their stat), so a cached
plan is not used once one of them changed), ``"python_environment": {"site_dirs": [...], "distributions": [...], "files": [{"path", "size",
"mtime_ns"}, ...]}`` (the installed packages: a cached plan is not used once one was edited, upgraded,
installed or removed; null when it cannot be found), ``"samples": N`` (the largest micro-batch counted with ``step(samples=len(x))``) only when counted, and
``"extra": {...}`` only when ``report(**extra)`` was given extra keywords, and ``"modules": [...]`` (the
installed modules the job imported, packages and their submodules in import order, e.g. ``["numpy",
"torch", "torch.nn", "torch._dynamo"]``: what batchfit's warm trial processes import ahead of the next
trial, the ones a job imports lazily in its first step included). A block or script that ends with an exception writes no
report (the exit status says what happened).

Inside ``Trial`` and the framework callbacks the report is written the moment the last optimizer step
batchfit asked for (``BATCHFIT_STEPS``) ends, and again at the end: batchfit ends a trial about a second
after a complete report, so checkpoint saving, logger flushing and interpreter exit are not waited for.

A plain PyTorch loop::

    import batchfit_trial as bt
    batch, steps, accum = bt.batch_size(default=64), bt.steps(default=1000), bt.accumulation(default=1)
    with bt.Trial(batch=batch, accumulation=accum) as t:
        for step in range(steps):
            for micro in range(accum):
                x, y = next(data)                      # `batch` samples
                (loss_fn(model(x), y) / accum).backward()
            opt.step(); opt.zero_grad()
            t.step()                                   # one optimizer step done (times it)
    # leaving the block without an exception writes the report (only under batchfit)

Lightning (``BatchfitCallback`` exists only when ``lightning`` or ``pytorch_lightning`` is installed)::

    from batchfit_trial import BatchfitCallback, batch_size, steps, accumulation
    loader = DataLoader(ds, batch_size=batch_size(default=64))
    trainer = L.Trainer(max_steps=steps(default=1000), accumulate_grad_batches=accumulation(default=1),
                        callbacks=[BatchfitCallback()])

Hugging Face Trainer (``BatchfitTrainerCallback`` exists only when ``transformers`` is installed)::

    from batchfit_trial import BatchfitTrainerCallback, batch_size, steps, accumulation
    args = TrainingArguments(..., per_device_train_batch_size=batch_size(default=8),
                             max_steps=steps(default=1000), gradient_accumulation_steps=accumulation(default=1))
    Trainer(model=model, args=args, ..., callbacks=[BatchfitTrainerCallback()]).train()
"""

import json
import math
import os
import platform
import sys
import sysconfig
import tempfile
import time

__all__ = [
    "SCHEMA",
    "BatchfitError",
    "batch_size",
    "steps",
    "accumulation",
    "trial_index",
    "in_trial",
    "start",
    "step",
    "report",
    "Trial",
    "BatchfitCallback",
    "BatchfitTrainerCallback",
]

#: The ``schema`` field of every report; batchfit refuses reports with another one.
SCHEMA = "batchfit-trial-report/1"

ENV_BATCH = "BATCHFIT_BATCH"
ENV_STEPS = "BATCHFIT_STEPS"
ENV_ACCUMULATION = "BATCHFIT_ACCUMULATION"
ENV_TRIAL = "BATCHFIT_TRIAL"
ENV_RESULT = "BATCHFIT_RESULT"


class BatchfitError(ValueError):
    """A value the script asked for is missing or malformed (the message says which and what to do)."""


# What the script asked for and did, for the report's defaults. Module-level, like the environment it
# mirrors: one training run per process.
_state = {
    "batch": None,  # what batch_size() last returned
    "steps": None,  # what steps() last returned
    "accumulation": None,  # what accumulation() last returned
    "reads_accumulation": False,  # accumulation() was called
    "reads_batch": False,  # batch_size() returned BATCHFIT_BATCH
    "samples": None,  # the largest micro-batch counted with step(samples=...), if any
    "job_steps": None,  # steps()'s default: the optimizer steps the job runs without batchfit
    "step_seconds": [],  # wall seconds of each optimizer step marked with step()
    "last_mark": time.perf_counter(),  # at import, start() or the last step(): where the next step began
    "reporter": None,  # writes the report when the last step asked for ends (Trial, the callbacks)
}


#: At most this many paths in a report's ``read_files`` (and this many opened files recorded).
READ_FILES_MAX = 500
_OPENED_MAX = 200
_opened = []  # files the job opened for reading (audit hook), in order, outside the installation
#: Folders whose files are the installation's, not the job's: the interpreter's prefixes, standard
#: library and site dirs, and the kernel's pseudo-files (set when the hook is installed).
_not_the_jobs = ()
_PSEUDO_DIRS = ("/proc", "/sys", "/dev")


#: The process that installed the hook first for this trial (kept in the environment, so that
#: DataLoader workers and other processes of the job, forked or spawned, know they are not it).
_ENV_READS_OWNER = "BATCHFIT_READS_OWNER"
_in_hook = [False]
#: Set by batchfit's start-up hook (its sitecustomize imports this file as ``_batchfit_reads`` in
#: every process of a trial, before the job's code): every read is added to the shared list, the
#: reporting process's too, so that files read before the job imports the helper are in the report.
_SHARE_ALL = [False]


def _reads_path():
    """Where the job's other processes append the files they read: beside the report."""
    return os.environ.get(ENV_RESULT, "") + ".reads"


def _share_read(path):
    """In a process of the job other than the one that reports (a DataLoader worker), append `path`
    to the shared list, one line, so that the report names what the workers read too. Never raises."""
    if _in_hook[0]:
        return
    _in_hook[0] = True
    try:
        fd = os.open(_reads_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, (path + "\n").encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)
    except Exception:
        pass
    finally:
        _in_hook[0] = False


def _shared_reads():
    """The files the job's other processes read (their appended lines). Never raises."""
    _in_hook[0] = True  # batchfit's own file, not one the job reads
    try:
        with open(_reads_path(), encoding="utf-8", errors="surrogateescape") as f:
            return [line.rstrip("\n") for line in f if line.strip()]
    except Exception:
        return []
    finally:
        _in_hook[0] = False


#: The audit events of listing a folder (os.walk, glob.glob and pathlib list through these).
_LIST_EVENTS = ("os.listdir", "os.scandir")


def _record_listing(args):
    """Remember a folder the job's own code listed (the shards of a dataset found by glob): a file
    added there changes what the job reads. The import system's listings of sys.path are not the
    job's. Never raises."""
    try:
        caller = sys._getframe(2).f_code.co_filename
        if caller.startswith("<frozen importlib"):
            return
        path = args[0] if args else None
        if isinstance(path, int):
            return
        _remember(os.path.abspath(os.fsdecode(path if path is not None else ".")))
    except Exception:
        pass


def _remember(path):
    """Record `path` (absolute) as read by the job, unless it is the installation's or already
    recorded; a process of the job other than the reporting one shares it."""
    if path in _opened or (path + os.sep).startswith(_not_the_jobs) or _in_site_packages(path):
        return
    _opened.append(path)
    if _SHARE_ALL[0] or os.environ.get(_ENV_READS_OWNER) != str(os.getpid()):
        _share_read(path)


def _record_open(event, args):
    """Audit hook: remember a file the job opened for reading (in the working directory or anywhere
    else, not the installation's own files), in a DataLoader worker or other process of the job too.
    Never raises."""
    if len(_opened) >= _OPENED_MAX or _in_hook[0]:
        return
    if event in _LIST_EVENTS:
        _record_listing(args)
        return
    if event != "open":
        return
    try:
        path, mode, flags = args
        if isinstance(path, int):
            return
        if mode is not None:
            if any(c in str(mode) for c in "wax+"):
                return
        elif flags is not None and (flags & os.O_ACCMODE) != os.O_RDONLY:
            return
        _remember(os.path.abspath(os.fsdecode(path)))
    except Exception:
        pass


def _install_open_hook():
    """Record the files the job reads (only under batchfit; an audit hook cannot be removed)."""
    global _not_the_jobs
    if not os.environ.get(ENV_RESULT):
        return
    try:
        dirs = _library_dirs() | set(_site_dirs())
        dirs |= {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
        dirs |= {os.path.realpath(d) for d in dirs}
        _not_the_jobs = tuple(sorted(d.rstrip(os.sep) + os.sep for d in dirs if d and d != os.sep))
        _not_the_jobs += tuple(d + os.sep for d in _PSEUDO_DIRS)
        os.environ.setdefault(_ENV_READS_OWNER, str(os.getpid()))
        sys.addaudithook(_record_open)
    except Exception:
        pass


def _in_site_packages(path):
    parts = path.split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts


def _site_dirs():
    """The interpreter's folders of installed packages: its site dirs and the ``site-packages`` /
    ``dist-packages`` folders on ``sys.path``. Never raises."""
    out = []
    try:
        import site

        cands = list(getattr(site, "getsitepackages", lambda: [])())
        cands.append(getattr(site, "getusersitepackages", lambda: "")())
    except Exception:
        cands = []
    cands += [p for p in sys.path if isinstance(p, str) and os.path.basename(p.rstrip(os.sep)) in
              ("site-packages", "dist-packages")]
    for d in cands:
        if d and os.path.isdir(d) and os.path.abspath(d) not in out:
            out.append(os.path.abspath(d))
    return out


def _library_dirs():
    dirs = set()
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            d = sysconfig.get_paths().get(name)
        except Exception:
            d = None
        if d:
            dirs.add(os.path.realpath(d))
    return dirs


def _is_library(path, dirs):
    if _in_site_packages(path):
        return True
    real = os.path.realpath(path)
    return any(real == d or real.startswith(d + os.sep) for d in dirs)


_install_open_hook()


def _read_files():
    """The job's own module files (not the standard library's nor installed packages'), then the files
    under the working directory it opened for reading; absolute, at most READ_FILES_MAX. Never raises."""
    out = []
    try:
        dirs = _library_dirs()
        here = os.path.abspath(__file__)
        for module in list(sys.modules.values()):
            f = getattr(module, "__file__", None)
            if not isinstance(f, str) or not f:
                continue
            f = os.path.abspath(f)
            if f != here and f not in out and os.path.isfile(f) and not _is_library(f, dirs):
                out.append(f)
        for f in list(_opened) + _shared_reads():
            if f not in out and (os.path.isfile(f) or os.path.isdir(f)) and not _is_library(f, dirs):
                out.append(f)
    except Exception:
        pass
    return sorted(out[:READ_FILES_MAX])


#: The suffixes of the folders that name an installed distribution (name and version) in a site dir.
_DISTRIBUTION_SUFFIXES = (".dist-info", ".egg-info")


def _python_environment():
    """What the job's installed packages are: the interpreter's site dirs, the distributions in them
    (``torch-2.11.0.dist-info``, ...) and, for every module the job imported from a site-packages or
    dist-packages folder, its file's size and modification time (a stat, no hash: ``import torch``
    alone imports well over a thousand files). batchfit refuses a cached plan once any of it changed
    (a package edited in place, upgraded, installed or removed). ``None`` when it cannot be found.
    Never raises."""
    try:
        site_dirs = _site_dirs()
        dists = []
        for d in site_dirs:
            with os.scandir(d) as it:
                dists += [os.path.join(d, e.name) for e in it if e.name.endswith(_DISTRIBUTION_SUFFIXES)]
        files = {}
        for module in list(sys.modules.values()):
            f = getattr(module, "__file__", None)
            if not isinstance(f, str) or not f:
                continue
            f = os.path.abspath(f)
            if f in files or not _in_site_packages(f):
                continue
            try:
                st = os.stat(f)
            except OSError:
                continue
            files[f] = {"path": f, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        return {"site_dirs": site_dirs, "distributions": sorted(dists),
                "files": [files[k] for k in sorted(files)]}
    except Exception:
        return None


#: At most this many names in a report's ``modules``.
MODULES_MAX = 20000


def _third_party_modules():
    """The installed modules the job imported (from site-packages/dist-packages: torch, torch.nn,
    torch._dynamo, numpy, lightning, ...), packages and submodules in import order, at most
    MODULES_MAX: what a warm trial process imports before the next trial is handed to it (a module
    the job imports lazily, such as the optimizer's first step importing ``torch._dynamo``, costs a
    second in every trial otherwise). Never raises."""
    out = []
    try:
        here = os.path.abspath(__file__)
        for name, module in list(sys.modules.items()):
            if name.startswith("_") or name.split(".")[0] in ("batchfit", "batchfit_trial", "__main__"):
                continue
            f = getattr(module, "__file__", None)
            if not isinstance(f, str) or os.path.abspath(f) == here:
                continue
            parts = os.path.abspath(f).split(os.sep)
            if "site-packages" in parts or "dist-packages" in parts:
                out.append(name)
    except Exception:
        pass
    return out[:MODULES_MAX]


def _reset_for_tests():
    """Forget everything recorded (the unit tests run many "scripts" in one process)."""
    _state.update(batch=None, steps=None, accumulation=None, reads_accumulation=False, reads_batch=False,
                  samples=None, job_steps=None)
    _state["last_mark"] = time.perf_counter()
    _state["step_seconds"] = []
    _state["reporter"] = None


def _env_int(name, minimum):
    """The integer in environment variable ``name``, or None when it is unset or empty."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise BatchfitError(f"batchfit_trial: {name}={raw!r} is not an integer") from None
    if value < minimum:
        raise BatchfitError(f"batchfit_trial: {name}={value} is below {minimum}")
    return value


def _value(name, default, what, minimum=1):
    value = _env_int(name, minimum)
    if value is not None:
        return value
    if default is None:
        raise BatchfitError(
            f"batchfit_trial: {name} is not set and no default was given; "
            f"call {what}(default=...) so the script also runs without batchfit"
        )
    if isinstance(default, bool) or not isinstance(default, int) or default < minimum:
        raise BatchfitError(f"batchfit_trial: {what}(default={default!r}) must be an integer >= {minimum}")
    return default


def batch_size(default=None):
    """The micro-batch size to train per rank: ``BATCHFIT_BATCH``, else ``default``, else an error."""
    _state["batch"] = _value(ENV_BATCH, default, "batch_size")
    _state["reads_batch"] = _env_int(ENV_BATCH, 1) is not None
    return _state["batch"]


def steps(default=None):
    """The number of optimizer steps to run: ``BATCHFIT_STEPS``, else ``default``, else an error.

    Under batchfit the report also carries ``default`` as ``job_steps`` (the steps the job runs
    without batchfit), so the plan can say when the fit was proven with fewer."""
    _state["steps"] = _value(ENV_STEPS, default, "steps")
    if not isinstance(default, bool) and isinstance(default, int) and default >= 1:
        _state["job_steps"] = default
    return _state["steps"]


def accumulation(default=1):
    """Micro-batches per optimizer step: ``BATCHFIT_ACCUMULATION``, else ``default``.

    Calling it tells batchfit that the script honours accumulation (``reads_accumulation`` in the report).
    """
    _state["accumulation"] = _value(ENV_ACCUMULATION, default, "accumulation")
    _state["reads_accumulation"] = True
    return _state["accumulation"]


def trial_index():
    """The index of this trial (``BATCHFIT_TRIAL``), or None outside batchfit."""
    return _env_int(ENV_TRIAL, 0)


def in_trial():
    """Whether this process was started by batchfit as a trial (``BATCHFIT_TRIAL`` or ``BATCHFIT_RESULT`` set)."""
    return bool(os.environ.get(ENV_TRIAL) or os.environ.get(ENV_RESULT))


def _torch_if_imported():
    """The torch module if the script has imported it; this file never imports torch itself."""
    return sys.modules.get("torch")


def _cuda_initialized(torch):
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # a torch build without CUDA support, or a half-imported torch
        return False


def start():
    """Start (or restart) the clock for the first optimizer step; ``Trial`` calls it on entry."""
    _state["last_mark"] = time.perf_counter()


def step(samples=None):
    """Mark the end of one optimizer step: record its wall time (since the last step, ``start()``, or
    this module's import when neither came before).

    ``samples``: how many samples the step's micro-batch really held (``len(x)``); the report says the
    largest, so batchfit sees a job that was asked for 64 but got 50 (a dataset shorter than the
    batch, a ``drop_last=False`` tail) did not train 64.

    On CUDA (when the script has initialized it) the device is synchronized first, so the time covers
    the step's kernels rather than their launch.
    """
    torch = _torch_if_imported()
    if _cuda_initialized(torch):
        torch.cuda.synchronize()
    if samples is not None:
        _state["samples"] = max(_positive_int("samples", samples, minimum=0), _state["samples"] or 0)
    now = time.perf_counter()
    _state["step_seconds"].append(now - _state["last_mark"])
    _state["last_mark"] = now
    _report_when_done()


def _report_when_done():
    """Write the report the moment the last optimizer step batchfit asked for ends (through ``Trial``
    or a framework callback, which know what to report): batchfit ends the trial shortly after a
    complete report, so the job's teardown (checkpoints, logger flush, interpreter exit) does not
    count against the probe. The end of the block or of training writes it again, unchanged in
    meaning; a report that cannot be built yet is left to that end, which says why."""
    reporter = _state["reporter"]
    try:
        asked = _env_int(ENV_STEPS, 1)
        if reporter is not None and asked is not None and len(_state["step_seconds"]) == asked:
            reporter()
    except BatchfitError:
        pass


def _cuda_report(torch):
    """The current CUDA device's allocator statistics, or None when CUDA was not initialized."""
    if not _cuda_initialized(torch):
        return None
    index = torch.cuda.current_device()
    stats = torch.cuda.memory_stats(index)
    return {
        "device": f"cuda:{index}",
        "peak_allocated_bytes": int(stats.get("allocated_bytes.all.peak", 0)),
        "peak_reserved_bytes": int(stats.get("reserved_bytes.all.peak", 0)),
        "reserved_bytes": int(stats.get("reserved_bytes.all.current", 0)),
        "alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "ooms": int(stats.get("num_ooms", 0)),
    }


def _positive_int(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BatchfitError(f"batchfit_trial.report(): {name}={value!r} must be an integer >= {minimum}")
    return value


def _build_report(batch, steps_done, accum, step_seconds, rank, world_size, extra):
    if batch is None:
        batch = _state["batch"]
    if batch is None:
        raise BatchfitError(
            "batchfit_trial.report(): the batch size trained is unknown; pass batch=... "
            "or read it with batch_size()"
        )
    if step_seconds is None:
        step_seconds = list(_state["step_seconds"])
    step_seconds = [float(s) for s in step_seconds]
    if not all(math.isfinite(s) for s in step_seconds):
        raise BatchfitError(f"batchfit_trial.report(): step_seconds {step_seconds!r} holds NaN or infinity")
    if steps_done is None:
        # Steps marked with step() are the evidence; without them, a script that reaches report()
        # ran the steps it read with steps().
        steps_done = len(step_seconds) if step_seconds else _state["steps"]
    if steps_done is None:
        raise BatchfitError(
            "batchfit_trial.report(): the number of optimizer steps is unknown; pass steps=..., "
            "mark each step with step() / Trial.step(), or read it with steps()"
        )
    if accum is None:
        accum = _state["accumulation"] if _state["accumulation"] is not None else 1
    if rank is None:
        rank = _env_int("RANK", 0) or 0
    if world_size is None:
        world_size = _env_int("WORLD_SIZE", 1) or 1
    torch = _torch_if_imported()
    report_obj = {
        "schema": SCHEMA,
        "batch": _positive_int("batch", batch),
        "steps": _positive_int("steps", steps_done, minimum=0),
        "accumulation": _positive_int("accumulation", accum),
        "reads_accumulation": bool(_state["reads_accumulation"]),
        "reads_batch": bool(_state["reads_batch"]) and batch == _state["batch"],
        "step_seconds": step_seconds,
        "rank": _positive_int("rank", rank, minimum=0),
        "world_size": _positive_int("world_size", world_size),
        "cuda": _cuda_report(torch),
        "python": platform.python_version(),
        "torch": str(getattr(torch, "__version__", None)) if torch is not None else None,
    }
    report_obj["read_files"] = _read_files()
    report_obj["modules"] = _third_party_modules()
    report_obj["python_environment"] = _python_environment()
    if _state["samples"] is not None:
        report_obj["samples"] = _state["samples"]
    if _state["job_steps"] is not None:
        report_obj["job_steps"] = _state["job_steps"]
    if extra:
        report_obj["extra"] = extra
    return report_obj


def _result_path(rank):
    path = os.environ.get(ENV_RESULT)
    if not path:
        return None
    return path if rank == 0 else f"{path}.rank{rank}"


def _write_atomically(path, text):
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def report(batch=None, steps=None, accumulation=None, step_seconds=None, *, rank=None, world_size=None, **extra):
    """Write the trial report to ``$BATCHFIT_RESULT`` (``.rank<r>`` for rank r > 0); the path, or None.

    Outside batchfit (``BATCHFIT_RESULT`` unset) it does nothing and returns None. Defaults: ``batch``
    is what ``batch_size()`` returned; ``steps`` the number of ``step()`` marks, else what ``steps()``
    returned; ``accumulation`` what ``accumulation()`` returned, else 1; ``step_seconds`` the times of
    the ``step()`` marks; ``rank``/``world_size`` from ``RANK``/``WORLD_SIZE``. Extra keywords (JSON
    values) go to the report's ``extra`` object. A missing value it cannot default raises
    ``BatchfitError`` (only under batchfit: the script's own runs are never affected).
    """
    if not os.environ.get(ENV_RESULT):
        return None
    obj = _build_report(batch, steps, accumulation, step_seconds, rank, world_size, extra)
    path = _result_path(obj["rank"])
    _write_atomically(path, json.dumps(obj, indent=1, allow_nan=False) + "\n")
    return path


class Trial:
    """``with Trial(batch=..., accumulation=...) as t:`` around the training loop, ``t.step()`` after
    each optimizer step; a block that ends without an exception writes the report (under batchfit).

    ``batch`` and ``accumulation`` default as in ``report()``. ``t.extra`` (a dict) goes to the
    report's ``extra``. An exception leaves no report and is not swallowed; ``sys.exit(0)`` inside the
    block counts as a normal end.
    """

    def __init__(self, batch=None, accumulation=None, steps=None):
        self.batch = batch
        self.accumulation = accumulation
        self.steps = steps  # optimizer steps done; None: the number of t.step() calls
        self.extra = {}

    def __enter__(self):
        _state["step_seconds"] = []
        _state["reporter"] = self.report
        start()
        return self

    def step(self, samples=None):
        """One optimizer step is done (``samples``: what its micro-batch held, see ``step()``)."""
        step(samples)

    @property
    def step_seconds(self):
        return list(_state["step_seconds"])

    def report(self, **extra):
        """Write the report now (the end of the block writes it again, with the final counts)."""
        self.extra.update(extra)
        return report(batch=self.batch, steps=self.steps, accumulation=self.accumulation, **self.extra)

    def __exit__(self, exc_type, exc, tb):
        clean_exit = exc_type is None or (issubclass(exc_type, SystemExit) and exc.code in (None, 0))
        if clean_exit:
            self.report()
        return False  # never swallow an exception


def _first_dim(batch):
    """The leading dimension of the first tensor in a batch (tensor, tuple/list, dict), or None."""
    if hasattr(batch, "shape") and len(getattr(batch, "shape", ())) > 0:
        return int(batch.shape[0])
    if isinstance(batch, (list, tuple)) and batch:
        return _first_dim(batch[0])
    if isinstance(batch, dict) and batch:
        return _first_dim(next(iter(batch.values())))
    return None


def _make_lightning_callback():
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:
        try:
            from pytorch_lightning.callbacks import Callback
        except ImportError:
            raise ImportError(
                "batchfit_trial.BatchfitCallback needs Lightning (the lightning or pytorch_lightning package)"
            ) from None

    class BatchfitCallback(Callback):
        """Lightning callback: times each optimizer step and reports at the end of training.

        The micro-batch reported is the largest leading dimension seen in a training batch (what the
        model really got), else ``batch_size()``'s value; the accumulation is the trainer's
        ``accumulate_grad_batches``; rank and world size are the trainer's.
        """

        def __init__(self):
            super().__init__()
            self._last_global_step = 0
            self._seen_batch = None

        def on_train_start(self, trainer, pl_module):
            _state["step_seconds"] = []
            _state["reporter"] = lambda: self.on_train_end(trainer, pl_module)
            self._last_global_step = trainer.global_step
            start()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            n = _first_dim(batch)
            if n is not None:
                self._seen_batch = max(n, self._seen_batch or 0)
            # global_step counts optimizer steps: it moves only on the last micro-batch of an accumulation
            if trainer.global_step > self._last_global_step:
                self._last_global_step = trainer.global_step
                step()

        def on_train_end(self, trainer, pl_module):
            report(
                batch=self._seen_batch,
                steps=len(_state["step_seconds"]),
                accumulation=int(trainer.accumulate_grad_batches),
                rank=int(trainer.global_rank),
                world_size=int(trainer.world_size),
            )

    return BatchfitCallback


def _make_trainer_callback():
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise ImportError("batchfit_trial.BatchfitTrainerCallback needs the transformers package") from None

    class BatchfitTrainerCallback(TrainerCallback):
        """Hugging Face Trainer callback: times each optimizer step and reports at the end of training.

        Batch, accumulation, rank and world size are the TrainingArguments' (per device batch size,
        gradient_accumulation_steps, process_index, world_size).
        """

        def on_train_begin(self, args, state, control, **kwargs):
            _state["step_seconds"] = []
            _state["reporter"] = lambda: self.on_train_end(args, state, control)
            start()

        def on_step_end(self, args, state, control, **kwargs):
            step()  # the Trainer calls on_step_end once per optimizer step (after accumulation)

        def on_train_end(self, args, state, control, **kwargs):
            report(
                batch=int(args.per_device_train_batch_size),
                steps=len(_state["step_seconds"]),
                accumulation=int(args.gradient_accumulation_steps),
                rank=int(args.process_index),
                world_size=int(args.world_size),
            )

    return BatchfitTrainerCallback


_LAZY = {"BatchfitCallback": _make_lightning_callback, "BatchfitTrainerCallback": _make_trainer_callback}


def __getattr__(name):
    """Build the framework callbacks on first use, so this file imports with the standard library alone."""
    if name in _LAZY:
        cls = _LAZY[name]()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    print(__doc__)
