"""``mox.file.shift('os', 'mox')``: the standard library's file functions on object URLs, local paths
unchanged (a table of calls compared with and without the patch), idempotence, fork and undo."""

import builtins
import glob
import os
import shutil

import pytest

import moxing as mox
from memarts import shift as shift_module


@pytest.fixture
def shifted():
    mox.file.shift("os", "mox")
    yield
    mox.file.shift("mox", "os")


def test_the_standard_library_reaches_objects(s3, bucket, tmp_path, shifted):
    root = f"obs://{bucket}/std"
    s3.put_object(Bucket=bucket, Key="std/a.txt", Body=b"alpha\n")
    s3.put_object(Bucket=bucket, Key="std/sub/b.bin", Body=b"\x00\x01")
    with open(f"{root}/a.txt") as f:
        assert f.read() == "alpha\n"
    with open(f"{root}/new.txt", "w") as f:
        f.write("written")
    assert mox.file.read(f"{root}/new.txt") == "written"
    assert os.path.exists(f"{root}/a.txt") and os.path.exists(f"{root}/sub") and not os.path.exists(f"{root}/no")
    assert os.path.isdir(f"{root}/sub") and not os.path.isdir(f"{root}/a.txt")
    assert os.path.isfile(f"{root}/a.txt") and not os.path.isfile(f"{root}/sub")
    assert os.path.getsize(f"s3://{bucket}/std/sub/b.bin") == 2
    assert os.listdir(root) == ["a.txt", "new.txt", "sub"]
    with pytest.raises(FileNotFoundError):
        os.listdir(f"{root}/missing")
    os.makedirs(f"{root}/made", exist_ok=True)
    os.mkdir(f"oss://{bucket}/std/sub/one")
    assert [d for d, _, _ in os.walk(root)] == [root, f"{root}/sub"]
    with os.scandir(root) as it:
        assert sorted((e.name, e.is_dir()) for e in it) == [("a.txt", False), ("new.txt", False), ("sub", True)]
    assert os.stat(f"{root}/a.txt").st_size == 6
    assert glob.glob(f"{root}/*.txt") == [f"{root}/a.txt", f"{root}/new.txt"]
    os.rename(f"{root}/new.txt", f"{root}/renamed.txt")
    assert not os.path.exists(f"{root}/new.txt") and os.path.exists(f"{root}/renamed.txt")
    assert shutil.copyfile(f"{root}/a.txt", str(tmp_path / "a.txt")) == str(tmp_path / "a.txt")
    assert (tmp_path / "a.txt").read_text() == "alpha\n"
    shutil.copy(str(tmp_path / "a.txt"), f"{root}/sub")  # into a directory, as shutil.copy does
    assert mox.file.read(f"{root}/sub/a.txt") == "alpha\n"
    shutil.copytree(f"{root}/sub", str(tmp_path / "tree"))
    assert sorted(os.listdir(tmp_path / "tree")) == ["a.txt", "b.bin"]
    os.remove(f"{root}/renamed.txt")
    with pytest.raises(FileNotFoundError):
        os.remove(f"{root}/renamed.txt")
    shutil.rmtree(f"{root}/sub")
    assert not os.path.exists(f"{root}/sub")


