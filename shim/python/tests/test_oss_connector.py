"""Alibaba's OSS connector names over memarts (``memarts.oss``, re-exported by ``memarts.torch``).

The connector document's full training example runs here with only its import line changed (and
its placeholders filled in), against moto behind a relay that makes every origin request slow
(tests/bench/relay.py, +150 ms), through a fleet started with a credentials file (proxy pass) or the
in-process engine (embedded pass), with a ``config.json``: every item is read byte-exact in each
epoch, the checkpoint round-trips, and the audit log holds the requests the relay made slow — the
cold reads, not the warm ones.

The example and the other connector scripts run in child processes: ``endpoint=`` and ``cred_path=``
are process-wide (they configure the process's one origin client), and the children's environment
has no ``AWS_*`` endpoint or keys, so only those arguments can make them work.
"""

import datetime
import hashlib
import inspect
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import textwrap
import warnings
from types import SimpleNamespace
from urllib.parse import urlparse

import pytest

from conftest import MEMARTS, ROOT, pattern
from memarts import errors
from memarts._audit import AuditLog
from memarts._oss_config import (
    CredentialsFileError,
    OssConfig,
    OssConfigError,
    load_valid_credentials,
    parse_config,
    parse_credentials,
)

sys.path.insert(0, os.path.join(ROOT, "tests", "bench"))
import relay  # noqa: E402  (tests/bench/relay.py: the slow link)

LATENCY_MS = 150  # added by the relay to every origin request: well over the audit's 100 ms
SECRET = "oss-SECRET-3c9e1d"
TOKEN = "oss-TOKEN-7a2f90"
# What the children must not inherit: the origin is only what endpoint= and cred_path= say.
_ORIGIN_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ALLOW_HTTP", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                "AWS_SESSION_TOKEN", "MEMARTS_CREDENTIALS_FILE", "USE_MEMARTS", "USE_MEMARTS_PROXY")

# The connector document's full example ("Exemple de code"), verbatim.
SEED_EXAMPLE = r'''
from osstorchconnector import OssMapDataset, OssCheckpoint
import torchvision.transforms as transforms
import accimage
import torchvision.models as models
import torch

# The default credential path after you configure a RAM role for a DLC job or DSW instance.
cred_path = "/mnt/.alibabacloud/credentials"  
config_path = "config.json"
checkpoint = OssCheckpoint(endpoint="{oss_endpoint}", cred_path=cred_path, config_path=config_path)
model = models.__dict__["resnet18"]()

epochs = 100  # Specify the number of epochs.
checkpoint_read_uri = "{checkpoint_path}"
checkpoint_write_uri = "{checkpoint_path}"
with checkpoint.reader(checkpoint_read_uri) as reader:
    state_dict = torch.load(reader)
    model.load_state_dict(state_dict)

def read_and_transform(data):
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406],
                                     std=[0.229, 0.224, 0.225])
    transform = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        normalize,
    ])

    try:
        img = accimage.Image((data.read()))
        value = transform(img)
    except Exception as e:
        print("read failed", e)
        return None, 0
    return value, 0
dataset = OssMapDataset.from_prefix("{oss_data_folder_uri}", endpoint="{oss_endpoint}", transform=read_and_transform, cred_path=cred_path, config_path=config_path)
data_loader = torch.utils.data.DataLoader(
    dataset, batch_size="{batch_size}",num_workers="{num_workers"}, pin_memory=True)

for epoch in range(args.epochs):
    for step, (images, target) in enumerate(data_loader):
        # batch processing
        # model training
    # save model
    with checkpoint.writer(checkpoint_write_uri) as writer:
        torch.save(model.state_dict(), writer)
'''

# The edits that make it a program, each applied exactly once (``count`` times) and each the least
# the example needs: its import line, its placeholders, the loop body it leaves as comments.
def seed_edits(endpoint, data_uri, checkpoint_uri, cred_path):
    return [
        ("from osstorchconnector import OssMapDataset, OssCheckpoint",
         "from memarts.torch import OssMapDataset, OssCheckpoint", 1),
        # The document's default path of a DLC job's RAM role; the test's file is elsewhere.
        ('cred_path = "/mnt/.alibabacloud/credentials"', f"cred_path = {cred_path!r}", 1),
        ('"{oss_endpoint}"', repr(endpoint), 2),
        ('"{checkpoint_path}"', repr(checkpoint_uri), 2),
        ('"{oss_data_folder_uri}"', repr(data_uri), 1),
        ('batch_size="{batch_size}"', "batch_size=4", 1),
        # The document's quotes are unbalanced here ("{num_workers"}).
        ('num_workers="{num_workers"}', "num_workers=2", 1),
        # A loop body of comments only is not Python: the stand-in training step goes there.
        ("        # batch processing\n        # model training\n",
         "        # batch processing\n        # model training\n        train_step(epoch, step, images, target)\n", 1),
    ]


