# batchfit's warm trial process (`batchfit probe --exec --warm`): started ahead of its trial under the
# trial's own limit, it imports the packages the job imported (sys.argv[1], a JSON list), then waits
# for its trial on stdin (one JSON line: argv, environment, working directory) and runs the command's
# script or module exactly as `python script.py ARG...` / `python -m module ARG...` would. Standard
# library only; it never initializes CUDA (an import that did ends it, before the hand-off is taken).
def _batchfit_warm():
    import json
    import os
    import sys

    for name in json.loads(sys.argv[1]):
        try:
            __import__(name)
        except Exception:
            pass  # the job imports it itself, and fails there as it would cold
    torch = sys.modules.get("torch")
    try:
        cuda = torch is not None and torch.cuda.is_initialized()
    except Exception:
        cuda = False
    if cuda:
        sys.exit("batchfit warm process: an import initialized CUDA; the trial runs cold")
    line = sys.stdin.buffer.readline()
    if not line:
        sys.exit(0)  # batchfit went away before handing a trial over
    handoff = json.loads(line)
    # the trial's stdin, as a cold trial's: nothing
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(handoff["cwd"])
    for key in handoff["unset"]:
        os.environ.pop(key, None)
    os.environ.update(handoff["env"])  # putenv: C libraries see it too
    import tempfile

    tempfile.tempdir = None  # TMPDIR is the trial's now
    sys.argv = handoff["argv"]
    safe_path = getattr(sys.flags, "safe_path", False) or sys.flags.isolated
    with open(handoff["ack"], "w"):
        pass  # the trial is the command's from here on
    import runpy

    try:
        if handoff.get("module"):
            if not safe_path:
                sys.path[0] = os.getcwd()
            runpy.run_module(handoff["module"], run_name="__main__", alter_sys=True)
        else:
            path = os.path.abspath(handoff["script"])  # __file__ as CPython sets it
            if not safe_path:
                sys.path[0] = os.path.dirname(os.path.realpath(path))
            runpy.run_path(path, run_name="__main__")
    except Exception as e:
        # the traceback a cold run prints: from the command's own first frame (not this file's nor
        # runpy's), and exit status 1
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in ("<string>", getattr(runpy, "__file__", None), "<frozen runpy>"):
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        sys.exit(1)


_batchfit_warm()
