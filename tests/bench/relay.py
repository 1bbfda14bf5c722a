"""An emulated remote link: a TCP relay (asyncio, stdlib only) in front of an HTTP server on loopback.

Benchmarks put it between a client and a local S3 server (moto) so that "cold" reads pay what a cloud
object store costs rather than what loopback costs:

- latency: every HTTP request waits `latency_ms` before it is forwarded. An HTTP/1.1 keep-alive
  connection carries many requests one after another, so a request start is detected as client bytes
  arriving after the server has sent response bytes (or as the first bytes of a connection); the
  delay is applied once per such client->server burst, not per TCP segment.
- bandwidth: bytes in either direction go through two token buckets, one per connection
  (`mbps_per_conn`) and one shared by all connections (`mbps_total`). Buckets may run into debt; a
  sender then sleeps until the debt is paid, so the long-run rate of each bucket is exact whatever the
  number of connections.
- signers (`count_signers`, off by default): the access key id of every SigV4-signed request
  (`Credential=<key id>/...` in its `Authorization` header) is counted, so a test can tell which
  credential its requests were signed with; `stats()["signers"]` holds the counts.

Defaults: 20 ms, 50 MB/s per connection, 200 MB/s in total (1 MB = 10^6 bytes); overridden by the
arguments of `start_relay`, else by BENCH_LINK_LATENCY_MS, BENCH_LINK_MBPS_PER_CONN and
BENCH_LINK_MBPS_TOTAL. `start_relay` runs the relay in a subprocess (so that relaying does not compete
for the GIL with the process being measured) and returns its endpoint URL and a function that stops it;
it runs `memarts-link-relay` (the same relay in Rust, tests/bench/link_relay.rs: at a thousand requests
a second this one, on the same cores as the clients it serves, held curl --parallel at 0.82x the
configured rate, against 0.88-0.93x through the Rust one) when that binary is built
(BENCH_LINK_RELAY, else MEMARTS_BIN_DIR, else target/release or target/debug), this file otherwise;
`start_relay_thread` runs one in a daemon thread instead; `self_check` measures that the relay adds the
configured latency (a HEAD through the relay against one sent directly).

Run as a script (`python3 relay.py HOST PORT [--latency-ms ..]`) to relay to HOST:PORT until SIGTERM.
"""

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

READ_SIZE = 64 << 10  # bytes per read: the granularity of throttling
SIGNER = re.compile(rb"Credential=([A-Za-z0-9._-]+)/")


def link_params(latency_ms=None, mbps_per_conn=None, mbps_total=None):
    """The link parameters: arguments first, then environment, then defaults."""

    def pick(arg, env, default):
        if arg is not None:
            return float(arg)
        return float(os.environ.get(env, default))

    return {
        "latency_ms": pick(latency_ms, "BENCH_LINK_LATENCY_MS", 20),
        "mbps_per_conn": pick(mbps_per_conn, "BENCH_LINK_MBPS_PER_CONN", 50),
        "mbps_total": pick(mbps_total, "BENCH_LINK_MBPS_TOTAL", 200),
    }


class TokenBucket:
    """`rate` bytes/s with a burst of `burst` bytes; `reserve(n)` takes n bytes (possibly into debt) and
    returns how long the caller must wait before sending them. A rate of 0 or less means unlimited."""

    def __init__(self, rate, burst=256 << 10):
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = time.monotonic()

    def reserve(self, n):
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens -= n
        return max(0.0, -self.tokens / self.rate)