def edited_seed(**kw):
    text = SEED_EXAMPLE
    for old, new, count in seed_edits(**kw):
        assert text.count(old) == count, (old, text.count(old))
        text = text.replace(old, new)
    return text


# resnet18's stand-in (a real resnet18 is a 45 MB checkpoint per epoch through a slow link): the
# same in the test and in the child.
TINY_MODEL = """
import torch
def resnet18():
    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
"""

# Run before the example in its child process. accimage is not installable (no wheel on PyPI) and
# torchvision would pull a second torch; the stand-ins keep the example's calls. They also keep
# each image's bytes as they are (the real RandomResizedCrop and flip are random), so every item
# can be checked byte for byte: ToTensor of an image is its bytes as a uint8 tensor.
STAND_INS = TINY_MODEL + """
import hashlib, json, sys, types
accimage = types.ModuleType("accimage")
class Image:
    def __init__(self, data):
        self.data = bytes(data)
accimage.Image = Image
torchvision = types.ModuleType("torchvision")
transforms = types.ModuleType("torchvision.transforms")
models = types.ModuleType("torchvision.models")
class _Unchanged:
    def __init__(self, *args, **kwargs):
        pass
    def __call__(self, x):
        return x
transforms.RandomResizedCrop = transforms.RandomHorizontalFlip = transforms.Normalize = _Unchanged
class Compose:
    def __init__(self, steps):
        self.steps = steps
    def __call__(self, x):
        for step in self.steps:
            x = step(x)
        return x
class ToTensor:
    def __call__(self, img):
        return torch.frombuffer(bytearray(img.data), dtype=torch.uint8)
transforms.Compose, transforms.ToTensor = Compose, ToTensor
models.resnet18 = resnet18
torchvision.transforms, torchvision.models = transforms, models
sys.modules.update({"accimage": accimage, "torchvision": torchvision, "torchvision.transforms": transforms,
                    "torchvision.models": models})
del transforms, models, torchvision, accimage

seen = []      # per epoch, the sha256 of every image the DataLoader delivered
loaded = []    # the weights the example loaded from the existing checkpoint
def train_step(epoch, step, images, target):
    while len(seen) <= epoch:
        seen.append([])
    seen[epoch] += [hashlib.sha256(bytes(row.numpy())).hexdigest() for row in images]
    if not loaded:
        loaded.extend(float(v) for p in model.parameters() for v in p.detach().flatten())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
args = types.SimpleNamespace(epochs=EPOCHS)
"""

AFTER_THE_SEED = """
with checkpoint.reader(checkpoint_write_uri) as reader:
    saved = torch.load(reader)
import memarts, os
round_trip = saved.keys() == model.state_dict().keys() and all(
    torch.equal(saved[k], v) for k, v in model.state_dict().items())
json.dump({"seen": seen, "loaded": loaded, "round_trip": round_trip, "mode": memarts.file.mode()},
          open(OUT, "w"))
"""


def credentials(path, key_id, expiration):
    doc = {"AccessKeyId": key_id, "AccessKeySecret": SECRET, "SecurityToken": TOKEN, "Expiration": expiration}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)  # as a renewer does: the file is never seen half written


