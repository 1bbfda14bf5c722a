"""The MoXing file API against a real fleet and a real S3-protocol server."""

import io
import os

import pytest

import memarts as mox
from memarts import errors
from conftest import pattern

CS = 64 << 10


def test_read_text_binary_and_every_cloud_scheme(s3, bucket):
    s3.put_object(Bucket=bucket, Key="t.txt", Body="héllo, memarts\n".encode())
    big = pattern(1, 5 * CS + 17)
    s3.put_object(Bucket=bucket, Key="d/big.bin", Body=big)
    assert mox.file.read(f"obs://{bucket}/t.txt") == "héllo, memarts\n"
    assert mox.file.read(f"s3://{bucket}/t.txt", binary=True) == "héllo, memarts\n".encode()
    assert mox.file.read(f"oss://{bucket}/d/big.bin", binary=True) == big
    assert mox.file.read_meta_free(f"obs://{bucket}/d/big.bin", binary=True) == big
    assert mox.file.read_meta_free(f"obs://{bucket}/t.txt") == "héllo, memarts\n"
    assert isinstance(mox.file.read(f"obs://{bucket}/d/big.bin", binary=True), bytes)
    s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    assert mox.file.read(f"obs://{bucket}/empty", binary=True) == b""


def test_second_read_is_a_cache_hit(s3, bucket, fleet):
    data = pattern(2, 3 * CS)
    s3.put_object(Bucket=bucket, Key="hot", Body=data)
    cached = fleet.total("cached_chunks")
    assert mox.file.read(f"obs://{bucket}/hot", binary=True) == data
    fleet.wait_cached(cached + 3)
    hits = fleet.total("hits")
    assert mox.file.read(f"obs://{bucket}/hot", binary=True) == data
    assert fleet.total("hits") == hits + 3


def test_metadata_functions(s3, bucket):
    for key in ["ds/a.jpg", "ds/b.jpg", "ds/sub/c.jpg", "ds/sub/deeper/d.jpg"]:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    root = f"obs://{bucket}/ds"
    assert mox.file.exists(f"{root}/a.jpg")
    assert mox.file.exists(root) and mox.file.exists(f"{root}/sub")
    assert not mox.file.exists(f"{root}/nope.jpg")
    assert mox.file.get_size(f"{root}/sub/c.jpg") == len("ds/sub/c.jpg")
    assert mox.file.is_directory(root) and mox.file.is_directory(f"{root}/sub/")
    assert not mox.file.is_directory(f"{root}/a.jpg")
    assert mox.file.list_directory(root) == ["a.jpg", "b.jpg", "sub"]
    assert mox.file.list_directory(root, recursive=True) == ["a.jpg", "b.jpg", "sub/c.jpg", "sub/deeper/d.jpg"]
    walked = list(mox.file.walk(root))
    assert walked == [
        (root, ["sub"], ["a.jpg", "b.jpg"]),
        (f"{root}/sub", ["deeper"], ["c.jpg"]),
        (f"{root}/sub/deeper", [], ["d.jpg"]),
    ]


def test_local_paths_work_everywhere(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"local bytes")
    for path in (str(p), f"file://{p}"):
        assert mox.file.read(path, binary=True) == b"local bytes"
        assert mox.file.exists(path) and mox.file.get_size(path) == 11
    with mox.file.File(str(tmp_path / "w.txt"), "w") as f:
        f.write("written")
    assert mox.file.read(str(tmp_path / "w.txt")) == "written"
    mox.file.copy(str(p), str(tmp_path / "copy" / "y.bin"))
    assert (tmp_path / "copy" / "y.bin").read_bytes() == b"local bytes"
    assert mox.file.list_directory(str(tmp_path)) == ["copy", "w.txt", "x.bin"]


def test_copy_and_copy_parallel(s3, bucket, tmp_path):
    files = {f"tree/{i:03d}.bin": pattern(100 + i, 1000 + 997 * i) for i in range(40)}
    files["tree/sub/z.bin"] = pattern(99, CS + 1)
    for key, data in files.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    mox.file.copy(f"obs://{bucket}/tree/sub/z.bin", str(tmp_path / "one" / "z.bin"))
    assert (tmp_path / "one" / "z.bin").read_bytes() == files["tree/sub/z.bin"]
    mox.file.copy_parallel(f"obs://{bucket}/tree", str(tmp_path / "all"))
    for key, data in files.items():
        assert (tmp_path / "all" / key[len("tree/"):]).read_bytes() == data
    assert not [n for n in os.listdir(tmp_path / "all") if n.endswith(".tmp")]


def test_copy_parallel_reports_progress_on_a_terminal_only(s3, bucket, tmp_path, monkeypatch, capfd):
    import sys

    for i in range(30):
        s3.put_object(Bucket=bucket, Key=f"prog/{i:02d}.bin", Body=pattern(300 + i, 10_000))
    mox.file.copy_parallel(f"obs://{bucket}/prog", str(tmp_path / "quiet"))
    assert "ETA" not in capfd.readouterr().err, "progress drawn into a pipe"
    master, slave = os.openpty()
    terminal = os.fdopen(slave, "w")
    monkeypatch.setattr(sys, "stderr", terminal)
    try:
        mox.file.copy_parallel(f"obs://{bucket}/prog", str(tmp_path / "shown"), threads=4)
    finally:
        monkeypatch.undo()
        terminal.close()
    os.set_blocking(master, False)
    drawn = b""
    while True:
        try:
            piece = os.read(master, 65536)
        except (BlockingIOError, OSError):
            break
        if not piece:
            break
        drawn += piece
    os.close(master)
    # The terminal shows "\r\n" for the closing "\n".
    lines = [line for line in drawn.decode().replace("\x1b[K", "").replace("\n", "").split("\r") if line]
    assert lines and "copy_parallel: 30/30 files, 293.0 KiB/293.0 KiB" in lines[-1], drawn
    assert "/s, ETA 0:00:0" in lines[-1], drawn
    assert len(os.listdir(tmp_path / "shown")) == 30