def _local_calls(d):
    """(label, call) pairs over the local directory `d`; each call returns something comparable."""
    f, missing, sub = os.path.join(d, "f.txt"), os.path.join(d, "missing"), os.path.join(d, "sub")

    def read_back(mode="r"):
        with open(f, mode) as fh:
            return fh.read()

    return [
        ("open r", lambda: read_back()),
        ("open rb", lambda: read_back("rb")),
        ("open missing", lambda: open(missing)),
        ("open bad mode", lambda: open(f, "rw")),
        ("open fd", lambda: open(os.open(f, os.O_RDONLY)).read()),
        ("exists", lambda: (os.path.exists(f), os.path.exists(missing), os.path.exists(b"/"), os.path.exists(0))),
        ("isdir isfile", lambda: (os.path.isdir(sub), os.path.isfile(f), os.path.isfile(sub))),
        ("getsize", lambda: os.path.getsize(f)),
        ("getsize missing", lambda: os.path.getsize(missing)),
        ("listdir", lambda: sorted(os.listdir(d))),
        ("listdir missing", lambda: os.listdir(missing)),
        ("listdir bytes", lambda: sorted(os.listdir(d.encode()))),
        ("makedirs exists", lambda: os.makedirs(sub)),
        ("mkdir missing parent", lambda: os.mkdir(os.path.join(missing, "x"))),
        ("remove missing", lambda: os.remove(missing)),
        ("remove dir", lambda: os.remove(sub)),
        ("rename missing", lambda: os.rename(missing, os.path.join(d, "y"))),
        ("walk", lambda: [(os.path.relpath(r, d), sorted(ds), sorted(fs)) for r, ds, fs in os.walk(d)]),
        ("walk bottom-up", lambda: [os.path.relpath(r, d) for r, _, _ in os.walk(d, topdown=False)]),
        ("scandir", lambda: sorted((e.name, e.is_dir()) for e in os.scandir(d))),
        ("stat", lambda: (os.stat(f).st_size, os.stat(f).st_mode, os.stat(f).st_mtime_ns)),
        ("stat missing", lambda: os.stat(missing)),
        ("glob", lambda: sorted(glob.glob(os.path.join(d, "*")))),
        ("glob recursive", lambda: sorted(glob.glob(os.path.join(d, "**"), recursive=True))),
        ("copyfile missing", lambda: shutil.copyfile(missing, os.path.join(d, "z"))),
        ("copyfile same", lambda: shutil.copyfile(f, f)),
        ("copytree exists", lambda: shutil.copytree(sub, sub)),
        ("rmtree missing", lambda: shutil.rmtree(missing)),
        ("rmtree", lambda: (shutil.rmtree(os.path.join(sub, "deeper")), os.path.exists(os.path.join(sub, "deeper")))),
        ("supports sets", lambda: (os.stat in os.supports_dir_fd, os.stat in os.supports_follow_symlinks, os.listdir in os.supports_fd)),
    ]


def _outcome(call):
    try:
        return ("ok", call())
    except Exception as e:  # noqa: BLE001 — the exception is the outcome compared
        return ("raised", type(e), str(e))


def _populate(d):
    os.makedirs(os.path.join(d, "sub", "deeper"))
    with open(os.path.join(d, "f.txt"), "w") as fh:
        fh.write("local text\n")
    with open(os.path.join(d, "sub", "g.bin"), "wb") as fh:
        fh.write(b"\x00" * 10)


def test_local_paths_behave_exactly_as_without_the_patch(tmp_path):
    plain, patched = str(tmp_path / "plain"), str(tmp_path / "patched")
    for d in (plain, patched):
        _populate(d)
        os.utime(os.path.join(d, "f.txt"), ns=(1_600_000_000 * 10**9, 1_600_000_000 * 10**9))
    before = [(label, _outcome(call)) for label, call in _local_calls(plain)]
    mox.file.shift("os", "mox")
    try:
        after = [(label, _outcome(call)) for label, call in _local_calls(patched)]
    finally:
        mox.file.shift("mox", "os")
    for (label, b), (_, a) in zip(before, after):
        assert _same(b, a, plain, patched), (label, b, a)


def _same(b, a, plain, patched):
    """Outcomes equal once the directory names are swapped (inside lists and tuples too)."""

    def norm(x):
        if isinstance(x, str):
            return x.replace(patched, plain)
        if isinstance(x, bytes):
            return x.replace(patched.encode(), plain.encode())
        if isinstance(x, (list, tuple)):
            return type(x)(norm(i) for i in x)
        return x

    return norm(a) == norm(b)


def test_shift_is_idempotent_survives_fork_and_undoes(s3, bucket):
    originals = (builtins.open, os.listdir, os.path.exists, glob.glob, shutil.copyfile)
    mox.file.shift("os", "mox")
    wrapped = (builtins.open, os.listdir, os.path.exists, glob.glob, shutil.copyfile)
    try:
        mox.file.shift("os", "mox")
        assert (builtins.open, os.listdir, os.path.exists, glob.glob, shutil.copyfile) == wrapped
        assert wrapped[0] is not originals[0] and shift_module.is_shifted()
        s3.put_object(Bucket=bucket, Key="fork/x", Body=b"from the child")
        pid = os.fork()
        if pid == 0:
            ok = False
            try:
                with open(f"obs://{bucket}/fork/x", "rb") as f:
                    ok = f.read() == b"from the child" and os.listdir(f"obs://{bucket}/fork") == ["x"]
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        mox.file.shift("mox", "os")
    assert (builtins.open, os.listdir, os.path.exists, glob.glob, shutil.copyfile) == originals
    mox.file.shift("mox", "os")  # undoing twice is fine too
    assert not os.path.exists(f"obs://{bucket}/fork/x")  # a plain path again, relative and missing
    with pytest.raises(ValueError):
        mox.file.shift("os", "tf")