def stamp(seconds_from_now):
    when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds_from_now)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def config_json(directory, **dataset):
    """The document's config.json, its log paths in ``directory``."""
    cfg = {
        "logLevel": 1,
        "logPath": os.path.join(directory, "log", "connector.log"),
        "auditPath": os.path.join(directory, "log", "audit.log"),
        "datasetConfig": {"prefetchConcurrency": 24, "prefetchWorker": 2, **dataset},
        "checkpointConfig": {"prefetchConcurrency": 24, "prefetchWorker": 4, "uploadConcurrency": 64},
    }
    path = os.path.join(directory, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path, cfg


def audit_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture
def slow_origin(moto_endpoint):
    target = urlparse(moto_endpoint)
    url, stop = relay.start_relay(target.hostname, target.port, latency_ms=LATENCY_MS, mbps_per_conn=0,
                                  mbps_total=0, count_signers=True)
    yield SimpleNamespace(url=url, stats=stop.stats)
    stop()


@pytest.fixture
def node(slow_origin, fleet):
    """A node whose memarts reaches moto only through the slow relay, signing with a credentials
    file: a fleet started with them (proxy pass), or nothing yet (embedded pass: the child's
    engine gets them from endpoint= and cred_path=). ``env`` is the children's environment."""
    base = tempfile.mkdtemp(prefix="oss-")  # short: socket paths live under it
    cred = os.path.join(base, "credentials")
    credentials(cred, "oss-key-1", stamp(3600))
    env = {k: v for k, v in os.environ.items() if k not in _ORIGIN_VARS}
    env.update(MEMARTS_RUN_DIR=os.path.join(base, "run"), MEMARTS_CACHE_DIR=os.path.join(base, "cache"))
    if fleet.mode == "proxy":
        started = subprocess.run(
            [MEMARTS, "start_proxy", "2"], capture_output=True, text=True,
            env=dict(env, AWS_ENDPOINT_URL=slow_origin.url, AWS_ALLOW_HTTP="true", MEMARTS_CREDENTIALS_FILE=cred))
        if started.returncode != 0:
            pytest.fail(f"start_proxy failed: {started.stdout}{started.stderr}")
    else:
        # Each DataLoader worker is a process with an engine of its own, which starts knowing no
        # metadata: without MoXing's persistent metadata cache its first read of an object in each
        # epoch asks the origin for its ETag (a HEAD, slow through the relay) though the bytes are
        # cached. With it a warm read makes no origin request, as through a fleet.
        env.update(USE_MEMARTS="1", USE_METADATA_CACHE="1")
    yield SimpleNamespace(env=env, dir=base, cred=cred, endpoint=slow_origin.url, relay=slow_origin,
                          mode=fleet.mode)
    if fleet.mode == "proxy":
        subprocess.run([MEMARTS, "stop_proxy"], capture_output=True, env=env)
    shutil.rmtree(base, ignore_errors=True)


def run_child(node, code, timeout=300):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=node.env, cwd=node.dir,
                         timeout=timeout)
    assert out.returncode == 0, f"child failed:\n{out.stdout[-4000:]}\n{out.stderr[-6000:]}"
    return out


def put_tiny_checkpoint(s3, bucket, key, value):
    """resnet18's stand-in with every weight ``value``, saved where the example loads it first."""
    import torch

    space = {}
    exec(TINY_MODEL, space)
    model = space["resnet18"]()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    s3.put_object(Bucket=bucket, Key=key, Body=buf.getvalue())


def test_the_seed_example_runs_with_its_import_line_changed(s3, bucket, node):
    import torch

    epochs, n, size = 2, 12, 4096  # equal sizes: the default collate stacks the images
    items = {f"oss://{bucket}/imagenet/train/{i:03d}.jpg": pattern(1500 + i, size) for i in range(n)}
    for uri, body in items.items():
        s3.put_object(Bucket=bucket, Key=uri.split("/", 3)[3], Body=body)
    put_tiny_checkpoint(s3, bucket, "ckpt/resnet18.pt", 7.0)
    config_path, cfg = config_json(node.dir)
    assert os.path.basename(config_path) == "config.json"  # the example names it relative to its cwd
    data_uri, ckpt_uri = f"oss://{bucket}/imagenet/train/", f"oss://{bucket}/ckpt/resnet18.pt"
    seed = edited_seed(endpoint=node.endpoint, data_uri=data_uri, checkpoint_uri=ckpt_uri, cred_path=node.cred)
    out_path = os.path.join(node.dir, "result.json")
    code = f"EPOCHS = {epochs}\nOUT = {out_path!r}\n" + STAND_INS + seed + AFTER_THE_SEED
    out = run_child(node, code)
    assert "read failed" not in out.stdout, out.stdout
    with open(out_path) as f:
        result = json.load(f)

    assert result["mode"] == node.mode
    want = sorted(hashlib.sha256(body).hexdigest() for body in items.values())
    assert len(result["seen"]) == epochs
    for epoch, seen in enumerate(result["seen"]):
        assert sorted(seen) == want, f"epoch {epoch}: the items delivered differ from the origin's"
    assert result["loaded"] and set(result["loaded"]) == {7.0}, "the existing checkpoint was not loaded"
    assert result["round_trip"]
    # The last checkpoint is at the origin: 7, plus one per training step (3 batches of 4, 2 epochs).
    saved = torch.load(io.BytesIO(s3.get_object(Bucket=bucket, Key="ckpt/resnet18.pt")["Body"].read()))
    assert {float(v) for t in saved.values() for v in t.flatten()} == {7.0 + epochs * n / 4}

    # Every origin request went through the relay, signed with the credentials file's key only.
    signers = node.relay.stats()["signers"]
    assert set(signers) == {"oss-key-1"}, signers

    audit = audit_lines(cfg["auditPath"])
    reads = [line for line in audit if line["op"] == "read"]
    # Each item was slow once: its cold read, through the relay. The warm epoch is not there.
    assert sorted(line["key"] for line in reads) == sorted(items), reads
    for line in reads:
        assert line["ms"] >= LATENCY_MS and line["bytes"] == size and line["outcome"] == "ok", line
    ops = [line["op"] for line in audit]
    assert ops.count("checkpoint_write") == epochs, ops  # each upload pays the relay's latency
    assert "checkpoint_read" in ops and "list" in ops, ops
    assert all(line["ms"] > 100 for line in audit), audit
    with open(cfg["logPath"]) as f:
        log = f.read()
    assert f"OssMapDataset from_prefix {data_uri}: {n} objects" in log, log
    assert SECRET not in log and TOKEN not in log


