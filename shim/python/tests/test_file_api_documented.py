"""Every function of MoXing's published ``mox.file`` API document, with its documented parameters,
defaults and edge cases, on objects (a real fleet or the embedded engine, over moto) and local paths."""

import os

import pytest

import moxing as mox
from memarts import errors


def _put(s3, bucket, keys):
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())


def test_read_and_copy_accept_client_id(s3, bucket, tmp_path):
    s3.put_object(Bucket=bucket, Key="a.txt", Body=b"abc")
    url = f"obs://{bucket}/a.txt"
    assert mox.file.read(url, client_id=3, binary=True) == b"abc"
    assert mox.file.read(url, None, True) == b"abc"  # the documented order: url, client_id, binary
    mox.file.copy(url, str(tmp_path / "a.txt"), client_id="x")
    assert (tmp_path / "a.txt").read_bytes() == b"abc"


def test_copy_parallel_documented_keywords(s3, bucket, tmp_path):
    _put(s3, bucket, ["ds/a", "ds/b", "ds/sub/c"])
    src = f"obs://{bucket}/ds"
    mox.file.copy_parallel(src_url=src, dst_url=str(tmp_path / "all"), threads=0, is_processing=False)
    assert sorted(mox.file.list_directory(str(tmp_path / "all"), recursive=True)) == ["a", "b", "sub/c"]
    mox.file.copy_parallel(src, str(tmp_path / "some"), file_list=["a", "sub/c"], threads=2, is_processing=True, use_queue=True)
    assert mox.file.list_directory(str(tmp_path / "some"), recursive=True) == ["a", "sub/c"]
    assert (tmp_path / "some" / "sub" / "c").read_bytes() == b"ds/sub/c"
    # Local to object, with a file list too.
    mox.file.copy_parallel(str(tmp_path / "all"), f"obs://{bucket}/up", file_list=["sub/c"])
    assert mox.file.list_directory(f"obs://{bucket}/up", recursive=True) == ["sub/c"]


def test_copy_parallel_of_a_name_that_is_file_and_directory_raises_before_copying(s3, bucket, tmp_path):
    _put(s3, bucket, ["dup/a", "dup/a/b", "dup/c"])
    with pytest.raises(mox.file.MoxFileNameDuplicateException):
        mox.file.copy_parallel(f"obs://{bucket}/dup", str(tmp_path / "d"))
    assert not (tmp_path / "d").exists()


def test_get_size_of_directories(s3, bucket, tmp_path):
    _put(s3, bucket, ["g/a", "g/sub/bb"])
    assert mox.file.get_size(f"obs://{bucket}/g/a") == 3
    assert mox.file.get_size(f"obs://{bucket}/g") == 0
    assert mox.file.get_size(f"obs://{bucket}/g", recursive=True) == len("g/a") + len("g/sub/bb")
    with pytest.raises(FileNotFoundError):
        mox.file.get_size(f"obs://{bucket}/nothing")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_bytes(b"12345")
    assert mox.file.get_size(str(tmp_path / "d")) == 5  # local: always recursive, as documented
    assert mox.file.get_size(str(tmp_path / "d" / "x"), recursive=True) == 5


def test_glob_returns_absolute_urls(s3, bucket, tmp_path):
    _put(s3, bucket, ["im/a.jpg", "im/b.png", "im/c.jpg", "im/.h.jpg", "im/sub/d.jpg", "im/sub2/e.jpg"])
    root = f"obs://{bucket}/im"
    assert mox.file.glob(f"{root}/*.jpg") == [f"{root}/a.jpg", f"{root}/c.jpg"]
    assert mox.file.glob(f"{root}/sub*") == [f"{root}/sub", f"{root}/sub2"]
    assert mox.file.glob(f"{root}/*/?.jpg") == [f"{root}/sub/d.jpg", f"{root}/sub2/e.jpg"]
    assert mox.file.glob(f"s3://{bucket}/im/[ab].*") == [f"s3://{bucket}/im/a.jpg", f"s3://{bucket}/im/b.png"]
    assert mox.file.glob(f"{root}/a.jpg") == [f"{root}/a.jpg"]
    assert mox.file.glob(f"{root}/zz*") == []
    (tmp_path / "x.txt").write_text("x")
    assert mox.file.glob(str(tmp_path / "*.txt")) == [str(tmp_path / "x.txt")]


