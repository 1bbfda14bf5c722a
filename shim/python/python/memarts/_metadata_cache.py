"""The persistent local metadata cache of ``USE_METADATA_CACHE=1``: object URL -> (size, ETag), in
an SQLite file shared by every process of the node (``$MEMARTS_CACHE_DIR/metadata-cache.sqlite``).

A hit lets ``read`` and ``copy`` skip the metadata request; the ETag still pins the version read, so
an object that changed since it was cached gives a ``StaleError``, after which the entry is dropped
and the object read again.
"""

import os
import sqlite3
import threading
import time


def _default_path():
    # The cache dir as the settings table resolves it (MEMARTS_CACHE_DIR, else the XDG default).
    from . import _memarts

    return os.path.join(_memarts.settings()["cache_dir"], "metadata-cache.sqlite")


def _use_wal(db, patience=30.0):
    """Switches the database to WAL mode (which then stays). Several processes opening a new
    database at once (DataLoader workers) race for the exclusive lock this takes, and sqlite does
    not wait for it as it does for other statements: "database is locked" at once. Retried."""
    deadline = time.monotonic() + patience
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class MetadataCache:
    def __init__(self, path=None):
        self.path = path or _default_path()
        self._local = threading.local()

    def _db(self):
        db = getattr(self._local, "db", None)
        if db is None or getattr(self._local, "pid", None) != os.getpid():
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            _use_wal(db)
            db.execute("CREATE TABLE IF NOT EXISTS meta (url TEXT PRIMARY KEY, size INTEGER, etag TEXT)")
            self._local.db, self._local.pid = db, os.getpid()
        return db

    def get(self, url):
        row = self._db().execute("SELECT size, etag FROM meta WHERE url = ?", (url,)).fetchone()
        return (row[0], row[1]) if row else None

    def put(self, url, size, etag):
        if etag:
            self._db().execute("INSERT OR REPLACE INTO meta (url, size, etag) VALUES (?, ?, ?)", (url, size, etag))

    def drop(self, url):
        self._db().execute("DELETE FROM meta WHERE url = ?", (url,))
