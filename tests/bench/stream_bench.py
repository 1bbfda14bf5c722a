"""Cold sequential read of one large object over an emulated link (`relay.py`: BENCH_LINK_LATENCY_MS,
BENCH_LINK_MBPS_PER_CONN, BENCH_LINK_MBPS_TOTAL; defaults 20 ms, 50 MB/s per connection, 200 MB/s in
total), three ways side by side in one run, each on an object no one read before (a cold cache):

- stream: `Client.open_stream(url).read(1 MiB)` in a loop (what `File(url, 'rb')` and `memarts cat`
  do now: a read-ahead window of chunks in flight);
- windows: `read_range` of 16 MiB windows one after another, each waiting for its chunks (what
  `memarts cat` did before: the chunks of a window in parallel, nothing across windows);
- per chunk: the same stream with read-ahead off (what `File(url, 'rb').read()` in pieces did
  before: one round trip per 1 MiB piece).

Ratios: stream / windows, stream / per chunk, stream / the link's capacity (BENCH_LINK_MBPS_TOTAL).
Writes tests/bench/results/stream.json; asserts nothing about timings. BENCH_STREAM_MIB sets the
object size (default 128).

moto serves a ranged GET in time proportional to the whole object, not the range, so against it every
path is origin-bound and the ratios to the link say little; the issue's target (stream >= 0.8x the
link) is to be measured against an origin that serves ranges in time proportional to the range
(s3s-fs 0.14.1).
"""

import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import relay  # noqa: E402
from python_bench import MEMARTS, start_moto, write_results  # noqa: E402

MIB = 1 << 20


def main():
    import boto3

    size = int(os.environ.get("BENCH_STREAM_MIB", "128")) * MIB
    endpoint, moto = start_moto()
    host, port = endpoint.rsplit("/", 1)[1].split(":")
    link, stop_relay = relay.start_relay(host, int(port))
    creds = dict(AWS_ALLOW_HTTP="true", AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                 AWS_REGION="us-east-1")
    os.environ.update(creds)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="streambench")
    body = os.urandom(size)
    for key in ("stream", "windows", "per-chunk"):
        s3.put_object(Bucket="streambench", Key=key, Body=body)
    base = tempfile.mkdtemp(prefix="memarts-streambench-")
    os.environ.update(MEMARTS_RUN_DIR=os.path.join(base, "run"), MEMARTS_CACHE_DIR=os.path.join(base, "cache"),
                      AWS_ENDPOINT_URL=link, MOX_FILE_CHUNK_SIZE=str(MIB))
    out = subprocess.run([MEMARTS, "start_proxy", "4"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"start_proxy failed: {out.stdout}{out.stderr}")
    try:
        import memarts._memarts as native

        client = native.Client()

        def stream(key, readahead=None):
            s = client.open_stream(f"s3://streambench/{key}")
            if readahead is not None:
                s.set_readahead(readahead)
            got = 0
            while True:
                piece = s.read(MIB)
                if not piece:
                    return got
                got += len(piece)

        def windows(key):
            url, got = f"s3://streambench/{key}", 0
            while got < size:
                got += len(client.read_range(url, got, 16 * MIB))
            return got

        rates = {}
        for name, fn in [("stream", lambda: stream("stream")), ("windows", lambda: windows("windows")),
                         ("per_chunk", lambda: stream("per-chunk", 0))]:
            start = time.perf_counter()
            assert fn() == size
            rates[name] = size / (time.perf_counter() - start) / 1e6
    finally:
        subprocess.run([MEMARTS, "stop_proxy"], capture_output=True)
        stop_relay()
        moto.kill()
    capacity = stop_relay.params["mbps_total"]
    res = {"object_mib": size // MIB, "link": stop_relay.params, "mbs": rates,
           "ratios": {"stream_vs_windows": rates["stream"] / rates["windows"],
                      "stream_vs_per_chunk": rates["stream"] / rates["per_chunk"],
                      "stream_vs_link": rates["stream"] / capacity},
           "bin_dir": os.path.dirname(MEMARTS)}
    print(f"cold {size // MIB} MiB over {stop_relay.params}: stream {rates['stream']:.0f} MB/s, "
          f"16 MiB windows {rates['windows']:.0f} MB/s, one chunk per round trip {rates['per_chunk']:.0f} MB/s; "
          f"ratios {json.dumps(res['ratios'])}")
    write_results("stream", res)


if __name__ == "__main__":
    sys.exit(main())