def test_list_directory_options(s3, bucket, tmp_path):
    _put(s3, bucket, ["l/a", "l/b", "l/sub/c", "l/sub/deep/d"])
    root = f"obs://{bucket}/l"
    assert mox.file.list_directory(root, remove_sep=True) == ["a", "b", "sub"]
    assert mox.file.list_directory(root + "/", remove_sep=False) == ["a", "b", "sub"]
    assert mox.file.list_directory(root, skip_dir=True) == ["a", "b"]
    assert mox.file.list_directory(root, skip_file=True) == ["sub"]
    assert mox.file.list_directory(root, recursive=True, skip_dir=True) == ["a", "b", "sub/c", "sub/deep/d"]
    assert mox.file.list_directory(root, recursive=True, skip_file=True) == ["sub", "sub/deep"]
    mox.file.copy_parallel(root, str(tmp_path))
    local = str(tmp_path)
    for kwargs in [{}, {"skip_dir": True}, {"skip_file": True}, {"recursive": True}, {"recursive": True, "skip_file": True}]:
        assert mox.file.list_directory(local, **kwargs) == mox.file.list_directory(root, **kwargs), kwargs


def test_mk_dir_and_make_dirs(bucket, tmp_path):
    mox.file.mk_dir(str(tmp_path / "one"))
    assert os.path.isdir(tmp_path / "one")
    with pytest.raises(OSError):
        mox.file.mk_dir(str(tmp_path / "missing" / "two"))
    mox.file.make_dirs(str(tmp_path / "a" / "b" / "c"))
    assert os.path.isdir(tmp_path / "a" / "b" / "c")
    mox.file.make_dirs(f"obs://{bucket}/new/dir")  # nothing to create in an object store
    mox.file.mk_dir(f"obs://{bucket}/top")  # the parent is the bucket
    with pytest.raises(OSError):
        mox.file.mk_dir(f"obs://{bucket}/no/such/parent")


def test_write_and_append_text_and_binary(bucket, tmp_path):
    url = f"obs://{bucket}/w/data.bin"
    mox.file.write(url, b"xxx", binary=True)
    assert mox.file.read(url, binary=True) == b"xxx"
    mox.file.append(url, b"yy", binary=True)
    assert mox.file.read(url, binary=True) == b"xxxyy"
    mox.file.write(url, "héllo")
    assert mox.file.read(url) == "héllo"
    mox.file.append(url, "\nmore")
    assert mox.file.read(url) == "héllo\nmore"
    mox.file.append(f"obs://{bucket}/w/new.txt", "created")
    assert mox.file.read(f"obs://{bucket}/w/new.txt") == "created"
    with pytest.raises(TypeError):
        mox.file.write(url, 12)
    assert mox.file.read(url) == "héllo\nmore"  # bad input loses nothing
    local = str(tmp_path / "f.txt")
    mox.file.write(local, "a")
    mox.file.append(local, "b")
    mox.file.append(local, b"c", binary=True)
    assert open(local).read() == "abc"