def test_datasets_and_checkpoint_with_the_connector_arguments(s3, bucket, node):
    """from_objects, from_prefix and from_manifest_file of both datasets, the object handed to the
    transform, the config's prefetch settings, the checkpoint's reader and writer, and the errors
    of one process asking for two origins."""
    data = {f"m/{name}": pattern(1700 + i, 1000 + 37 * i) for i, name in enumerate(["a.bin", "b.bin", "c.bin"])}
    for key, body in data.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    s3.put_object(Bucket=bucket, Key="lists/train.tsv", Body=b"a.bin\tcat\nb.bin\tdog\n\nc.bin\n")
    local_manifest = os.path.join(node.dir, "val.tsv")
    with open(local_manifest, "w") as f:
        f.write("c.bin\tbird\n")
    config_path, cfg = config_json(node.dir, prefetchConcurrency=3, prefetchWorker=5)
    other_cred = os.path.join(node.dir, "other-credentials")
    credentials(other_cred, "oss-key-9", stamp(3600))
    code = textwrap.dedent(f"""
        import io, os, pickle
        from memarts import errors
        from memarts.torch import OssCheckpoint, OssIterableDataset, OssMapDataset, imagenet_manifest_parser
        ep, cred, cfg = {node.endpoint!r}, {node.cred!r}, {config_path!r}
        data = {{f"oss://{bucket}/" + k: v for k, v in {data!r}.items()}}
        base = "oss://{bucket}/m/"
        kw = dict(cred_path=cred, config_path=cfg)

        ds = OssIterableDataset.from_prefix(base, endpoint=ep, **kw)
        assert ds.prefetch == 3 and ds.prefetch_worker == 5, (ds.prefetch, ds.prefetch_worker)
        got = [(o.key, o.size, o.read()) for o in ds]
        assert got == [(k, len(v), v) for k, v in sorted(data.items())], [g[:2] for g in got]
        ds = OssIterableDataset.from_objects(base + "b.bin", ep, transform=lambda o: o.read(), **kw)
        assert list(ds) == [data[base + "b.bin"]]
        ds = OssIterableDataset.from_manifest_file("oss://{bucket}/lists/train.tsv", imagenet_manifest_parser, base,
                                                   ep, transform=lambda o: (o.key, o.label), **kw)
        assert list(ds) == [(base + "a.bin", "cat"), (base + "b.bin", "dog"), (base + "c.bin", "")]
        import torch
        ds = OssIterableDataset.from_prefix(base, ep, transform=lambda o: (o.key, o.read()), **kw)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)  # sharded over the workers
        assert sorted(tuple(item) for item in loader) == sorted(data.items())

        m = OssMapDataset.from_objects([base + "a.bin", base + "c.bin"], ep, **kw)
        assert len(m) == 2
        o = m[1]
        body = data[base + "c.bin"]
        assert (o.key, o.size, o.label) == (base + "c.bin", len(body), "")
        assert o.read(10) == body[:10] and o.tell() == 10 and o.read() == body[10:] and o.read() == b""
        assert o.seek(-4, io.SEEK_END) == len(body) - 4 and o.read() == body[-4:]
        o.seek(0)
        buf = bytearray(7)
        assert o.readinto(buf) == 7 and bytes(buf) == body[:7]
        assert o.copy().read() == body
        with m[0] as first:
            assert first.read() == data[base + "a.bin"]
        m = OssMapDataset.from_manifest_file({local_manifest!r}, imagenet_manifest_parser, base, ep,
                                             transform=lambda o: (o.label, o.read()), **kw)
        assert m[0] == ("bird", body)
        m = OssMapDataset.from_manifest_file({local_manifest!r}, imagenet_manifest_parser, base, ep, **kw)
        copy = pickle.loads(pickle.dumps(m))  # what a spawned DataLoader worker gets
        assert (copy[0].label, copy[0].read()) == ("bird", body)
        m = OssMapDataset.from_prefix(base, ep, **kw)
        assert [x.key for x in m] == sorted(data)

        ck = OssCheckpoint(endpoint=ep, **kw)
        assert (ck.prefetch_concurrency, ck.prefetch_worker, ck.upload_concurrency) == (24, 4, 64)
        blob = os.urandom(300_000)
        with ck.writer("oss://{bucket}/ck/blob") as w:
            w.write(blob)
        with ck.reader("oss://{bucket}/ck/blob") as r:
            assert r.read() == blob and r.key == "oss://{bucket}/ck/blob" and r.size == len(blob)
        try:
            with ck.writer("oss://{bucket}/ck/never") as w:
                w.write(b"half")
                raise KeyError("the step failed")
        except KeyError:
            pass
        try:
            ck.reader("oss://{bucket}/ck/never")
            raise AssertionError("a failed writer published its object")
        except errors.NotFoundError:
            pass

        # One origin per process: another endpoint or credentials file is refused, naming it.
        for bad in (dict(endpoint="http://127.0.0.1:9"), dict(endpoint=ep, cred_path={other_cred!r})):
            try:
                OssMapDataset.from_objects(base + "a.bin", **dict(dict(kw, endpoint=ep), **bad))
                raise AssertionError(f"{{bad}} was accepted")
            except errors.ConfigError as e:
                assert "already reads with" in str(e) and ("endpoint" in str(e) or "cred_path" in str(e)), e
        try:
            OssCheckpoint(endpoint="")
            raise AssertionError("an empty endpoint was accepted")
        except errors.BadRequestError as e:
            assert "endpoint must be non-empty" in str(e)
        print("OK")
    """)
    assert "OK" in run_child(node, code).stdout
    assert set(node.relay.stats()["signers"]) == {"oss-key-1"}
    with open(cfg["logPath"]) as f:
        log = f.read()
    assert "OssIterableDataset from_prefix" in log and "OssCheckpoint read" in log, log
    assert "OssMapDataset item" not in log, "logLevel 1 (INFO) wrote DEBUG lines"