class Relay:
    """Connection handler of the relay: one upstream connection per client connection, two pumps."""

    def __init__(self, target_host, target_port, params, count_signers=False):
        self.target = (target_host, target_port)
        self.signers = {} if count_signers else None
        self.latency = params["latency_ms"] / 1000.0
        self.per_conn_rate = params["mbps_per_conn"] * 1e6
        self.total = TokenBucket(params["mbps_total"] * 1e6)
        self.connections = 0
        self.requests = 0
        self.bytes_down = 0
        self.tasks = set()

    async def handle(self, client_reader, client_writer):
        # The event loop holds its tasks weakly: keep a strong reference while the connection lives.
        task = asyncio.current_task()
        self.tasks.add(task)
        try:
            await self.relay(client_reader, client_writer)
        except asyncio.CancelledError:
            pass  # the relay is stopping
        finally:
            self.tasks.discard(task)

    def stats(self):
        out = {"connections": self.connections, "requests": self.requests, "bytes_down": self.bytes_down}
        if self.signers is not None:
            out["signers"] = dict(self.signers)
        return out

    async def relay(self, client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.close()
            return
        self.connections += 1
        conn = TokenBucket(self.per_conn_rate)
        # True when the next client bytes start a new request (nothing forwarded yet, or the server
        # has answered since the client last sent).
        state = {"request_start": True}

        async def throttle(n):
            delay = max(conn.reserve(n), self.total.reserve(n))
            if delay > 0:
                await asyncio.sleep(delay)

        async def client_to_server():
            while data := await client_reader.read(READ_SIZE):
                if state["request_start"]:
                    state["request_start"] = False
                    self.requests += 1
                    await asyncio.sleep(self.latency)
                if self.signers is not None:
                    for m in SIGNER.finditer(data):
                        key = m.group(1).decode()
                        self.signers[key] = self.signers.get(key, 0) + 1
                await throttle(len(data))
                server_writer.write(data)
                await server_writer.drain()

        server_socket = server_writer.get_extra_info("socket")

        async def server_to_client():
            while data := await server_reader.read(READ_SIZE):
                # Acknowledge at once, as the Rust relay does (link_relay.rs, `quick_ack`): a server
                # that writes small pieces without TCP_NODELAY otherwise stalls 40 ms on Nagle.
                if server_socket is not None and hasattr(socket, "TCP_QUICKACK"):
                    server_socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
                state["request_start"] = True
                self.bytes_down += len(data)
                await throttle(len(data))
                client_writer.write(data)
                await client_writer.drain()

        async def pump(fn, writer):
            try:
                await fn()
            except (ConnectionError, OSError):
                pass
            finally:
                # Half-close the other side so the peer sees EOF, then let the other pump finish.
                try:
                    if writer.can_write_eof():
                        writer.write_eof()
                except (ConnectionError, OSError, RuntimeError):
                    pass

        try:
            await asyncio.gather(pump(client_to_server, server_writer), pump(server_to_client, client_writer))
        finally:
            for w in (server_writer, client_writer):
                w.close()


def start_relay_thread(target_host, target_port, latency_ms=None, mbps_per_conn=None, mbps_total=None,
                       listen_host="127.0.0.1", count_signers=False):
    """Runs a relay to target_host:target_port on its own event loop in a daemon thread of this process.
    Returns (endpoint_url, stop_fn); `stop_fn.relay` is the Relay (counters), `stop_fn.params` the link."""
    params = link_params(latency_ms, mbps_per_conn, mbps_total)
    relay = Relay(target_host, target_port, params, count_signers)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box = {}

    async def serve():
        server = await asyncio.start_server(relay.handle, listen_host, 0, backlog=1024)
        box["port"] = server.sockets[0].getsockname()[1]
        box["server"] = server
        started.set()
        async with server:
            await server.serve_forever()

    def run():
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(serve())
        except asyncio.CancelledError:
            pass
        except Exception as e:  # surfaced to the caller below if startup failed
            box["error"] = e
            started.set()
        finally:
            # Let cancelled connections unwind (close their sockets) before the loop goes away.
            pending = asyncio.all_tasks(loop)
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    thread = threading.Thread(target=run, name="bench-relay", daemon=True)
    thread.start()
    if not started.wait(10) or "error" in box:
        raise RuntimeError(f"relay did not start: {box.get('error', 'timeout')}")

    def stop():
        def cancel_all():
            box["server"].close()
            for task in asyncio.all_tasks(loop):
                task.cancel()

        if loop.is_running():
            loop.call_soon_threadsafe(cancel_all)
        thread.join(10)

    stop.relay = relay
    stop.params = params
    return f"http://{listen_host}:{box['port']}", stop


def relay_program():
    """The command line prefix of the relay subprocess: the Rust relay if it is built, else this file."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    candidates = [os.environ.get("BENCH_LINK_RELAY")]
    if os.environ.get("MEMARTS_BIN_DIR"):
        candidates.append(os.path.join(os.environ["MEMARTS_BIN_DIR"], "memarts-link-relay"))
    candidates += [os.path.join(root, "target", kind, "memarts-link-relay") for kind in ("release", "debug")]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return [path]
    return [sys.executable, os.path.abspath(__file__)]


def start_relay(target_host, target_port, latency_ms=None, mbps_per_conn=None, mbps_total=None,
                listen_host="127.0.0.1", count_signers=False, timeline_ms=0):
    """Starts a relay to target_host:target_port in a subprocess of its own (so that relaying does not
    compete for the GIL with the process being measured). Returns (endpoint_url, stop_fn);
    `stop_fn.params` holds the link parameters, `stop_fn.stats()` returns the relay's counters and
    `stop_fn.proc` is the process, `stop_fn.program` says which relay runs ("rust" or "python").
    `timeline_ms` (the Rust relay only): each `stats()` also holds the bytes down and request starts
    per bin of that many ms since the previous call (`timeline`, on `time.monotonic()`'s clock)."""
    params = link_params(latency_ms, mbps_per_conn, mbps_total)
    program = relay_program()
    if timeline_ms and program[0] == sys.executable:
        raise RuntimeError("the timeline needs the Rust relay (memarts-link-relay): build it with cargo")
    proc = subprocess.Popen(
        program + [target_host, str(target_port),
         "--latency-ms", str(params["latency_ms"]), "--mbps-per-conn", str(params["mbps_per_conn"]),
         "--mbps-total", str(params["mbps_total"]), "--listen", listen_host]
        + (["--count-signers"] if count_signers else [])
        + (["--timeline-ms", str(int(timeline_ms))] if timeline_ms else []),
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)

    def stats():
        """The relay's counters so far: connections, requests (request starts seen), bytes_down."""
        os.kill(proc.pid, signal.SIGUSR1)
        return json.loads(proc.stdout.readline())

    def stop():
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout:
            proc.stdout.close()

    line = proc.stdout.readline()  # "READY <url>", or EOF if the relay died
    if not line.startswith("READY "):
        stop()
        raise RuntimeError(f"relay did not start (exit code {proc.poll()}, said {line!r})")
    stop.params = params
    stop.program = "python" if program[0] == sys.executable else "rust"
    stop.proc = proc
    stop.stats = stats
    return line.split()[1], stop


def _head_ms(host, port, path, rounds=5):
    """Best time of a HEAD request over one keep-alive connection (HTTP/1.1), in ms."""
    import http.client

    conn = http.client.HTTPConnection(host, port, timeout=30)
    best = float("inf")
    try:
        for _ in range(rounds):
            start = time.perf_counter()
            conn.request("HEAD", path)
            resp = conn.getresponse()
            resp.read()
            best = min(best, (time.perf_counter() - start) * 1000)
    finally:
        conn.close()
    return best


def self_check(direct_url, relay_url, params, path="/", quiet=False):
    """Times HEAD requests through the relay and directly; raises if the relay does not add about the
    configured latency. Returns the measured figures (ms). The path need not exist (a 404 is an answer)."""
    from urllib.parse import urlsplit

    d, r = urlsplit(direct_url), urlsplit(relay_url)
    direct = _head_ms(d.hostname, d.port, path)
    relayed = _head_ms(r.hostname, r.port, path)
    added = relayed - direct
    want = params["latency_ms"]
    if not (want * 0.8 - 1 <= added <= want * 1.5 + 10):
        raise RuntimeError(f"relay self-check failed: HEAD direct {direct:.1f} ms, through relay {relayed:.1f} ms, "
                           f"added {added:.1f} ms, configured {want:.0f} ms")
    if not quiet:
        print(f"link: +{want:.0f} ms per request, {params['mbps_per_conn']:.0f} MB/s per connection, "
              f"{params['mbps_total']:.0f} MB/s total (self-check: HEAD {direct:.1f} ms direct, "
              f"{relayed:.1f} ms through the relay)")
    return {"head_direct_ms": direct, "head_relay_ms": relayed, "added_ms": added}


def main():
    import argparse

    ap = argparse.ArgumentParser(description="TCP relay emulating a remote link (latency, bandwidth caps)")
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--latency-ms", type=float)
    ap.add_argument("--mbps-per-conn", type=float)
    ap.add_argument("--mbps-total", type=float)
    ap.add_argument("--listen", default="127.0.0.1")
    ap.add_argument("--count-signers", action="store_true", help="count requests per SigV4 access key id")
    a = ap.parse_args()
    url, stop = start_relay_thread(a.host, a.port, a.latency_ms, a.mbps_per_conn, a.mbps_total, a.listen,
                                   a.count_signers)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    # SIGUSR1: one line of JSON counters on stdout (read by `stats()` of start_relay).
    signal.signal(signal.SIGUSR1, lambda *_: print(json.dumps(stop.relay.stats()), flush=True))
    print(f"READY {url}", flush=True)
    parent = os.getppid()
    while not done.wait(0.5):
        if os.getppid() != parent:  # the process that started us is gone: do not outlive it
            break
    stop()


if __name__ == "__main__":
    main()
