"""``memarts.fsspec`` with fsspec, pandas and pyarrow, against a real S3-protocol server and real
memarts (a fleet, or the embedded engine): bytes, counters and errors, asserted exactly."""

import io
import os
import subprocess
import sys

import fsspec
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from fsspec.registry import _registry
from pyarrow.fs import FSSpecHandler, PyFileSystem

from conftest import assert_reads_ahead, pattern
import memarts as mox
from memarts import errors
from memarts.fsspec import ROUTABLE, MemartsFileSystem, route

CS = 64 << 10


def frame(seed, rows):
    return pd.DataFrame(
        {
            "id": range(seed * rows, (seed + 1) * rows),
            "x": [((i * 7919) % 1000) / 7 for i in range(rows)],
            "label": [f"item-{seed}-{i}" for i in range(rows)],
        }
    )


def parquet_bytes(df):
    out = io.BytesIO()
    df.to_parquet(out, index=False)
    return out.getvalue()


@pytest.fixture
def fs(fleet):
    return MemartsFileSystem()


@pytest.fixture
def restore_registry():
    """Puts back what fsspec had for the routable protocols, so routing stays within the test."""
    saved = {p: _registry.get(p) for p in ROUTABLE}
    yield
    for p, cls in saved.items():
        if cls is None:
            _registry.pop(p, None)
        else:
            fsspec.register_implementation(p, cls, clobber=True)


def test_the_entry_point_registers_memarts_and_open_reads_bytes_exact(s3, bucket):
    assert fsspec.get_filesystem_class("memarts") is MemartsFileSystem
    big, small = pattern(1, 5 * CS + 17), b"hello, fsspec\n"
    s3.put_object(Bucket=bucket, Key="d/big.bin", Body=big)
    s3.put_object(Bucket=bucket, Key="d/small.txt", Body=small)
    s3.put_object(Bucket=bucket, Key="d/empty", Body=b"")
    with fsspec.open(f"memarts://{bucket}/d/big.bin") as f:
        assert f.read() == big
    with fsspec.open(f"memarts://{bucket}/d/small.txt", "rt") as f:
        assert f.read() == small.decode()
    with fsspec.open(f"memarts://{bucket}/d/empty") as f:
        assert f.read() == b""
    fs = MemartsFileSystem()
    # obs://, oss:// and s3:// name the same object as memarts://.
    for scheme in ("obs", "oss", "s3", "memarts"):
        assert fs.cat_file(f"{scheme}://{bucket}/d/big.bin") == big


def test_seeks_and_ranges_are_byte_exact(s3, bucket, fs):
    data = pattern(2, 9 * CS + 123)
    s3.put_object(Bucket=bucket, Key="r.bin", Body=data)
    url = f"memarts://{bucket}/r.bin"
    with fs.open(url, "rb") as f:
        assert f.size == len(data)
        for pos, n in [(0, 10), (CS - 3, 7), (5 * CS + 1, 3 * CS), (len(data) - 5, 100), (17, 2 * CS)]:
            assert f.seek(pos) == pos
            assert f.read(n) == data[pos : pos + n], (pos, n)
            assert f.tell() == min(pos + n, len(data))
        f.seek(-10, 2)
        assert f.read() == data[-10:]
        f.seek(len(data) + 5)
        assert f.read(10) == b""
    assert fs.cat_file(url, start=CS - 1, end=2 * CS + 1) == data[CS - 1 : 2 * CS + 1]
    assert fs.cat_file(url, start=-100) == data[-100:]
    assert fs.cat_file(url, start=3, end=-3) == data[3:-3]
    assert fs.cat_file(url, start=len(data) + 1) == b""
    assert fs.read_block(url, 2 * CS, 1000) == data[2 * CS : 2 * CS + 1000]


