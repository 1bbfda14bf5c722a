"""The two files of Alibaba's OSS connector, parsed and checked: ``config.json`` (``config_path=``)
and the credentials file (``cred_path=``), as the connector's document describes them.

``config.json`` (every field optional; a missing one takes the document's default)::

    {"logLevel": 1,                                     # 0 DEBUG, 1 INFO, 2 WARN, 3 ERROR
     "logPath": "/var/log/oss-connector/connector.log",
     "auditPath": "/var/log/oss-connector/audit.log",   # requests slower than 100 ms
     "datasetConfig": {"prefetchConcurrency": 24, "prefetchWorker": 2},
     "checkpointConfig": {"prefetchConcurrency": 24, "prefetchWorker": 4, "uploadConcurrency": 64}}

A field of the wrong type or out of range, or a file that is not a JSON object, raises
:class:`OssConfigError` naming the file and the field (``config.json: datasetConfig.prefetchConcurrency
must be an integer >= 1, got 'x'``). A field the document does not list is tolerated with a warning
naming it (a newer connector's field must not break a job).

The credentials file: ``AccessKeyId`` and ``AccessKeySecret`` (non-empty strings) are required,
``SecurityToken`` and ``Expiration`` (RFC 3339, e.g. ``2024-08-20T00:00:00Z``) optional; without
``Expiration`` the credential never expires. A missing or malformed field raises
:class:`CredentialsFileError` naming it. Nothing here ever puts the secret or the token in a message.
"""

import datetime
import json
import os
import time
import warnings
from dataclasses import dataclass

from .errors import ConfigError, PermissionDeniedError

DEFAULT_LOG_PATH = "/var/log/oss-connector/connector.log"
DEFAULT_AUDIT_PATH = "/var/log/oss-connector/audit.log"
# logLevel values of the document, as levels of Python's logging.
LOG_LEVELS = {0: 10, 1: 20, 2: 30, 3: 40}


class OssConfigError(ConfigError):
    """``config.json`` is unreadable, not JSON, or one of its fields is malformed (the message names it)."""


class CredentialsFileError(ConfigError):
    """The credentials file is unreadable, not JSON, or one of its fields is malformed or missing
    (the message names the file and the field, never the secret)."""


class CredentialsExpiredError(PermissionDeniedError):
    """The credentials file still held an expired credential when the wait for its renewal ended."""


@dataclass(frozen=True)
class DatasetConfig:
    prefetch_concurrency: int = 24
    prefetch_worker: int = 2


@dataclass(frozen=True)
class CheckpointConfig:
    prefetch_concurrency: int = 24
    prefetch_worker: int = 4
    upload_concurrency: int = 64


@dataclass(frozen=True)
class OssConfig:
    """A parsed ``config.json``; ``OssConfig()`` is the document's defaults."""

    log_level: int = 1
    log_path: str = DEFAULT_LOG_PATH
    audit_path: str = DEFAULT_AUDIT_PATH
    dataset: DatasetConfig = DatasetConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    source: str = ""

    @property
    def python_log_level(self):
        return LOG_LEVELS[self.log_level]


_FIELDS = {
    "logLevel": None,
    "logPath": None,
    "auditPath": None,
    "datasetConfig": ("prefetchConcurrency", "prefetchWorker"),
    "checkpointConfig": ("prefetchConcurrency", "prefetchWorker", "uploadConcurrency"),
}


def _name(path):
    return os.path.basename(path) or path


