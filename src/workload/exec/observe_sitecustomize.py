# batchfit's start-up hook for a trial of `batchfit probe --exec`. batchfit puts the folder of this
# file first on a trial's PYTHONPATH, so every Python process of the trial imports it at start-up as
# `sitecustomize`. It then
#   * under batchfit (BATCHFIT_RESULT set) imports batchfit's helper, written beside it as
#     `_batchfit_reads`, before the job's code runs: the helper's audit hook records every file the
#     process reads for the plan's cache key, those read before the job imports the helper too (a
#     config opened at the top of the script, data a module opens as it is imported);
#   * watches the DataLoaders only when BATCHFIT_OBSERVED (a folder) is set (`--observe on`, the
#     default), and never imports torch: only when the job itself imports torch's DataLoader does it
#     wrap `_BaseDataLoaderIter.__next__`, which records the largest batch the process's iterators
#     yielded (the first dimension of the first tensor in the batch) in $BATCHFIT_OBSERVED/<pid>.json;
#   * runs the user's own sitecustomize, if one is further on sys.path, exactly once, as Python would.
# A job whose DataLoader yields fewer samples than the size batchfit gave it (a dataset shorter than
# the batch, a clamped batch size) would otherwise "fit" at every size with flat memory. Nothing here
# may ever raise into the job: whatever goes wrong is swallowed (a batch it cannot read counts as
# unknown, and batchfit then judges nothing from the files).
import os
import sys

_TARGET = "torch.utils.data.dataloader"
# how often a process's file is rewritten while it iterates (and always when its largest batch grows,
# and at exit): a write costs a millisecond or two on some file systems, a batch must cost
# microseconds
_WRITE_EVERY = 1024


def _chain_users_sitecustomize():
    """Runs the sitecustomize Python would have run without batchfit's (the next one on sys.path) as
    the module `sitecustomize`, so it runs once and a later `import sitecustomize` gets it."""
    import importlib.machinery  # (importlib.util would import contextlib & co: milliseconds)

    here = os.path.dirname(os.path.abspath(__file__))

    def ours(entry):
        try:
            return os.path.samefile(entry or os.getcwd(), here)
        except (OSError, ValueError, TypeError):
            return False

    path = [p for p in sys.path if isinstance(p, str) and not ours(p)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    # what importlib.util.module_from_spec sets, for a source or compiled file
    module = type(sys)("sitecustomize")
    module.__spec__, module.__loader__ = spec, spec.loader
    module.__file__ = spec.origin
    if spec.cached:
        module.__cached__ = spec.cached
    module.__package__ = ""
    # the import of this file ends by taking sys.modules' entry: the user's module from here on
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


class _State:
    pid = None
    largest = 0
    batches = 0
    unknown = 0
    configured = 0
    written_largest = -1
    exit_hooked = False


def _first_dim(x, depth=0):
    """The first dimension of the first tensor (anything with a non-empty `shape`) in `x`: a tensor,
    a tuple or list, a mapping, a dataclass or plain object; None when there is none."""
    shape = getattr(x, "shape", None)
    if shape is not None and not isinstance(x, type):
        try:
            return int(shape[0]) if len(shape) >= 1 else None
        except (TypeError, ValueError, IndexError):
            return None
    if depth >= 4 or isinstance(x, (str, bytes, bytearray, int, float)):
        return None
    if isinstance(x, dict) or hasattr(x, "keys") and hasattr(x, "values"):
        items = x.values()
    elif isinstance(x, (list, tuple)):
        items = x
    elif hasattr(x, "__dataclass_fields__"):
        items = (getattr(x, name, None) for name in x.__dataclass_fields__)
    elif hasattr(x, "__dict__"):
        items = vars(x).values()
    else:
        return None
    for i, item in enumerate(items):
        if i >= 16:
            break
        n = _first_dim(item, depth + 1)
        if n is not None:
            return n
    return None


def _write():
    folder = os.environ.get("BATCHFIT_OBSERVED")  # read now: a warm process gets its trial's late
    if not folder or _State.pid != os.getpid() or _State.batches == 0:
        return
    import json

    path = os.path.join(folder, "%d.json" % _State.pid)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(
            {
                "largest": _State.largest,
                "batches": _State.batches,
                "unknown": _State.unknown,
                "configured": _State.configured,
            },
            f,
        )
    os.replace(tmp, path)
    _State.written_largest = _State.largest


def _write_at_exit():
    try:
        _write()
    except Exception:
        pass


def _configured(it):
    """The batch size the iterator's DataLoader was built with when it batches samples itself
    (`batch_size=N`, or a batch sampler's); None otherwise (a loader of ready-made batches)."""
    if not getattr(it, "_auto_collation", False):
        return None
    bs = getattr(getattr(it, "_index_sampler", None), "batch_size", None)
    return bs if isinstance(bs, int) and bs > 0 else None


def _seen(batch, configured=None):
    pid = os.getpid()
    if _State.pid != pid:  # a forked child starts its own count
        _State.pid, _State.largest, _State.batches, _State.unknown = pid, 0, 0, 0
        _State.configured, _State.written_largest, _State.exit_hooked = 0, -1, False
    _State.batches += 1
    if configured is not None and configured > _State.configured:
        _State.configured = configured
    try:
        n = _first_dim(batch)
    except Exception:
        n = None
    if n is None:
        _State.unknown += 1
    elif n > _State.largest:
        _State.largest = n
    if not _State.exit_hooked:
        import atexit

        atexit.register(_write_at_exit)
        _State.exit_hooked = True
    if _State.largest > _State.written_largest or _State.batches % _WRITE_EVERY == 0:
        _write()


def _wrap(module):
    cls = getattr(module, "_BaseDataLoaderIter", None)
    real = getattr(cls, "__next__", None)
    if real is None or getattr(real, "_batchfit_watched", False):
        return

    def __next__(self):
        batch = real(self)
        try:
            _seen(batch, _configured(self))
        except Exception:
            pass  # never into the job
        return batch

    __next__.__name__ = real.__name__
    __next__.__qualname__ = getattr(real, "__qualname__", "__next__")
    __next__.__doc__ = real.__doc__
    __next__.__wrapped__ = real
    __next__._batchfit_watched = True
    cls.__next__ = __next__


class _DataLoaderFinder:
    """A meta path finder that lets the other finders find torch's dataloader module, then wraps its
    loader's exec_module so that the module is patched right after it runs. It finds nothing itself
    and is done once it has seen the module."""

    done = False

    def find_spec(self, name, path=None, target=None):
        if name != _TARGET or self.done:
            return None
        # (it stays on sys.meta_path: removing it while the import system iterates the list would
        # skip the finder after it)
        self.done = True
        try:
            import importlib.util

            spec = importlib.util.find_spec(name)
        except Exception:
            return None
        exec_module = getattr(getattr(spec, "loader", None), "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_wrap(module):
            exec_module(module)
            try:
                _wrap(module)
            except Exception:
                pass

        try:
            spec.loader.exec_module = exec_then_wrap
        except Exception:
            pass
        return spec


def _watch():
    if not os.environ.get("BATCHFIT_OBSERVED"):
        return
    loaded = sys.modules.get(_TARGET)
    if loaded is not None:
        _wrap(loaded)
    else:
        sys.meta_path.insert(0, _DataLoaderFinder())


def _record_reads():
    if not os.environ.get("BATCHFIT_RESULT"):
        return
    import _batchfit_reads

    _batchfit_reads._SHARE_ALL[0] = True


try:
    _record_reads()
except Exception:
    pass
try:
    _watch()
except Exception:
    pass
_chain_users_sitecustomize()
