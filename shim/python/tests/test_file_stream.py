"""``File(url, 'rb')`` reads through the shim's stream: byte-exact in pieces across chunk
boundaries, seek and tell, the version pinned at open (an object replaced between two reads of one
open file raises ``StaleError``, never returns bytes of the new version), and the read-ahead window
really reaches the origin ahead of the reader."""

import io
import time

import pytest

import memarts as mox
from memarts import errors
from conftest import assert_reads_ahead, pattern

CS = 64 << 10


def test_reads_in_pieces_are_byte_exact_across_chunk_boundaries(s3, bucket):
    want = pattern(40, 20 * CS + 333)
    s3.put_object(Bucket=bucket, Key="big.bin", Body=want)
    url = f"obs://{bucket}/big.bin"
    with mox.file.File(url, "rb") as f:
        assert f.size() == len(want)
        got = bytearray()
        while True:
            piece = f.read(7777)
            if not piece:
                break
            got += piece
        assert bytes(got) == want
        assert f.tell() == len(want)
        assert f.read(10) == b"", "a read at the end returns nothing"
        for to, n in [(5 * CS + 11, 3 * CS), (CS - 1, 2), (17, 100_000)]:
            assert f.seek(to) == to
            assert f.read(n) == want[to : to + n], f"after a seek to {to}"
            assert f.tell() == to + n
        f.seek(len(want) + 10)
        assert f.read(5) == b"", "a read past the end returns nothing"
        f.seek(-5, io.SEEK_END)
        assert f.read() == want[-5:]
        f.seek(3)
        assert f.read() == want[3:], "read() of the rest after a seek"
    with mox.file.File(url, "rb") as f:
        assert f.read() == want, "one read() of the whole object"


def test_an_object_replaced_between_two_reads_raises_stale_never_mixes(s3, bucket):
    v1, v2 = pattern(41, 200 * CS), pattern(42, 200 * CS)
    s3.put_object(Bucket=bucket, Key="o", Body=v1)
    url = f"obs://{bucket}/o"
    with mox.file.File(url, "rb") as f:
        got = bytearray(f.read(1000))
        s3.put_object(Bucket=bucket, Key="o", Body=v2)
        with pytest.raises(errors.StaleError):
            while True:
                piece = f.read(10_000)
                assert piece, "the file ended without meeting the replaced object"
                got += piece
        assert bytes(got) == v1[: len(got)], "a read returned bytes of another version"
        assert len(got) < len(v1)


def test_the_window_reaches_the_origin_ahead_of_the_reader(s3, bucket, fleet):
    want = pattern(43, 64 * CS)
    s3.put_object(Bucket=bucket, Key="ahead", Body=want)
    url = f"obs://{bucket}/ahead"
    before = fleet.total("misses")
    with mox.file.File(url, "rb") as f:
        assert_reads_ahead(fleet, f, want, CS, before)


@pytest.mark.proxy_only
def test_a_file_opened_before_fork_reads_on_in_the_child(s3, bucket):
    import os

    want = pattern(44, 30 * CS + 5)
    s3.put_object(Bucket=bucket, Key="forked", Body=want)
    with mox.file.File(f"obs://{bucket}/forked", "rb") as f:
        assert f.read(3 * CS) == want[: 3 * CS]  # the window and its workers are running
        pid = os.fork()
        if pid == 0:
            # The child has none of the parent's workers: its stream starts a window of its own.
            ok = f.read() == want[3 * CS :]
            os._exit(0 if ok else 1)
        assert f.read() == want[3 * CS :]
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child read wrong bytes"


def test_copy_of_a_multi_chunk_object_streams_byte_exact(s3, bucket, tmp_path):
    want = pattern(45, 40 * CS + 77)
    s3.put_object(Bucket=bucket, Key="copied", Body=want)
    dst = tmp_path / "copied.bin"
    mox.file.copy(f"obs://{bucket}/copied", str(dst))
    assert dst.read_bytes() == want
    s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    mox.file.copy(f"obs://{bucket}/empty", str(tmp_path / "empty"))
    assert (tmp_path / "empty").read_bytes() == b""


