# batchfit's warm trial process (`batchfit probe --exec --warm`): started under the trial's own limit,
# it imports the packages the job imported (sys.argv[1], a JSON list), then runs a trial's command
# (argv, environment, working directory: one JSON hand-off) exactly as `python script.py ARG...` /
# `python -m module ARG...` would. Standard library only; it never initializes CUDA (an import that
# did ends it, before any hand-off is taken).
#
# Two ways (sys.argv[2]):
#   "once"  - waits for one hand-off line on stdin and becomes the trial's process;
#   "serve" - a fork server, under RLIMIT_DATA only, for exploration trials: stdin is a SOCK_SEQPACKET
#             socket; it says "ready" once its imports are done; then each message is either
#             a hand-off with the trial's stdout and stderr (SCM_RIGHTS), or, with no descriptors,
#             {"import": [...]}: more packages to import (a server started before the first trial
#             imports the frameworks the script names, then what the first trial's report named),
#             answered with "ready" once they are imported. The server forks; the child
#             forks the trial and exits, so the trial's parent becomes batchfit (its subreaper), which
#             waits for it as for any trial. The trial starts its own session and sends its pid once
#             it is batchfit's child, then runs the command. Its data segment is the server's, copied whole
#             by the fork: RLIMIT_DATA counts every inherited byte, as it counts a cold run's imports.
def _batchfit_warm():
    import json
    import os
    import sys

    _import(json.loads(sys.argv[1]), sys)
    if sys.argv[2:3] == ["serve"]:
        _serve(json, os, sys)
    line = sys.stdin.buffer.readline()
    if not line:
        sys.exit(0)  # batchfit went away before handing a trial over
    # the trial's stdin, as a cold trial's: nothing
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    _run(json.loads(line), os, sys)


def _import(names, sys):
    for name in names:
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


def _one_thread(os, sys):
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        # a fork keeps only the forking thread: a lock another thread held stays held in the child
        sys.exit(f"batchfit fork server: the imports started {threads - 1} threads; no trial is forked")


def _serve(json, os, sys):
    import ctypes
    import socket
    import time

    libc = ctypes.CDLL(None, use_errno=True)
    _one_thread(os, sys)
    control = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the trials' stdin, as a cold trial's: nothing
    os.close(null)
    control.send(b"ready")  # batchfit hands trials over from now on, never before
    while True:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            data, fds, _, _ = socket.recv_fds(control, 1 << 20, 2)
        except OSError:
            os._exit(0)
        if not data:
            os._exit(0)  # batchfit went away
        if not fds:
            _import(json.loads(data).get("import", []), sys)
            _one_thread(os, sys)
            control.send(b"ready")
            continue
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            continue
        middle = os.fork()
        if middle == 0:
            _fork_trial(json.loads(data), fds, control, os, sys, time, libc)
        for fd in fds:
            os.close(fd)  # the trial's output ends when the trial's processes close it
        os.waitpid(middle, 0)


def _fork_trial(handoff, fds, control, os, sys, time, libc):
    """In the server's child: the trial forked from it in a session of its own, this child gone at
    once."""
    try:
        middle = os.getpid()
        if os.fork() != 0:
            os._exit(0)
        os.setsid()
        while os.getppid() == middle:
            time.sleep(0.0005)  # until batchfit, the subreaper, is this process's parent
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: a trial never outlives batchfit (a fork clears it)
        if os.getppid() == 1:
            os._exit(70)  # batchfit died before that
        control.send(str(os.getpid()).encode())
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in fds:
            os.close(fd)
        control.close()
    except BaseException:
        os._exit(70)
    _run(handoff, os, sys)
    sys.exit(0)  # the interpreter's own shutdown, as a cold run's (atexit, threads joined, streams flushed)


def _run(handoff, os, sys):
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
    import builtins
    import runpy

    # the script's __builtins__ is the builtins module, as in `python script.py` (runpy's own
    # default is its dict, and `__builtins__.__dict__` would fail)
    main_globals = {"__builtins__": builtins}
    try:
        if handoff.get("module"):
            if not safe_path:
                sys.path[0] = os.getcwd()
            runpy.run_module(handoff["module"], init_globals=main_globals, run_name="__main__",
                             alter_sys=True)
        else:
            path = os.path.abspath(handoff["script"])  # __file__ as CPython sets it
            if not safe_path:
                sys.path[0] = os.path.dirname(os.path.realpath(path))
            runpy.run_path(path, init_globals=main_globals, run_name="__main__")
    except Exception as e:
        # the traceback a cold run prints: from the command's own first frame (not this file's nor
        # runpy's), and exit status 1
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in ("<string>", getattr(runpy, "__file__", None), "<frozen runpy>"):
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        sys.exit(1)


_batchfit_warm()