@pytest.mark.parametrize("other", ["endpoint", "cred_path"])
def test_endpoint_and_cred_path_name_the_origin_in_every_mode(node, other):
    """Embedded (and origin) mode: the in-process engine is started with endpoint= and cred_path=;
    proxy mode: the fleet holds the origin client, and a dataset asking for another endpoint or
    credentials file than the fleet's is an error saying how to start the fleet."""
    endpoint, cred = node.endpoint, node.cred
    if other == "endpoint":
        endpoint = "http://127.0.0.1:9"
    else:
        cred = os.path.join(node.dir, "other-credentials")
        credentials(cred, "oss-key-8", stamp(3600))
    code = textwrap.dedent(f"""
        import os
        import memarts
        from memarts import errors
        from memarts.torch import OssMapDataset
        try:
            ds = OssMapDataset.from_objects("oss://b/k", {endpoint!r}, cred_path={cred!r})
        except errors.ConfigError as e:
            print("REFUSED", e)
        else:
            assert os.environ["AWS_ENDPOINT_URL"] == {endpoint!r} == ds.endpoint
            assert os.environ["MEMARTS_CREDENTIALS_FILE"] == {cred!r}
            print("MODE", memarts.file.mode())
    """)
    out = run_child(node, code).stdout
    if node.mode == "embedded":
        assert "MODE embedded" in out, out
    elif other == "endpoint":
        assert "REFUSED endpoint='http://127.0.0.1:9': the memarts fleet in" in out, out
        assert "start it with AWS_ENDPOINT_URL=http://127.0.0.1:9" in out, out
    else:
        assert f"REFUSED cred_path={cred!r}: the memarts fleet in" in out, out
        assert f"started with the credentials file {node.cred}" in out, out
        assert f"start it with MEMARTS_CREDENTIALS_FILE={cred}" in out, out


