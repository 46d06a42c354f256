"""JSON Lines helpers shared by the harness (writers) and the checker (reader).

One object per line, written whole and flushed at once, so that a process killed mid-run leaves
at most one torn last line, which `read` ignores.
"""

import json
import threading


class Writer:
    """An open JSONL file that several threads may append to."""

    def __init__(self, path):
        self._lock = threading.Lock()
        self._file = open(path, "a", encoding="utf-8")

    def write(self, obj):
        """Appends `obj` as one line and flushes it."""
        line = json.dumps(obj, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self):
        with self._lock:
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_append_lock = threading.Lock()


def append(path, obj):
    """Appends `obj` to `path` as one line (opens and closes the file; prefer `Writer` in loops)."""
    line = json.dumps(obj, separators=(",", ":")) + "\n"
    with _append_lock, open(path, "a", encoding="utf-8") as f:
        f.write(line)


def read(path):
    """Every object in `path`, in order; [] for a missing file. A torn last line (no newline, or
    not JSON) is ignored; a bad line elsewhere is an error, since the writer never leaves one."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return []
    out = []
    last = len(lines) - 1
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == last:
                break
            raise ValueError(f"{path}:{i + 1}: not JSON: {line[:80]!r}") from None
    return out
