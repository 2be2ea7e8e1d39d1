"""Shared code of batchfit's two Python harnesses that measure it against its peers.

* ``benches/side_by_side/`` (``run.sh`` -> ``run.py``, ``lightning_probe.py``): the CPU side-by-side benchmark
  of batchfit against Lightning's ``scale_batch_size`` and Accelerate's ``find_executable_batch_size``, with
  a fresh-process scan for each tool's true maximum; it writes a section of ``docs/benchmarks.md``.
* ``scripts/gpu_check/`` (``scripts/gpu-check.sh`` -> ``check.py``, ``peers.py``): the prepared proof on a
  real GPU (and its ``--cpu-smoke``), which also runs the same two peers and a fine scan for the true maximum.

Both harnesses do the same things around different models and documents: run a command in a fresh process
under a time limit and read its exit status as fits / out of memory / timeout (``procs``), set a child up as a
batchfit trial process (malloc environment, ``RLIMIT_DATA``; ``procs``), find the true maximum by galloping
and bisecting over fresh processes (``scan``), drive Lightning's and Accelerate's finders while recording
every trial (``peers``), write their results as JSON after each stage or item and their Markdown atomically
(``files``), and read and print sizes and durations (``units``); their Python peers train models written
to match batchfit's (``models``) and stamp results with package versions (``pkgversions``). This package is
that code, once; each harness keeps only its stages, its policies and its document.

Where it lives: under ``scripts/`` because ``scripts/gpu-check.sh`` is the harness that is carried to other
machines (a GPU host gets the working tree; nothing under ``benches/`` may be needed there), and
``benches/`` already depends on ``scripts/`` (``run.sh`` calls ``scripts/setup-libtorch.sh``). Each user
adds the one directory ``scripts/`` to ``sys.path`` (one line) and imports ``harness.<module>``.

Python standard library only at import time (``check.py`` and ``run.py`` never import torch), except
``models``, which imports torch and is imported only by the Python children; ``peers`` imports Lightning
and Accelerate inside its functions, in the processes that run them.
"""