def test_file_objects_read_seek_readline_iterate_readinto(s3, bucket):
    lines = [f"line {i} {'x' * (i * 37 % 500)}\n" for i in range(2000)]
    text = "".join(lines)
    s3.put_object(Bucket=bucket, Key="lines.txt", Body=text.encode())
    url = f"obs://{bucket}/lines.txt"
    with mox.file.File(url, "r") as f:
        assert f.read() == text
    with mox.file.File(url, "r") as f:
        assert f.readline() == lines[0]
        assert list(f) == lines[1:]
    with mox.file.File(url, "rb") as f:
        f.seek(1000)
        assert f.tell() == 1000
        assert f.read(10) == text.encode()[1000:1010]
        f.seek(-5, io.SEEK_END)
        assert f.read() == text.encode()[-5:]
        f.seek(CS - 3)
        buf = bytearray(7)
        assert f.readinto(buf) == 7
        assert bytes(buf) == text.encode()[CS - 3 : CS + 4]


def test_errors_are_typed(s3, bucket):
    with pytest.raises(FileNotFoundError):
        mox.file.read(f"obs://{bucket}/missing")
    with pytest.raises(errors.NotFoundError):
        mox.file.get_size(f"obs://{bucket}/missing")
    with pytest.raises(FileNotFoundError):
        mox.file.read_meta_free(f"obs://{bucket}/never-written", binary=True, memarts_only=True)
    with pytest.raises(errors.BadRequestError):
        mox.file.read("ftp://host/x")
    assert issubclass(errors.NotFoundError, errors.Error)


def test_writes_reach_the_origin_and_are_read_back(s3, bucket, tmp_path):
    url = f"obs://{bucket}/w/model.bin"
    big = pattern(77, (20 << 20) + 123)  # several 8 MiB parts
    with mox.file.File(url, "wb") as f:
        f.write(big[: 5 << 20])
        f.write(big[5 << 20 :])
    assert s3.get_object(Bucket=bucket, Key="w/model.bin")["Body"].read() == big
    assert mox.file.read(url, binary=True) == big
    with mox.file.File(f"obs://{bucket}/w/notes.txt", "w") as f:
        f.write("line 1\n")
        f.write("line 2\n")
    assert mox.file.read(f"obs://{bucket}/w/notes.txt") == "line 1\nline 2\n"
    # Overwrite: the next read sees the new version at once.
    with mox.file.File(f"obs://{bucket}/w/notes.txt", "w") as f:
        f.write("v2")
    assert mox.file.read(f"obs://{bucket}/w/notes.txt") == "v2"
    # copy: local to object, object to object; an empty object.
    local = tmp_path / "src.bin"
    local.write_bytes(pattern(78, 100_000))
    mox.file.copy(str(local), f"obs://{bucket}/w/copied.bin")
    mox.file.copy(f"obs://{bucket}/w/copied.bin", f"oss://{bucket}/w/copied2.bin")
    assert mox.file.read(f"obs://{bucket}/w/copied2.bin", binary=True) == local.read_bytes()
    with mox.file.File(f"obs://{bucket}/w/empty", "wb"):
        pass
    assert mox.file.exists(f"obs://{bucket}/w/empty") and mox.file.get_size(f"obs://{bucket}/w/empty") == 0


def test_a_write_that_fails_midway_publishes_nothing(bucket):
    url = f"obs://{bucket}/w/partial.bin"
    with pytest.raises(RuntimeError):
        with mox.file.File(url, "wb") as f:
            f.write(b"half of it")
            raise RuntimeError("the training step crashed")
    assert not mox.file.exists(url)


def test_remove_and_make_dirs(s3, bucket, tmp_path):
    for key in ["r/a", "r/sub/b", "r/sub/c", "keep/x"]:
        s3.put_object(Bucket=bucket, Key=key, Body=b"data")
    url = f"obs://{bucket}/r/a"
    assert mox.file.read(url) == "data"  # cached metadata and chunks
    mox.file.remove(url)
    assert not mox.file.exists(url)
    with pytest.raises(FileNotFoundError):
        mox.file.read(url)
    with pytest.raises(FileNotFoundError):
        mox.file.remove(url)
    mox.file.remove(f"obs://{bucket}/r", recursive=True)
    assert not mox.file.exists(f"obs://{bucket}/r")
    assert mox.file.exists(f"obs://{bucket}/keep/x")
    mox.file.make_dirs(f"obs://{bucket}/new/dir")  # nothing to create in an object store
    mox.file.make_dirs(str(tmp_path / "a" / "b"))
    assert (tmp_path / "a" / "b").is_dir()
    (tmp_path / "a" / "b" / "f").write_text("x")
    mox.file.remove(str(tmp_path / "a"), recursive=True)
    assert not (tmp_path / "a").exists()
