"""``mox.file.set_auth``: the object store's credentials and endpoint, set from a script.

memarts reads them from the environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``) when an engine starts, so ``set_auth`` writes those
variables and, in origin and embedded modes (where the engine lives in this process), replaces the
process's client so the next call uses them. Child processes started afterwards inherit them too.

In proxy mode the fleet's processes talk to the origin with the credentials they were started with:
a script cannot change them, and ``set_auth`` says so in a warning, once per process (start the fleet
with the credentials in its environment, or ``MEMARTS_CREDENTIALS_FILE``).
"""

import logging
import os
import warnings

_log = logging.getLogger("memarts")
_warned = False


def _endpoint(server, port, is_secure):
    if "://" in server:
        scheme, _, host = server.partition("://")
    else:
        scheme, host = ("http" if is_secure is False else "https"), server
    host = host.rstrip("/")
    if port is not None and ":" not in host:
        host = f"{host}:{int(port)}"
    return f"{scheme}://{host}"


def set_auth(
    ak=None,
    sk=None,
    server=None,
    port=None,
    is_secure=None,
    ssl_verify=None,
    long_conn_mode=None,
    path_style=None,
    retry=None,
    retry_wait=None,
    client_timeout=None,
    list_max_keys=None,
    **kwargs,
):
    """Sets the object store's access key ``ak``, secret key ``sk``, and endpoint (``server``,
    optionally ``port``; ``is_secure=False`` for plain http) for this process: every argument left
    None keeps its current value.

    Accepted with no effect here (memarts' origin client decides them): ``ssl_verify`` (TLS is
    always verified), ``long_conn_mode`` (connections are always pooled), ``path_style`` (requests
    are path-style), ``retry``, ``retry_wait``, ``client_timeout``, ``list_max_keys``, and any other
    keyword a newer MoXing may add. In proxy mode nothing changes for the fleet (see the module)."""
    from . import file as _file

    del ssl_verify, long_conn_mode, path_style, retry, retry_wait, client_timeout, list_max_keys, kwargs
    if ak is not None:
        os.environ["AWS_ACCESS_KEY_ID"] = str(ak)
    if sk is not None:
        os.environ["AWS_SECRET_ACCESS_KEY"] = str(sk)
    if server is not None:
        endpoint = _endpoint(str(server), port, is_secure)
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            os.environ["AWS_ALLOW_HTTP"] = "true"
    if _proxy_mode(_file):
        _warn_once()
        return
    _file._reset_client()


def _proxy_mode(file_module):
    client = file_module._client
    if client is not None and file_module._client_pid == os.getpid():
        return client.mode == "proxy"
    from . import _memarts

    return _memarts.settings()["use_memarts_proxy"] or _memarts.fleet_running()


def _warn_once():
    global _warned
    if _warned:
        return
    _warned = True
    message = (
        "mox.file.set_auth: memarts runs in proxy mode, where the fleet reaches the object store "
        "with the credentials it was started with; this call changes nothing for it (start the "
        "fleet with them in its environment, or use MEMARTS_CREDENTIALS_FILE)"
    )
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    _log.warning("%s", message)
