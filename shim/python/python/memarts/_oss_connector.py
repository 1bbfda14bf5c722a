"""What the OSS connector's ``endpoint=``, ``cred_path=`` and ``config_path=`` give a dataset or
checkpoint (:class:`Connector`): the process's origin (one per process, see :mod:`memarts.oss`),
the ``memarts`` logger's file and level, and the audit log."""

import io
import logging
import os
import threading
import warnings

from . import file as _file
from . import torch as _mt
from ._audit import AuditLog, NoAudit
from ._oss_config import OssConfig, OssConfigError, load_config, load_valid_credentials
from .auth import _endpoint, _proxy_mode
from . import _memarts
from .errors import BadRequestError, ConfigError
from .errors import Error as MemartsError

_log = logging.getLogger("memarts")

# --- endpoint= and cred_path=: one origin per process --------------------------------------------

_origin_lock = threading.Lock()
_origin = {}  # what this process's datasets asked for: {"endpoint": ..., "cred_path": ...}


def _timeout():
    """``MEMARTS_TIMEOUT``, parsed by the one settings table (a malformed value is a ConfigError)."""
    return _memarts.settings()["timeout"]


def _run_dir():
    """The run dir the client looks in (``MEMARTS_RUN_DIR``, else the default), as the client resolves it."""
    return str(_memarts.settings()["run_dir"])


def _check_fleet(endpoint, cred_path):
    """Proxy mode: the fleet reaches the origin; it must be the one asked for."""
    try:
        origin = _memarts.fleet_file()
    except MemartsError as e:
        warnings.warn(f"OSS connector: cannot read the fleet's fleet.json to check its endpoint and credentials "
                      f"file ({e}); reading with whatever the fleet was started with", RuntimeWarning, stacklevel=4)
        return
    theirs = origin.get("endpoint")
    theirs = _endpoint(theirs, None, None) if theirs else "the AWS default endpoint"
    if theirs != endpoint:
        raise ConfigError(
            f"endpoint={endpoint!r}: the memarts fleet in {_run_dir()} reaches {theirs} (in proxy mode the fleet holds "
            f"the origin client); start it with AWS_ENDPOINT_URL={endpoint} (memarts start_proxy N)")
    if cred_path:
        fleet_cred = origin.get("credentials_file")
        if not fleet_cred or os.path.realpath(fleet_cred) != os.path.realpath(cred_path):
            had = f"the credentials file {fleet_cred}" if fleet_cred else "no credentials file"
            raise ConfigError(
                f"cred_path={cred_path!r}: the memarts fleet in {_run_dir()} was started with {had} (in proxy mode "
                f"the fleet signs the requests); start it with MEMARTS_CREDENTIALS_FILE={cred_path}")


def _apply_origin(endpoint, cred_path):
    """Makes ``endpoint`` and ``cred_path`` the ones this process reads with (see the module);
    returns the endpoint as a URL."""
    if not endpoint:
        raise BadRequestError("endpoint must be non-empty (the OSS endpoint, e.g. https://oss-cn-hangzhou.aliyuncs.com)")
    url = _endpoint(str(endpoint), None, None)
    cred = os.path.abspath(os.fspath(cred_path)) if cred_path else None
    if cred:
        load_valid_credentials(cred, wait=_timeout())  # a malformed file is an error here, naming the field
    with _origin_lock:
        for key, value in (("endpoint", url), ("cred_path", cred)):
            had = _origin.get(key)
            if value and had and had != value:
                raise ConfigError(
                    f"{key}={value!r}: this process already reads with {key}={had!r} (memarts holds one origin client "
                    "per process; every dataset and checkpoint of a process must use the same endpoint and "
                    "credentials file)")
        if _proxy_mode(_file):
            _check_fleet(url, cred)
        else:
            wanted = {"AWS_ENDPOINT_URL": url}
            if url.startswith("http://"):
                wanted["AWS_ALLOW_HTTP"] = "true"
            if cred:
                wanted["MEMARTS_CREDENTIALS_FILE"] = cred
            changed = {k: v for k, v in wanted.items() if os.environ.get(k) != v}
            if changed:
                os.environ.update(changed)
                _file._reset_client()  # the in-process engine starts again with them
        _origin["endpoint"] = url
        if cred:
            _origin["cred_path"] = cred
    return url


# --- config_path=: logging and the audit log ------------------------------------------------------

_configured_logs = {}


def _configure_logging(cfg):
    path = os.path.abspath(cfg.log_path)
    with _origin_lock:
        handler = _configured_logs.get(path)
        if handler is None:
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                handler = logging.FileHandler(path, encoding="utf-8")
            except OSError as e:
                raise OssConfigError(f"{os.path.basename(cfg.source)}: logPath {path} cannot be opened: "
                                     f"{e.strerror or e} (set logPath to a writable file)") from None
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"))
            _log.addHandler(handler)
            _configured_logs[path] = handler
        handler.setLevel(cfg.python_log_level)
        if _log.level == logging.NOTSET or _log.level > cfg.python_log_level:
            _log.setLevel(cfg.python_log_level)


def _open_audit(cfg):
    audit = AuditLog(cfg.audit_path)
    try:
        audit.open()
    except OSError as e:
        raise OssConfigError(f"{os.path.basename(cfg.source)}: auditPath {audit.path} cannot be opened: "
                             f"{e.strerror or e} (set auditPath to a writable file)") from None
    return audit


class Connector:
    """What ``endpoint=``, ``cred_path=`` and ``config_path=`` give one dataset or checkpoint."""

    def __init__(self, endpoint, cred_path, config_path):
        self.config = load_config(config_path)  # checked before anything changes
        self.endpoint = _apply_origin(endpoint, cred_path)
        self.cred_path = cred_path or ""
        self.config_path = config_path or ""
        self.audit = NoAudit()
        if self.config is not None:
            _configure_logging(self.config)
            self.audit = _open_audit(self.config)

    @property
    def settings(self):
        return self.config or OssConfig()

    def list_prefix(self, oss_uri):
        with self.audit.timed("list", oss_uri):
            return _mt.MapDataset.from_prefix(oss_uri).urls

    def read_manifest(self, path, parser, base):
        """``[(url, label)]`` of a manifest: ``base + key`` for each ``(key, label)`` the parser yields."""
        with self.audit.timed("manifest", os.fspath(path)) as t:
            data = _file.read(os.fspath(path), binary=True)
            t.bytes = len(data)
        return [(f"{base}{key}", label) for key, label in parser(io.BytesIO(data))]