def _mixed_reads_match_a_local_file(url, want, seed):
    """Reads of every size (reads of a chunk or more go around the buffer, straight into their
    `bytes`), lines, `read1`, `peek`, `readinto`, seeks and tells in a random order, each checked
    against `io.BytesIO` over the same bytes."""
    import random

    rng = random.Random(seed)
    ref = io.BytesIO(want)
    sizes = [1, 100, CS - 1, CS, CS + 5, 3 * CS + 7, -1]
    with mox.file.File(url, "rb") as f:
        for step in range(600):
            op = rng.choice(["read", "read", "read", "readline", "read1", "peek", "readinto", "seek", "tell"])
            if op == "read":
                n = rng.choice(sizes)
                got, exp = f.read(n), ref.read(n)
            elif op == "readline":
                got, exp = f.readline(), ref.readline()
            elif op == "read1":
                n = rng.choice(sizes[:-1])
                got = f.read1(n)
                exp = ref.read(len(got))  # read1 may return less than asked, never other bytes
                assert got or f.tell() >= len(want), f"step {step}: read1 returned nothing before the end"
            elif op == "peek":
                # What peek shows must be what comes next (it moves nothing).
                shown = f.peek(1)
                got, exp = shown, want[ref.tell() : ref.tell() + len(shown)]
            elif op == "readinto":
                buf = bytearray(rng.choice(sizes[:-1]))
                left = max(0, len(want) - ref.tell())
                n = f.readinto(buf)
                assert n == min(len(buf), left), f"step {step}: readinto read {n} of {len(buf)}"
                got, exp = bytes(buf[:n]), ref.read(n)
            elif op == "seek":
                # Anywhere, or near where the reader is (where a buffer's bytes may be reused).
                to = rng.choice([rng.randrange(len(want) + 10), max(0, ref.tell() + rng.randrange(-CS, CS))])
                got, exp = f.seek(to), ref.seek(to)
            else:
                # Not after every step: `tell` puts the buffered reader back in step with the raw
                # one, which would hide a buffer that lost track of where it is.
                got, exp = f.tell(), ref.tell()
            assert got == exp, f"step {step}: {op} at {ref.tell()}"


def test_mixed_reads_seeks_and_lines_match_a_local_file(s3, bucket):
    want = b"".join(pattern(46 + i, 1 + (i * 7919) % (CS // 2)) + b"\n" for i in range(60))
    s3.put_object(Bucket=bucket, Key="mixed", Body=want)
    url = f"obs://{bucket}/mixed"
    _mixed_reads_match_a_local_file(url, want, 1)  # cold
    _mixed_reads_match_a_local_file(url, want, 2)  # warm


@pytest.mark.proxy_only
def test_reads_of_resident_chunks_go_straight_into_their_bytes_and_match_a_local_file(s3, bucket, fleet):
    want = b"".join(pattern(146 + i, 1 + (i * 7919) % (CS // 2)) + b"\n" for i in range(60))
    # Whole chunks: a chunk of 32 KiB or less is a packed record, never made resident.
    want += b"\n" * (-len(want) % CS)
    s3.put_object(Bucket=bucket, Key="resident", Body=want)
    url = f"obs://{bucket}/resident"
    chunks = -(-len(want) // CS)
    assert mox.file.read(url, binary=True) == want
    fleet.wait_cached(chunks)
    # Read whole (local reads, reported) until every chunk is read resident.
    deadline = time.time() + 20
    while True:
        before = mox.stats()["local_resident"]
        assert mox.file.read(url, binary=True) == want
        if mox.stats()["local_resident"] - before == chunks:
            break
        assert time.time() < deadline, "the chunks were never made resident"
        time.sleep(0.05)
    before = mox.stats()
    _mixed_reads_match_a_local_file(url, want, 3)
    after = mox.stats()
    assert after["local_resident"] > before["local_resident"], "no read was served from a resident chunk"
    assert after["local_corrupt"] == before["local_corrupt"]
    # A file read in whole chunks reads every chunk once, each resident, with no proxy.
    before = mox.stats()
    with mox.file.File(url, "rb") as f:
        got = b"".join(iter(lambda: f.read(CS), b""))
    assert got == want
    after = mox.stats()
    assert after["local_resident"] - before["local_resident"] == chunks, (before, after)
    assert after["local_hits"] - before["local_hits"] == chunks, (before, after)
