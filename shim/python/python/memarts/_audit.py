"""The OSS connector's audit log (``auditPath`` of ``config.json``): one line for each request that
took longer than 100 ms (the document's threshold), so a slow origin or a cold cache shows up.

Each line is a JSON object, so keys with spaces or tabs stay one field::

    {"time": "2026-12-01T17:50:01.123Z", "op": "read", "key": "oss://bucket/train/0001.jpg",
     "bytes": 110592, "ms": 152.4, "outcome": "ok", "pid": 4242}

``op`` is ``read`` (a dataset item), ``list`` (the listing of ``from_prefix``), ``manifest`` (the
manifest of ``from_manifest_file``), ``checkpoint_read`` or ``checkpoint_write`` (the upload at
close). ``outcome`` is ``ok`` or the name of the exception raised. Every process (DataLoader workers
included) appends whole lines with one ``write`` on an ``O_APPEND`` descriptor, so lines from many
processes never interleave.
"""

import datetime
import json
import os
import threading
import time

SLOW_MS = 100.0


class AuditLog:
    """Appends the slow requests to ``path``; picklable (a worker opens the file again)."""

    def __init__(self, path, threshold_ms=SLOW_MS):
        self.path = os.path.abspath(path)
        self.threshold_ms = threshold_ms
        self._fd = None
        self._pid = None
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"path": self.path, "threshold_ms": self.threshold_ms}

    def __setstate__(self, state):
        self.__init__(state["path"], state["threshold_ms"])

    def open(self):
        """Opens (creating it and its directory) the log now, so a bad path fails at construction;
        raises OSError."""
        with self._lock:
            if self._fd is None or self._pid != os.getpid():
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
                self._pid = os.getpid()
            return self._fd

    def record(self, op, key, nbytes, ms, outcome="ok"):
        """Writes the line if ``ms`` is over the threshold."""
        if ms <= self.threshold_ms:
            return
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        line = json.dumps({"time": stamp, "op": op, "key": key, "bytes": int(nbytes), "ms": round(ms, 1),
                           "outcome": outcome, "pid": os.getpid()})
        try:
            os.write(self.open(), (line + "\n").encode())
        except OSError:
            pass  # an audit log that cannot be written must not fail the training step

    def timed(self, op, key):
        return _Timed(self, op, key)


class _Timed:
    """``with audit.timed(op, key) as t: ...; t.bytes = n``: records the block's duration."""

    __slots__ = ("audit", "op", "key", "bytes", "start")

    def __init__(self, audit, op, key):
        self.audit, self.op, self.key, self.bytes = audit, op, key, 0

    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb):
        ms = (time.perf_counter() - self.start) * 1000
        self.audit.record(self.op, self.key, self.bytes, ms, "ok" if exc_type is None else exc_type.__name__)
        return False


class NoAudit:
    """The audit log when no ``config_path`` is given: nothing is written."""

    def record(self, *_args, **_kwargs):
        pass

    def timed(self, op, key):
        return _Untimed()


class _Untimed:
    __slots__ = ("bytes",)

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        return False
