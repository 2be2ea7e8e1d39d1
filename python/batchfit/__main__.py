"""``python -m batchfit ARGS``: runs the ``batchfit`` command installed with this package.

Where pip put the command: the scripts directory of this interpreter's installation scheme (a venv's
``bin/``), else the user scheme's (``pip install --user``), else ``bin/`` next to the package
(``pip install --target DIR``), else the first ``batchfit`` on PATH.
"""

import os
import shutil
import sys
import sysconfig


def _user_scheme():
    if sys.version_info >= (3, 10):
        return sysconfig.get_preferred_scheme("user")
    if os.name == "nt":
        return "nt_user"
    if sys.platform == "darwin" and getattr(sys, "_framework", None):
        return "osx_framework_user"
    return "posix_user"


def find_batchfit_bin():
    """The path of the ``batchfit`` executable of this installation; FileNotFoundError when absent."""
    exe = "batchfit" + (sysconfig.get_config_var("EXE") or "")
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    candidates = [
        os.path.join(sysconfig.get_path("scripts"), exe),
        os.path.join(sysconfig.get_path("scripts", scheme=_user_scheme()), exe),
        os.path.join(package_root, "bin", exe),
    ]
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    on_path = shutil.which(exe)
    if on_path:
        return on_path
    raise FileNotFoundError(
        "batchfit: the batchfit command is not installed with this package (looked for "
        + ", ".join(candidates)
        + ", then on PATH). Reinstall it: python -m pip install --force-reinstall batchfit"
    )


def main():
    try:
        path = os.fsdecode(find_batchfit_bin())
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 2
    if sys.platform == "win32":
        import subprocess

        return subprocess.run([path, *sys.argv[1:]]).returncode
    os.execv(path, [path, *sys.argv[1:]])
    return 127  # not reached: execv replaces this process or raises


if __name__ == "__main__":
    sys.exit(main())