def test_remove_documented_edge_cases(s3, bucket):
    _put(s3, bucket, ["r/file_name", "r/dir_name/x", "r/dir_name/sub/y", "r/f2", "r/d2/z"])
    root = f"obs://{bucket}/r"
    mox.file.remove(f"{root}/file_name/")  # a trailing / names a directory: nothing is done
    mox.file.remove(f"{root}/file_name/", recursive=True)
    assert mox.file.exists(f"{root}/file_name")
    mox.file.remove(f"{root}/dir_name")  # a directory without recursive: nothing is done
    mox.file.remove(f"{root}/dir_name/")
    assert mox.file.list_directory(f"{root}/dir_name", recursive=True) == ["sub/y", "x"]
    mox.file.remove(f"{root}/file_name")
    assert not mox.file.exists(f"{root}/file_name")
    mox.file.remove(f"{root}/dir_name", recursive=True)
    assert not mox.file.exists(f"{root}/dir_name")
    mox.file.remove(f"{root}/d2/", recursive=True)
    assert not mox.file.exists(f"{root}/d2")
    mox.file.remove(f"{root}/f2", recursive=True)  # recursive on a file removes the file
    assert not mox.file.exists(f"{root}/f2")
    with pytest.raises(FileNotFoundError):
        mox.file.remove(f"{root}/never")


def test_rename_in_every_direction(s3, bucket, tmp_path):
    _put(s3, bucket, ["mv/a", "mv/dir/b", "mv/dir/sub/c"])
    root = f"obs://{bucket}/mv"
    mox.file.rename(f"{root}/a", f"{root}/a2")  # object -> object
    assert mox.file.read(f"{root}/a2") == "mv/a" and not mox.file.exists(f"{root}/a")
    mox.file.rename(f"{root}/a2", str(tmp_path / "a3"))  # object -> local
    assert (tmp_path / "a3").read_text() == "mv/a" and not mox.file.exists(f"{root}/a2")
    mox.file.rename(str(tmp_path / "a3"), f"{root}/a4")  # local -> object
    assert mox.file.read(f"{root}/a4") == "mv/a" and not (tmp_path / "a3").exists()
    mox.file.rename(f"{root}/dir", f"{root}/dir2")  # a directory, object -> object
    assert mox.file.list_directory(f"{root}/dir2", recursive=True) == ["b", "sub/c"]
    assert not mox.file.exists(f"{root}/dir")
    mox.file.rename(f"{root}/dir2", str(tmp_path / "d"))  # object directory -> local
    assert mox.file.list_directory(str(tmp_path / "d"), recursive=True) == ["b", "sub/c"]
    assert not mox.file.exists(f"{root}/dir2")
    mox.file.rename(str(tmp_path / "d"), f"{root}/dir3")  # local directory -> object
    assert mox.file.list_directory(f"{root}/dir3", recursive=True) == ["b", "sub/c"]
    assert not (tmp_path / "d").exists()
    (tmp_path / "l1").write_text("l")
    mox.file.rename(str(tmp_path / "l1"), str(tmp_path / "l2"))  # local -> local
    assert (tmp_path / "l2").read_text() == "l"
    with pytest.raises(FileNotFoundError):
        mox.file.rename(f"{root}/never", f"{root}/x")


def test_stat_and_the_not_exists_exception(s3, bucket, tmp_path):
    _put(s3, bucket, ["st/file.txt"])
    st = mox.file.stat(f"obs://{bucket}/st/file.txt")
    assert st.length == len("st/file.txt") == st.st_size and not st.is_directory
    assert st.mtime_nsec > 1_500_000_000 * 10**9
    d = mox.file.stat(f"obs://{bucket}/st")
    assert d.is_directory and d.length == 0
    with pytest.raises(mox.file.MoxFileNotExistsException) as caught:
        mox.file.stat(f"obs://{bucket}/st/not_exists")
    assert isinstance(caught.value, FileNotFoundError) and isinstance(caught.value, errors.NotFoundError)
    with pytest.raises(mox.file.MoxFileRespException):
        mox.file.read(f"obs://{bucket}/st/xxx")
    (tmp_path / "x").write_bytes(b"12")
    local = mox.file.stat(str(tmp_path / "x"))
    assert local.length == 2 and local.mtime_nsec == os.stat(tmp_path / "x").st_mtime_ns
    with pytest.raises(mox.file.MoxFileNotExistsException):
        mox.file.stat(str(tmp_path / "nope"))


