"""The files a harness run leaves: JSON results rewritten after every stage or item (so a crash or a
timeout keeps what was measured), Markdown written whole or into a marked section of a document, and the
progress log on stderr.

Every write is atomic (a temporary file beside the target, then ``os.replace``): a reader never sees half a
file, and a run killed while writing leaves the previous version.
"""
import datetime
import hashlib
import json
import os
import sys


def load_json(path, default=None):
    """The JSON in path; `default` (or {}) when it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {} if default is None else default


def save_json(path, obj):
    """Writes obj as indented JSON with a final newline, atomically; creates the directory."""
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def write_text(path, text):
    """Writes text to path atomically."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def replace_section(path, begin, end, section, title="# Benchmarks\n"):
    """Puts `section` between the markers `begin` and `end` of the document at path, leaving the rest of it
    alone; appends the marked section when the markers are missing (creating the file with `title`)."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        text = title
    block = f"{begin}\n{section}{end}"
    if begin in text and end in text and text.index(begin) < text.index(end):
        a, b = text.index(begin), text.index(end) + len(end)
        text = text[:a] + block + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    write_text(path, text)


def sha256_of(path):
    """Hex sha256 of a file (the binaries a run measured), or None when it cannot be read."""
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None


def log(msg, who=None):
    """One progress line on stderr: ``[who HH:MM:SS] msg`` (``[HH:MM:SS] msg`` without who)."""
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    print(f"[{who + ' ' if who else ''}{stamp}] {msg}", file=sys.stderr, flush=True)