def test_a_small_range_of_a_large_object_reads_only_its_chunks_then_hits(s3, bucket, fs, fleet):
    data = pattern(3, 64 * CS)
    s3.put_object(Bucket=bucket, Key="large.bin", Body=data)
    url = f"memarts://{bucket}/large.bin"
    pos = 10 * CS + 5
    # A read that does not follow another gets no read-ahead: chunk 10 alone, of 64.
    want = 1
    cached, misses, hits = fleet.total("cached_chunks"), fleet.total("misses"), fleet.total("hits")
    origin_bytes = fleet.total("bytes_from_origin")
    with fs.open(url, "rb") as f:
        f.seek(pos)
        assert f.read(100) == data[pos : pos + 100]
    assert fleet.total("misses") - misses == want
    assert fleet.total("bytes_from_origin") - origin_bytes == want * CS
    assert fleet.total("hits") == hits
    fleet.wait_cached(cached + want)
    with fs.open(url, "rb") as f:
        f.seek(pos)
        assert f.read(100) == data[pos : pos + 100]
    assert fleet.total("hits") - hits == want, "the second read of the range is served from the cache"
    assert fleet.total("misses") - misses == want
    assert fleet.total("bytes_from_origin") - origin_bytes == want * CS
    # cat_file of a range reads exactly the chunks under it (12 and 13, then 30).
    assert fs.cat_file(url, start=13 * CS - 10, end=13 * CS + 10) == data[13 * CS - 10 : 13 * CS + 10]
    assert fs.cat_file(url, start=30 * CS + 1, end=30 * CS + 2) == data[30 * CS + 1 : 30 * CS + 2]
    assert fleet.total("misses") - misses == want + 3
    assert fleet.total("bytes_from_origin") - origin_bytes == (want + 3) * CS


def test_a_file_read_in_order_reads_ahead(s3, bucket, fs, fleet):
    data = pattern(4, 64 * CS)
    s3.put_object(Bucket=bucket, Key="seq.bin", Body=data)
    misses = fleet.total("misses")
    with fs.open(f"memarts://{bucket}/seq.bin", "rb") as f:
        # The read-ahead of mox.file's File (and of the mount), not an fsspec cache's.
        assert_reads_ahead(fleet, f, data, CS, misses)


def test_pandas_reads_parquet_and_csv_and_writes_them(s3, bucket):
    df = frame(0, 20_000)
    blob = parquet_bytes(df)
    assert len(blob) > 3 * CS, "the file spans several chunks"
    s3.put_object(Bucket=bucket, Key="t/a.parquet", Body=blob)
    s3.put_object(Bucket=bucket, Key="t/a.csv", Body=df.to_csv(index=False).encode())
    pd.testing.assert_frame_equal(pd.read_parquet(f"memarts://{bucket}/t/a.parquet"), df)
    pd.testing.assert_frame_equal(pd.read_parquet(f"memarts://{bucket}/t/a.parquet", columns=["label"]), df[["label"]])
    pd.testing.assert_frame_equal(pd.read_csv(f"memarts://{bucket}/t/a.csv"), df)
    df.to_parquet(f"memarts://{bucket}/out/b.parquet", index=False)
    df.to_csv(f"memarts://{bucket}/out/b.csv", index=False)
    written = s3.get_object(Bucket=bucket, Key="out/b.parquet")["Body"].read()
    pd.testing.assert_frame_equal(pd.read_parquet(io.BytesIO(written)), df)
    assert s3.get_object(Bucket=bucket, Key="out/b.csv")["Body"].read() == df.to_csv(index=False).encode()


def test_pyarrow_dataset_reads_every_file_below_a_prefix(s3, bucket, fs):
    parts = [frame(i, 3000 + 500 * i) for i in range(4)]
    keys = ["ds/part-0.parquet", "ds/part-1.parquet", "ds/sub/part-2.parquet", "ds/sub/deeper/part-3.parquet"]
    for key, df in zip(keys, parts):
        s3.put_object(Bucket=bucket, Key=key, Body=parquet_bytes(df))
    want = pa.Table.from_pandas(pd.concat(parts, ignore_index=True), preserve_index=False)
    for filesystem in (fs, PyFileSystem(FSSpecHandler(fs))):
        dataset = ds.dataset(f"{bucket}/ds", filesystem=filesystem, format="parquet")
        assert sorted(dataset.files) == sorted(f"{bucket}/{k}" for k in keys)
        assert dataset.to_table().sort_by("id").equals(want)
    table = pq.read_table(f"{bucket}/ds/sub/part-2.parquet", filesystem=fs)
    assert table.equals(pa.Table.from_pandas(parts[2], preserve_index=False))


