"""Driving the peers' batch-size finders while recording every trial: Lightning's
``Tuner.scale_batch_size`` and Accelerate's ``find_executable_batch_size``.

Both harnesses run these in a Python child (``benches/side_by_side/lightning_probe.py``,
``scripts/gpu_check/peers.py``) on their own models, and both need the same plumbing: importing Lightning
(either package name) and its out-of-memory test, a Trainer that does nothing but the training steps, and
a wrapper around each trial that records it as it starts and ends -- for Lightning around its own trial
runner ``batch_size_scaling._try_loop_run``, for Accelerate around the function it decorates -- and lets
the finder see the failure as it would have (or a translation of it).

Nothing here is imported at module level beyond the standard library: Lightning and Accelerate are
imported by the functions, in the child that runs them.
"""
import functools


def first_line(exc):
    """The first line of an exception's message (its type name when empty), at most 300 characters."""
    s = str(exc).strip().splitlines()
    return (s[0] if s else type(exc).__name__)[:300]


def import_lightning():
    """(lightning.pytorch as pl, Tuner, its batch_size_scaling module, package name); falls back to the
    older ``pytorch_lightning`` package. Raises the first ImportError when neither imports."""
    try:
        import lightning.pytorch as pl
        from lightning.pytorch.tuner import Tuner
        import lightning.pytorch.tuner.batch_size_scaling as bss
        return pl, Tuner, bss, "lightning"
    except ImportError as e1:
        try:
            import pytorch_lightning as pl
            from pytorch_lightning.tuner import Tuner
            import pytorch_lightning.tuner.batch_size_scaling as bss
            return pl, Tuner, bss, "pytorch_lightning"
        except ImportError:
            raise e1


def lightning_is_oom_error():
    """Lightning's own test for an out-of-memory exception (the one its finder uses), or a stand-in that
    looks for the messages of CUDA's and libtorch's CPU allocators."""
    try:
        from lightning.pytorch.utilities.memory import is_oom_error
    except ImportError:
        try:
            from pytorch_lightning.utilities.memory import is_oom_error
        except ImportError:
            def is_oom_error(e):
                return "out of memory" in str(e) or "can't allocate memory" in str(e)
    return is_oom_error


def import_accelerate():
    """(find_executable_batch_size, should_reduce_batch_size: Accelerate's own test for an out-of-memory
    exception, or the same stand-in as lightning_is_oom_error's where this Accelerate lacks it). Raises
    when Accelerate does not import."""
    from accelerate.utils import find_executable_batch_size
    try:
        from accelerate.utils.memory import should_reduce_batch_size
    except ImportError:
        def should_reduce_batch_size(e):
            return "out of memory" in str(e) or "can't allocate memory" in str(e)
    return find_executable_batch_size, should_reduce_batch_size


def lightning_trainer(pl, max_steps, root, accelerator="cpu", **extra):
    """A Trainer for one device that only trains: no logger, checkpoints, progress bar, model summary or
    validation; its files under root. `extra`: more Trainer arguments (precision)."""
    return pl.Trainer(accelerator=accelerator, devices=1, max_steps=max_steps, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0, num_sanity_val_steps=0, default_root_dir=root, **extra)


def each_trial(run, begin, fitted, failed):
    """Wraps run (a trial: Lightning's ``_try_loop_run``, or the function Accelerate decorates) so that
    every call is recorded: token = begin(*args) before it; fitted(token) after it returns (its result is
    passed on); failed(token, exc) when it raises, which returns the exception the finder should see
    (exc itself, or None, to re-raise it unchanged; another one to raise that instead, outside the except
    block, so the original exception's frames, and the tensors they hold, are freed first)."""
    @functools.wraps(run)
    def trial(*args, **kwargs):
        token = begin(*args, **kwargs)
        try:
            result = run(*args, **kwargs)
        except BaseException as e:
            failure = failed(token, e)
            if failure is None or failure is e:
                # no local may hold the exception as it leaves: its traceback holds this frame, and a
                # frame that holds its own exception is a reference cycle, which keeps the failed trial's
                # frames (its model, batch and optimizer state) alive until the garbage collector next
                # runs -- after Accelerate's gc.collect(), which it calls while the exception is still
                # bound, so into the next, smaller trial
                del failure
                raise
        else:
            fitted(token)
            return result
        try:
            raise failure
        finally:
            del failure  # (the same cycle)

    return trial
