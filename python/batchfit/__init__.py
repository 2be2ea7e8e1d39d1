"""batchfit: finds the largest training micro-batch that really fits, by running real training steps.

The ``batchfit`` command (installed next to this package by ``pip install batchfit``) does the
probing; this package is the trial helper for training scripts probed with ``batchfit probe --exec``::

    import batchfit
    batch, steps = batchfit.batch_size(default=64), batchfit.steps(default=1000)
    with batchfit.Trial(batch=batch) as t:
        for _ in range(steps):
            ...                      # one optimizer step on `batch` samples
            t.step()

Outside a trial every function returns its default and nothing is written. The functions, ``Trial``,
``BatchfitCallback`` (Lightning) and ``BatchfitTrainerCallback`` (Hugging Face Trainer) are those of
``batchfit.batchfit_trial``, the very file ``batchfit python-helper`` prints for scripts that do not
install the package; its docstring is the full reference. Standard library only: torch, Lightning and
transformers are used only when the script imports them. ``python -m batchfit ARGS`` runs the
``batchfit`` command of this installation.
"""

from . import batchfit_trial as _trial
from .batchfit_trial import (
    SCHEMA,
    BatchfitError,
    accumulation,
    batch_size,
    in_trial,
    report,
    start,
    step,
    steps,
    Trial,
    trial_index,
)

# Without the framework callbacks: they are built on first use (their frameworks imported then), so
# `from batchfit import *` works where Lightning or transformers is not installed.
__all__ = [name for name in _trial.__all__ if name not in _trial._LAZY]

batchfit_trial = _trial


def __getattr__(name):
    """Every other name of ``batchfit_trial`` (``BatchfitCallback`` and ``BatchfitTrainerCallback``
    built on first use, ``ENV_BATCH``, ...); ``__version__`` from the installed distribution's metadata."""
    if not name.startswith("__"):
        try:
            value = getattr(_trial, name)  # the callbacks' ImportError when their framework is missing
        except AttributeError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    elif name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("batchfit")
        except PackageNotFoundError:  # imported from a source tree, not installed
            value = None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