def test_listing_info_and_missing_objects(s3, bucket, fs):
    for key in ["m/a.bin", "m/b.bin", "m/sub/c.bin", "m/sub/deeper/d.bin"]:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    root = f"{bucket}/m"
    assert fs.ls(root, detail=False) == [f"{root}/a.bin", f"{root}/b.bin", f"{root}/sub"]
    assert fs.ls(f"memarts://{root}/sub", detail=True) == [
        {"name": f"{root}/sub/c.bin", "size": len("m/sub/c.bin"), "type": "file"},
        {"name": f"{root}/sub/deeper", "size": 0, "type": "directory"},
    ]
    assert fs.ls(f"{root}/a.bin", detail=False) == [f"{root}/a.bin"], "a file lists as itself"
    info = fs.info(f"{root}/a.bin")
    head = s3.head_object(Bucket=bucket, Key="m/a.bin")
    assert (info["name"], info["size"], info["type"]) == (f"{root}/a.bin", 7, "file")
    assert info["etag"].strip('"') == head["ETag"].strip('"')
    assert abs(fs.modified(f"{root}/a.bin").timestamp() - head["LastModified"].timestamp()) < 1
    assert fs.info(f"{root}/sub/") == {"name": f"{root}/sub", "size": 0, "type": "directory"}
    assert fs.info(bucket)["type"] == "directory"
    assert fs.isdir(root) and fs.isdir(bucket) and not fs.isdir(f"{root}/a.bin")
    assert fs.isfile(f"{root}/a.bin") and not fs.isfile(root)
    assert fs.exists(f"{root}/sub") and not fs.exists(f"{root}/nope")
    assert fs.find(root) == [f"{root}/{k}" for k in ["a.bin", "b.bin", "sub/c.bin", "sub/deeper/d.bin"]]
    assert sorted(fs.find(root, withdirs=True)) == sorted(
        [root, f"{root}/sub", f"{root}/sub/deeper"] + fs.find(root)
    )
    assert fs.find(root, maxdepth=1) == [f"{root}/a.bin", f"{root}/b.bin"]
    assert fs.glob(f"{root}/**/*.bin") == fs.find(root)
    missing = f"memarts://{bucket}/m/nope.parquet"
    for call in (
        lambda: fs.info(missing),
        lambda: fs.open(missing, "rb"),
        lambda: fs.cat_file(missing),
        lambda: fs.cat_file(missing, start=1, end=2),
        lambda: fs.ls(missing),
        lambda: fsspec.open(missing).open(),
        lambda: pd.read_parquet(missing),
        lambda: pd.read_csv(missing),
    ):
        with pytest.raises(FileNotFoundError):
            call()


def _read_until_stale(f, got):
    with pytest.raises(errors.StaleError, match="changed since it was opened"):
        while True:
            piece = f.read(10_000)
            assert piece, "the file ended without meeting the replaced object"
            got += piece


def test_what_memarts_cannot_do_is_refused_with_the_reason(fs):
    with pytest.raises(ValueError, match="starts with a bucket"):
        fs.info("memarts://")
    with pytest.raises(ValueError, match="no transactions"):
        fs.open("memarts://b/k", "wb", autocommit=False)


def test_an_object_overwritten_while_open_raises_stale_never_mixes(s3, bucket, fs):
    v1, v2 = pattern(41, 200 * CS), pattern(42, 200 * CS)
    s3.put_object(Bucket=bucket, Key="o", Body=v1)
    with fs.open(f"memarts://{bucket}/o", "rb") as f:
        got = bytearray(f.read(1000))
        s3.put_object(Bucket=bucket, Key="o", Body=v2)
        # The fleet learns of the new version (as it does when its metadata TTL ends): a read that
        # asked for the object's current version now would get v2's bytes.
        mox.file._fleet().stat(f"s3://{bucket}/o", refresh=True)
        _read_until_stale(f, got)
        assert bytes(got) == v1[: len(got)], "a read returned bytes of another version"
        assert len(got) < len(v1)


def test_a_file_opened_again_after_stale_reads_the_new_version(s3, bucket, fs):
    v1, v2 = pattern(43, 50 * CS), pattern(44, 50 * CS)
    s3.put_object(Bucket=bucket, Key="o", Body=v1)
    with fs.open(f"memarts://{bucket}/o", "rb") as f:
        got = bytearray(f.read(1000))
        s3.put_object(Bucket=bucket, Key="o", Body=v2)
        _read_until_stale(f, got)
        assert bytes(got) == v1[: len(got)]
    with fs.open(f"memarts://{bucket}/o", "rb") as f:
        assert f.read() == v2, "the stale read revalidated the version the next open pins"