def _count(where, obj, field, default):
    """A positive integer field of ``obj`` (a JSON object), or its default when absent."""
    if field not in obj:
        return default
    value = obj[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OssConfigError(f"{where}.{field} must be an integer >= 1, got {value!r}")
    return value


def _text(where, obj, field, default):
    if field not in obj:
        return default
    value = obj[field]
    if not isinstance(value, str) or not value:
        raise OssConfigError(f"{where}{field} must be a non-empty path, got {value!r}")
    return value


def parse_config(text, source="config.json"):
    """An :class:`OssConfig` from the text of a ``config.json`` (``source`` names it in errors)."""
    name = _name(source)
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise OssConfigError(f"{name}: not valid JSON ({e}) in {source}") from None
    if not isinstance(doc, dict):
        raise OssConfigError(f"{name}: must be a JSON object, got {type(doc).__name__} in {source}")
    for field, inner in _FIELDS.items():
        if inner is not None and field in doc and not isinstance(doc[field], dict):
            raise OssConfigError(f"{name}: {field} must be an object, got {doc[field]!r}")
    unknown = [f for f in doc if f not in _FIELDS]
    for section, inner in _FIELDS.items():
        if inner is not None and isinstance(doc.get(section), dict):
            unknown += [f"{section}.{f}" for f in doc[section] if f not in inner]
    if unknown:
        where = "" if source == name else f" ({source})"
        warnings.warn(f"{name}: ignoring fields the OSS connector does not define: {', '.join(unknown)}{where}",
                      RuntimeWarning, stacklevel=3)
    level = doc.get("logLevel", 1)
    if isinstance(level, bool) or level not in LOG_LEVELS:
        raise OssConfigError(f"{name}: logLevel must be 0 (DEBUG), 1 (INFO), 2 (WARN) or 3 (ERROR), got {level!r}")
    ds, ck = doc.get("datasetConfig", {}), doc.get("checkpointConfig", {})
    defaults_ds, defaults_ck = DatasetConfig(), CheckpointConfig()
    return OssConfig(
        log_level=level,
        log_path=_text(f"{name}: ", doc, "logPath", DEFAULT_LOG_PATH),
        audit_path=_text(f"{name}: ", doc, "auditPath", DEFAULT_AUDIT_PATH),
        dataset=DatasetConfig(
            prefetch_concurrency=_count(f"{name}: datasetConfig", ds, "prefetchConcurrency",
                                        defaults_ds.prefetch_concurrency),
            prefetch_worker=_count(f"{name}: datasetConfig", ds, "prefetchWorker", defaults_ds.prefetch_worker),
        ),
        checkpoint=CheckpointConfig(
            prefetch_concurrency=_count(f"{name}: checkpointConfig", ck, "prefetchConcurrency",
                                        defaults_ck.prefetch_concurrency),
            prefetch_worker=_count(f"{name}: checkpointConfig", ck, "prefetchWorker", defaults_ck.prefetch_worker),
            upload_concurrency=_count(f"{name}: checkpointConfig", ck, "uploadConcurrency",
                                      defaults_ck.upload_concurrency),
        ),
        source=source,
    )


def load_config(path):
    """The :class:`OssConfig` of the file ``path``; None or ``""`` (no file) is None."""
    if not path:
        return None
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise OssConfigError(f"{_name(path)}: cannot read {path}: {e.strerror or e}") from None
    return parse_config(text, source=path)


@dataclass(frozen=True)
class Credentials:
    """What a credentials file holds. ``repr`` shows the key id and expiry only."""

    access_key_id: str
    access_key_secret: str
    security_token: str
    expiration: object  # a UTC datetime, or None: never expires
    path: str

    def __repr__(self):
        return f"Credentials(access_key_id={self.access_key_id!r}, expiration={self.expiration}, path={self.path!r})"

    def expires_within(self, seconds):
        if self.expiration is None:
            return False
        now = datetime.datetime.now(datetime.timezone.utc)
        return (self.expiration - now).total_seconds() <= seconds


def _rfc3339(where, value):
    if not isinstance(value, str):
        raise CredentialsFileError(f"{where}: Expiration must be an RFC 3339 time such as 2024-08-20T00:00:00Z, "
                                   f"got {value!r}")
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise CredentialsFileError(f"{where}: Expiration must be an RFC 3339 time such as "
                                   f"2024-08-20T00:00:00Z, got {value!r}") from None
    if when.tzinfo is None:
        raise CredentialsFileError(f"{where}: Expiration must say its time zone (2024-08-20T00:00:00Z), got {value!r}")
    return when.astimezone(datetime.timezone.utc)


def parse_credentials(text, path):
    """:class:`Credentials` from the text of a credentials file (``path`` names it in errors)."""
    where = f"credentials file {path}"
    try:
        doc = json.loads(text)
    except ValueError as e:
        # The decoder's message gives a position, never the text around it.
        raise CredentialsFileError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise CredentialsFileError(f"{where}: must be a JSON object")
    values = {}
    for field, required in (("AccessKeyId", True), ("AccessKeySecret", True), ("SecurityToken", False)):
        value = doc.get(field)
        if value is None or (value == "" and not required):
            if required:
                raise CredentialsFileError(f"{where}: {field} is missing (AccessKeyId and AccessKeySecret are required)")
            values[field] = ""
            continue
        if not isinstance(value, str) or not value:
            shown = repr(value) if field == "AccessKeyId" else f"a value of type {type(value).__name__}"
            raise CredentialsFileError(f"{where}: {field} must be a non-empty string, got {shown}")
        values[field] = value
    expiration = doc.get("Expiration")
    expiration = None if expiration in (None, "") else _rfc3339(where, expiration)
    return Credentials(values["AccessKeyId"], values["AccessKeySecret"], values["SecurityToken"], expiration, path)


def load_credentials(path):
    path = os.path.abspath(os.fspath(path))
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise CredentialsFileError(f"credentials file {path}: cannot read it: {e.strerror or e}") from None
    return parse_credentials(text, path)


def load_valid_credentials(path, wait, poll=0.2):
    """The credentials of ``path``, re-read while the credential it holds has expired (as the
    connector does: its renewer rewrites the file), for up to ``wait`` seconds; then
    :class:`CredentialsExpiredError`. A malformed file is an error at once."""
    deadline = time.monotonic() + wait
    while True:
        creds = load_credentials(path)
        if not creds.expires_within(0):
            return creds
        if time.monotonic() >= deadline:
            stamp = creds.expiration.strftime("%Y-%m-%dT%H:%M:%SZ")
            raise CredentialsExpiredError(
                f"credentials file {creds.path}: Expiration {stamp} is past, and the file was not renewed "
                f"within {wait:g} s (MEMARTS_TIMEOUT)")
        time.sleep(poll)