def test_an_expired_credentials_file_is_read_again_until_renewed(s3, bucket, node):
    """A file whose Expiration is past when the dataset is built is re-read until its renewer
    rewrites it; later renewals are picked up mid-run, without a restart (the relay sees which key
    signed each request)."""
    for i in range(3):
        s3.put_object(Bucket=bucket, Key=f"early/{i}", Body=pattern(1800 + i, 2000))
        s3.put_object(Bucket=bucket, Key=f"late/{i}", Body=pattern(1900 + i, 2000))
    credentials(node.cred, "oss-key-0", "2024-08-20T00:00:00Z")  # the document's example: long past
    code = textwrap.dedent(f"""
        import json, threading, time, datetime
        from memarts.torch import OssMapDataset
        cred = {node.cred!r}
        def write(key, seconds):
            when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)
            doc = {{"AccessKeyId": key, "AccessKeySecret": "s", "SecurityToken": "t",
                    "Expiration": when.strftime("%Y-%m-%dT%H:%M:%SZ")}}
            with open(cred + ".tmp", "w") as f:
                json.dump(doc, f)
            import os
            os.replace(cred + ".tmp", cred)
        renewer = threading.Timer(1.5, write, ("oss-key-2", 3600))
        renewer.start()
        start = time.monotonic()
        ds = OssMapDataset.from_prefix("oss://{bucket}/early/", {node.endpoint!r}, cred_path=cred,
                                       transform=lambda o: o.read())
        waited = time.monotonic() - start
        assert waited >= 1.0, waited
        assert [len(x) for x in ds] == [2000] * 3
        write("oss-key-3", 3600)   # the next renewal
        time.sleep(2.5)            # each engine looks at the file once a second
        late = OssMapDataset.from_prefix("oss://{bucket}/late/", {node.endpoint!r}, cred_path=cred,
                                         transform=lambda o: o.read())
        assert [len(x) for x in late] == [2000] * 3
        print("WAITED", round(waited, 1))
    """)
    run_child(node, code)
    signers = node.relay.stats()["signers"]
    assert "oss-key-0" not in signers, signers
    assert signers.get("oss-key-3"), signers
    if node.mode == "embedded":  # the engine started once the file was renewed (a fleet may still use key 1)
        assert signers.get("oss-key-2"), signers


# --- the files' formats and the names, in this process (no origin involved) ----------------------

def test_config_json_defaults_and_errors_naming_the_field():
    assert parse_config("{}") == OssConfig(source="config.json")
    cfg = parse_config(json.dumps({"logLevel": 0, "datasetConfig": {"prefetchConcurrency": 3}}), "/etc/c/config.json")
    assert cfg.python_log_level == 10 and cfg.dataset.prefetch_concurrency == 3 and cfg.dataset.prefetch_worker == 2
    assert (cfg.checkpoint.prefetch_concurrency, cfg.checkpoint.prefetch_worker, cfg.checkpoint.upload_concurrency) \
        == (24, 4, 64)
    assert (cfg.log_path, cfg.audit_path) == ("/var/log/oss-connector/connector.log", "/var/log/oss-connector/audit.log")
    bad = [
        ({"datasetConfig": {"prefetchConcurrency": "x"}},
         "config.json: datasetConfig.prefetchConcurrency must be an integer >= 1, got 'x'"),
        ({"datasetConfig": {"prefetchWorker": 0}}, "datasetConfig.prefetchWorker must be an integer >= 1, got 0"),
        ({"checkpointConfig": {"uploadConcurrency": True}}, "checkpointConfig.uploadConcurrency must be an integer"),
        ({"checkpointConfig": {"prefetchConcurrency": 2.5}}, "checkpointConfig.prefetchConcurrency must be"),
        ({"checkpointConfig": {"prefetchWorker": -1}}, "checkpointConfig.prefetchWorker must be"),
        ({"checkpointConfig": []}, "checkpointConfig must be an object"),
        ({"logLevel": 4}, "logLevel must be 0 (DEBUG), 1 (INFO), 2 (WARN) or 3 (ERROR), got 4"),
        ({"logLevel": "1"}, "logLevel must be"),
        ({"logPath": ""}, "logPath must be a non-empty path"),
        ({"auditPath": 3}, "auditPath must be a non-empty path, got 3"),
    ]
    for doc, message in bad:
        with pytest.raises(OssConfigError) as e:
            parse_config(json.dumps(doc))
        assert message in str(e.value), (doc, str(e.value))
        assert isinstance(e.value, errors.ConfigError) and isinstance(e.value, ValueError)
    with pytest.raises(OssConfigError, match="config.json: not valid JSON"):
        parse_config('{"logLevel": 1,')
    with pytest.raises(OssConfigError, match="must be a JSON object"):
        parse_config("[1]")
    with pytest.warns(RuntimeWarning, match="does not define: extra, datasetConfig.prefetchThreads$"):
        assert parse_config('{"extra": 1, "datasetConfig": {"prefetchThreads": 2}}').dataset.prefetch_worker == 2