def test_writes_upload_at_close_and_rm_deletes(s3, bucket, fs):
    fs.pipe_file(f"memarts://{bucket}/w/piped", b"piped bytes")
    assert s3.get_object(Bucket=bucket, Key="w/piped")["Body"].read() == b"piped bytes"
    with pytest.raises(FileExistsError):
        fs.pipe_file(f"{bucket}/w/piped", b"again", mode="create")
    data = pattern(5, 3 * CS + 1)
    with fs.open(f"{bucket}/w/file", "wb") as f:
        f.write(data[:CS])
        f.write(data[CS:])
    assert s3.get_object(Bucket=bucket, Key="w/file")["Body"].read() == data
    with pytest.raises(RuntimeError):
        with fs.open(f"{bucket}/w/failed", "wb") as f:
            f.write(b"never published")
            raise RuntimeError("the writer failed")
    assert not fs.exists(f"{bucket}/w/failed")
    fs.rm(f"{bucket}/w/piped")
    assert not fs.exists(f"{bucket}/w/piped") and fs.exists(f"{bucket}/w/file")
    fs.rm(f"{bucket}/w", recursive=True)
    assert s3.list_objects_v2(Bucket=bucket, Prefix="w/")["KeyCount"] == 0


def test_route_sends_fsspec_s3_obs_oss_urls_through_memarts(s3, bucket, fleet, restore_registry):
    df = frame(7, 5000)
    s3.put_object(Bucket=bucket, Key="routed/a.csv", Body=df.to_csv(index=False).encode())
    s3.put_object(Bucket=bucket, Key="routed/a.parquet", Body=parquet_bytes(df))
    data = pattern(8, 3 * CS)
    s3.put_object(Bucket=bucket, Key="routed/x.bin", Body=data)
    assert route() == ["s3", "obs", "oss"]
    assert isinstance(fsspec.filesystem("s3"), MemartsFileSystem)
    cached, misses = fleet.total("cached_chunks"), fleet.total("misses")
    with fsspec.open(f"s3://{bucket}/routed/x.bin") as f:
        assert f.read() == data
    assert fleet.total("misses") - misses == 3, "the s3:// read went through memarts"
    fleet.wait_cached(cached + 3)
    hits = fleet.total("hits")
    for scheme in ("obs", "oss"):
        with fsspec.open(f"{scheme}://{bucket}/routed/x.bin") as f:
            assert f.read() == data
    assert fleet.total("hits") - hits == 6, "obs:// and oss:// reads went through memarts"
    requests = fleet.total("misses") + fleet.total("hits")
    pd.testing.assert_frame_equal(pd.read_csv(f"s3://{bucket}/routed/a.csv"), df)
    pd.testing.assert_frame_equal(pd.read_parquet(f"s3://{bucket}/routed/a.parquet", storage_options={}), df)
    assert fleet.total("misses") + fleet.total("hits") > requests, "pandas read through memarts"
    with pytest.raises(ValueError, match="gcs"):
        route(["gcs"])


def _python(code, **env):
    return subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )


def test_the_environment_variable_routes_where_memarts_is_imported():
    code = "import fsspec, memarts; print(sorted(p for p in %r if fsspec.registry.get(p) is not None " % (ROUTABLE,)
    code += "and fsspec.registry[p].__name__ == 'MemartsFileSystem'))"
    assert _python(code, MEMARTS_FSSPEC_ROUTE="s3,obs").stdout.strip() == "['obs', 's3']"
    assert _python(code, MEMARTS_FSSPEC_ROUTE="1").stdout.strip() == "['obs', 'oss', 's3']"
    assert _python(code, MEMARTS_FSSPEC_ROUTE="0").stdout.strip() == "[]"
    # fsspec alone imports memarts for its first memarts:// URL, which routes too.
    alone = "import fsspec; fsspec.filesystem('memarts'); print(fsspec.registry['s3'].__name__)"
    assert _python(alone, MEMARTS_FSSPEC_ROUTE="s3").stdout.strip() == "MemartsFileSystem"
    bad = _python("import memarts", MEMARTS_FSSPEC_ROUTE="gcs")
    assert bad.returncode != 0 and "MEMARTS_FSSPEC_ROUTE" in bad.stderr and "gcs" in bad.stderr


def test_memarts_imports_without_fsspec_unless_routing_asks_for_it():
    hide = "import sys; sys.modules['fsspec'] = None; import memarts, moxing; print('imported')"
    out = _python(hide, MEMARTS_FSSPEC_ROUTE="")
    assert (out.returncode, out.stdout.strip()) == (0, "imported"), out.stderr
    out = _python(hide, MEMARTS_FSSPEC_ROUTE="1")
    assert out.returncode != 0 and "pip install 'memarts[fsspec]'" in out.stderr
