"""Sizes and durations as the harnesses read and print them.

One parser for every size a harness meets: a command-line budget (``1342177280``, ``1.25GiB``, ``1280MiB``,
``1GB``) and batchfit's own ``format_size`` output in ``batchfit-train``'s summary line (``12.34 GiB``,
``100 B``). The printers are the ones each document has always used; the two duration styles belong to the
two documents (the side-by-side section of docs/benchmarks.md, and gpu-check's results.md) and stay as
they are so regenerated documents do not change.
"""
import re

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40

UNITS = {"": 1, "B": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB, "K": KiB, "M": MiB, "G": GiB,
         "KB": 10**3, "MB": 10**6, "GB": 10**9}

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def parse_size(text):
    """Bytes of '1342177280', '1.25GiB', '512.00 MiB', '100 B', '1GB' (binary units are powers of 1024,
    KB/MB/GB powers of 1000); None when text is not a size."""
    m = _SIZE.fullmatch(text or "")
    if not m or m.group(2) not in UNITS:
        return None
    return int(float(m.group(1)) * UNITS[m.group(2)])


def mib(b):
    """'736.0 MiB'"""
    return f"{b / 2**20:.1f} MiB"


def gib(b):
    """'1.25 GiB' (3 significant digits)"""
    return f"{b / 2**30:.3g} GiB"


def fmt_bytes(b):
    """'1.25 GiB' from 1 GiB up, else '512.0 MiB'; '—' for None."""
    if b is None:
        return "—"
    if b >= GiB:
        return f"{b / GiB:.2f} GiB"
    return f"{b / MiB:.1f} MiB"


def seconds_then_minutes(s):
    """'9 s', '372 s (6.2 min)' from 2 minutes up; '—' for None (the side-by-side section's style)."""
    if s is None:
        return "—"
    return f"{s:.0f} s" if s < 120 else f"{s:.0f} s ({s / 60:.1f} min)"


def minutes_and_seconds(s):
    """'9.4 s', '6 min 12 s' from a minute up; '—' for None (gpu-check's results.md style)."""
    if s is None:
        return "—"
    s = float(s)
    if s < 60:
        return f"{s:.1f} s"
    return f"{int(s // 60)} min {int(round(s % 60)):02d} s"