def test_credentials_file_fields_and_errors_naming_them():
    creds = parse_credentials(json.dumps({"AccessKeyId": "ak", "AccessKeySecret": SECRET}), "/c")
    assert (creds.security_token, creds.expiration) == ("", None) and not creds.expires_within(10**9)
    creds = parse_credentials(json.dumps({"AccessKeyId": "ak", "AccessKeySecret": SECRET, "SecurityToken": TOKEN,
                                          "Expiration": "2024-08-20T00:00:00Z"}), "/c")
    assert creds.expiration == datetime.datetime(2024, 8, 20, tzinfo=datetime.timezone.utc)
    assert creds.expires_within(0) and SECRET not in repr(creds) and TOKEN not in repr(creds)
    good = {"AccessKeyId": "ak", "AccessKeySecret": SECRET, "SecurityToken": TOKEN}
    bad = [
        ({"AccessKeySecret": SECRET}, "AccessKeyId is missing"),
        ({"AccessKeyId": "ak"}, "AccessKeySecret is missing"),
        (dict(good, AccessKeyId=""), "AccessKeyId must be a non-empty string"),
        (dict(good, AccessKeySecret=7), "AccessKeySecret must be a non-empty string, got a value of type int"),
        (dict(good, SecurityToken=["x"]), "SecurityToken must be a non-empty string"),
        (dict(good, Expiration="tomorrow"), "Expiration must be an RFC 3339 time"),
        (dict(good, Expiration="2024-08-20T00:00:00"), "Expiration must say its time zone"),
        (dict(good, Expiration=1724112000), "Expiration must be an RFC 3339 time"),
    ]
    for doc, message in bad:
        with pytest.raises(CredentialsFileError) as e:
            parse_credentials(json.dumps(doc), "/run/creds.json")
        assert "credentials file /run/creds.json: " + message in str(e.value), str(e.value)
        assert SECRET not in str(e.value) and TOKEN not in str(e.value)
        assert isinstance(e.value, errors.ConfigError)
    with pytest.raises(CredentialsFileError, match="not valid JSON") as e:
        parse_credentials('{"AccessKeyId": "ak", "AccessKeySecret": "' + SECRET, "/c")
    assert SECRET not in str(e.value)


def test_a_credentials_file_never_renewed_is_an_error_naming_its_expiration(tmp_path):
    from memarts.oss import CredentialsExpiredError

    path = str(tmp_path / "credentials")
    credentials(path, "ak", "2024-08-20T00:00:00Z")
    with pytest.raises(CredentialsExpiredError) as e:
        load_valid_credentials(path, wait=0.3)
    assert f"credentials file {path}: Expiration 2024-08-20T00:00:00Z is past" in str(e.value)
    assert isinstance(e.value, errors.PermissionDeniedError) and SECRET not in str(e.value)
    credentials(path, "ak", stamp(60))
    assert load_valid_credentials(path, wait=0).access_key_id == "ak"


def test_a_malformed_config_or_credentials_file_fails_the_constructor(tmp_path):
    """Before anything changes in the process (no origin is touched: the errors come first)."""
    from memarts.torch import OssCheckpoint, OssMapDataset

    config = tmp_path / "config.json"
    config.write_text('{"checkpointConfig": {"uploadConcurrency": "many"}}')
    before = dict(os.environ)
    with pytest.raises(OssConfigError, match="checkpointConfig.uploadConcurrency must be an integer >= 1, got 'many'"):
        OssCheckpoint(endpoint="http://127.0.0.1:9", config_path=str(config))
    cred = tmp_path / "credentials"
    cred.write_text('{"AccessKeyId": "ak"}')
    with pytest.raises(CredentialsFileError, match="AccessKeySecret is missing"):
        OssMapDataset.from_objects("oss://b/k", "http://127.0.0.1:9", cred_path=str(cred))
    with pytest.raises(OssConfigError, match="cannot read"):
        OssMapDataset.from_objects("oss://b/k", "http://127.0.0.1:9", config_path=str(tmp_path / "missing.json"))
    assert dict(os.environ) == before


