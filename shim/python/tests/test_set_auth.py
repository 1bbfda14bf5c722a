"""``mox.file.set_auth``: credentials and endpoint set from a script, in each mode."""

import os
import subprocess
import sys
import warnings
from urllib.parse import urlparse

import pytest

import moxing as mox
from memarts import auth

_AUTH_VARS = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP"]


def _script_env(tmp_path, **extra):
    """A child's environment with no credentials and no endpoint: set_auth must provide them."""
    env = {k: v for k, v in os.environ.items() if k not in _AUTH_VARS and k != "USE_MEMARTS"}
    env.update(MEMARTS_RUN_DIR=str(tmp_path / "no-fleet-here"), MEMARTS_CACHE_DIR=str(tmp_path / "cache"), **extra)
    return env


@pytest.mark.parametrize("use_memarts", ["0", "1"], ids=["origin", "embedded"])
def test_set_auth_configures_the_in_process_modes(s3, bucket, tmp_path, moto_endpoint, use_memarts):
    s3.put_object(Bucket=bucket, Key="k.txt", Body=b"authorised")
    host = urlparse(moto_endpoint)
    code = (
        "import moxing as mox\n"
        f"mox.file.set_auth(ak='testing', sk='testing', server='{host.hostname}', port={host.port}, is_secure=False,\n"
        "                  ssl_verify=False, long_conn_mode=True, path_style=True, retry=3, retry_wait=1,\n"
        "                  client_timeout=30, list_max_keys=1000)\n"
        f"assert mox.file.read('obs://{bucket}/k.txt') == 'authorised'\n"
        f"expected = {'embedded' if use_memarts == '1' else 'origin'!r}\n"
        "assert mox.file.mode() == expected, mox.file.mode()\n"
        # Changing the endpoint again replaces the in-process engine.
        f"mox.file.set_auth(server='http://{host.hostname}:{host.port}')\n"
        f"assert mox.file.read('obs://{bucket}/k.txt', binary=True) == b'authorised'\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_script_env(tmp_path, USE_MEMARTS=use_memarts)
    )
    assert out.returncode == 0, out.stderr


def test_set_auth_endpoint_spelling():
    assert auth._endpoint("obs.example.com", None, None) == "https://obs.example.com"
    assert auth._endpoint("127.0.0.1", 9000, False) == "http://127.0.0.1:9000"
    assert auth._endpoint("http://h:1/", 2, True) == "http://h:1"


@pytest.mark.proxy_only
def test_set_auth_in_proxy_mode_warns_once(monkeypatch, fleet):
    for var in _AUTH_VARS:
        monkeypatch.setenv(var, os.environ.get(var, ""))
    monkeypatch.setattr(auth, "_warned", False)
    assert mox.file.mode() == "proxy"
    with pytest.warns(RuntimeWarning, match="proxy mode"):
        mox.file.set_auth(ak="testing", sk="testing")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mox.file.set_auth(ak="testing", sk="testing")
    assert mox.file.mode() == "proxy"
