"""A one-line progress report on a terminal (files, bytes, rate, ETA) for long copies; nothing when
stderr is not a terminal (a log file, a pipe, a DataLoader worker's captured output)."""

import sys
import threading
import time

_EVERY = 0.2  # seconds between two redraws


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n:.1f} TiB"


def _clock(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """``done(nbytes)`` after each file; ``close()`` at the end. ``total_bytes`` (None if unknown)
    makes the ETA go by bytes, else it goes by files."""

    def __init__(self, what, total_files, total_bytes=None, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.on = bool(getattr(self.stream, "isatty", lambda: False)()) and total_files > 0
        self.what, self.total_files, self.total_bytes = what, total_files, total_bytes
        self.files = self.bytes = 0
        self.start = self.drawn = time.monotonic()
        self.lock = threading.Lock()

    def done(self, nbytes):
        with self.lock:
            self.files += 1
            self.bytes += nbytes or 0
            now = time.monotonic()
            if self.on and (now - self.drawn >= _EVERY or self.files == self.total_files):
                self.drawn = now
                self._draw(now)

    def _draw(self, now):
        secs = max(now - self.start, 1e-6)
        rate = self.bytes / secs
        if self.total_bytes:
            left = (self.total_bytes - self.bytes) / rate if rate > 0 else 0
            size = f"{_size(self.bytes)}/{_size(self.total_bytes)}"
        else:
            left = (self.total_files - self.files) * secs / self.files
            size = _size(self.bytes)
        line = (f"{self.what}: {self.files}/{self.total_files} files, {size}, {_size(rate)}/s, "
                f"ETA {_clock(max(left, 0))}")
        self.stream.write(f"\r{line}\x1b[K")
        self.stream.flush()

    def close(self):
        if self.on and self.files:
            self.stream.write("\n")
            self.stream.flush()