def test_the_audit_log_keeps_only_the_slow_requests(tmp_path):
    audit = AuditLog(str(tmp_path / "a" / "audit.log"))
    audit.record("read", "oss://b/fast", 10, 99.9)
    audit.record("read", "oss://b/slow key\twith tab", 10, 100.1)
    with pytest.raises(KeyError):
        with audit.timed("checkpoint_write", "oss://b/ck") as t:
            t.bytes = 5
            import time

            time.sleep(0.12)
            raise KeyError("x")
    again = pickle.loads(pickle.dumps(audit))  # a DataLoader worker's copy appends to the same file
    again.record("list", "oss://b/", 0, 250)
    lines = audit_lines(audit.path)
    assert [(x["op"], x["key"], x["outcome"]) for x in lines] == [
        ("read", "oss://b/slow key\twith tab", "ok"), ("checkpoint_write", "oss://b/ck", "KeyError"),
        ("list", "oss://b/", "ok")]
    assert lines[1]["bytes"] == 5 and lines[1]["ms"] >= 120 and lines[0]["time"].endswith("Z")


def test_the_connector_names_and_arguments_exist():
    """Every public name and argument the connector document and its API use."""
    import memarts.torch as mt
    from memarts import oss

    for name in ("OssMapDataset", "OssIterableDataset", "OssCheckpoint", "imagenet_manifest_parser"):
        assert getattr(mt, name) is getattr(oss, name)
    common = ["endpoint", "cred_path", "config_path", "transform"]
    for cls in (mt.OssMapDataset, mt.OssIterableDataset):
        assert issubclass(cls, (mt.MapDataset, mt.IterableDataset))
        for method, first in (("from_prefix", ["oss_uri"]), ("from_objects", ["object_uris"]),
                              ("from_manifest_file", ["manifest_file_path", "manifest_parser", "oss_base_uri"])):
            params = inspect.signature(getattr(cls, method)).parameters
            assert list(params) == first + common, (cls, method, list(params))
            assert params["cred_path"].default == "" and params["config_path"].default == ""
            assert params["cred_path"].kind is inspect.Parameter.KEYWORD_ONLY
            assert params["transform"].default is oss.identity
    params = inspect.signature(mt.OssCheckpoint).parameters
    assert list(params) == ["endpoint", "cred_path", "config_path"]
    assert params["cred_path"].default == "" and params["config_path"].default == ""
    assert issubclass(mt.OssCheckpoint, mt.Checkpoint)
    assert list(inspect.signature(mt.OssCheckpoint.reader).parameters) == ["self", "oss_uri"]
    assert list(inspect.signature(mt.OssCheckpoint.writer).parameters) == ["self", "oss_uri"]
    parsed = list(mt.imagenet_manifest_parser(io.BytesIO(b"a.jpg\t3\r\n\nb.jpg\n")))
    assert parsed == [("a.jpg", "3"), ("b.jpg", "")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile(edited_seed(endpoint="http://e", data_uri="oss://b/d/", checkpoint_uri="oss://b/c",
                            cred_path="/c"), "seed", "exec")


def test_log_level_and_path_configure_the_memarts_logger(tmp_path):
    import logging

    from memarts import _oss_connector as oss

    logger = logging.getLogger("memarts")
    level, handlers = logger.level, list(logger.handlers)
    try:
        for value, wanted in ((0, ["DEBUG d", "INFO i", "WARNING w"]), (2, ["WARNING w"])):
            path = tmp_path / f"level-{value}" / "connector.log"
            oss._configure_logging(parse_config(json.dumps({"logLevel": value, "logPath": str(path)})))
            logger.debug("d")
            logger.info("i")
            logger.warning("w")
            logger.removeHandler(oss._configured_logs.pop(str(path)))
            logger.setLevel(level)
            lines = path.read_text().splitlines()
            assert [f"{line.split()[2]} {line.split()[-1]}" for line in lines] == wanted, lines
        with pytest.raises(OssConfigError, match="logPath /proc/no/connector.log cannot be opened"):
            oss._configure_logging(parse_config(json.dumps({"logPath": "/proc/no/connector.log"})))
    finally:
        logger.setLevel(level)
        logger.handlers[:] = handlers