def test_scan_dir_and_walk(s3, bucket):
    _put(s3, bucket, ["sc/a", "sc/sub/b", "sc/sub/deeper/c"])
    root = f"obs://{bucket}/sc"
    with mox.file.scan_dir(root) as entries:
        got = [(e.name, e.path, e.is_dir(), e.is_file()) for e in entries]
    assert got == [("a", f"{root}/a", False, True), ("sub", f"{root}/sub", True, False)]
    first = next(iter(mox.file.scan_dir(root)))
    assert first.stat().length == 4
    down = list(mox.file.walk(root, topdown=True, onerror=None, followlinks=False))
    up = list(mox.file.walk(root, topdown=False))
    assert [d for d, _, _ in down] == [root, f"{root}/sub", f"{root}/sub/deeper"]
    assert up == list(reversed(down))


@pytest.mark.parametrize("where", ["object", "local"])
def test_file_in_every_documented_mode(bucket, tmp_path, where):
    url = f"obs://{bucket}/modes/f.txt" if where == "object" else str(tmp_path / "f.txt")
    with mox.file.File(url, "w") as f:
        assert f.writable() and not f.readable() and f.mode == "w" and f.name == url
        f.write("line1\n")
        f.writelines(["line2\n", "line3\n"])
        f.flush()
        assert f.size() == 18
    with mox.file.File(url, "r") as f:
        assert f.readable() and f.seekable() and not f.writable()
        assert f.readline() == "line1\n" and f.tell() == 6
        assert f.readlines() == ["line2\n", "line3\n"]
        assert f.size() == 18
        f.seek(0)
        assert f.read(5) == "line1"
    with mox.file.File(url, "a") as f:
        f.write("line4\n")
    assert mox.file.read(url) == "line1\nline2\nline3\nline4\n"
    with mox.file.File(url, "r+") as f:
        assert f.read(5) == "line1"
        f.seek(0)
        f.write("LINE1")
    assert mox.file.read(url) == "LINE1\nline2\nline3\nline4\n"
    with mox.file.File(url, "a+") as f:
        f.write("line5\n")
        f.seek(0)
        assert f.read().endswith("line4\nline5\n")
    with mox.file.File(url, "w+") as f:
        f.write("fresh")
        f.seek(0)
        assert f.read() == "fresh"
    assert mox.file.read(url) == "fresh"
    for mode in ["bw", "wb"]:
        with mox.file.File(url, mode) as f:
            f.write(b"\x00\x01")
        with mox.file.File(url, "br") as f:
            assert f.read() == b"\x00\x01" and f.mode == "br"
        with mox.file.File(url, "rb") as f:
            assert list(iter(f)) == [b"\x00\x01"]
    for mode in ["ba", "ab"]:
        with mox.file.File(url, mode) as f:
            f.write(b"\x02")
    assert mox.file.read(url, binary=True) == b"\x00\x01\x02\x02"
    with mox.file.File(url, "br+") as f:
        f.seek(0, 2)
        f.write(b"\x03")
    with mox.file.File(url, "ba+") as f:
        f.write(b"\x04")
    with mox.file.File(url, "bw+") as f:
        f.write(b"new")
    assert mox.file.read(url, binary=True) == b"new"


def test_file_r_plus_of_a_missing_object_and_a_failed_block(bucket):
    with pytest.raises(FileNotFoundError):
        mox.file.File(f"obs://{bucket}/nope", "r+")
    url = f"obs://{bucket}/kept"
    mox.file.write(url, "original")
    with pytest.raises(RuntimeError):
        with mox.file.File(url, "a") as f:
            f.write("half")
            raise RuntimeError("the block failed")
    assert mox.file.read(url) == "original"  # nothing half-written is ever visible
    with pytest.raises(errors.BadRequestError):
        mox.file.File(url, "rw")
