"""One Python process on hasync's PutStream next to Redis SET + WAIT 1 from 16 Python processes.

Usage: stream_vs_redis.py HASYNC_BINARY STUBS_DIR [SECONDS]   (run by benches/python/run.sh)

Starts an hasync master and slave (`hasync serve`, SYNC, one replica) and a Redis master and
replica (`redis-server`, no persistence) on loopback, each in processes of their own, then:
- one Python process with one PutStream keeping N puts of 1 KiB in flight (N = 16, 64, 256),
  first one request per put, then packed (the puts ready at once in one request's `more`);
- 1 and 16 Python processes, each doing SET (1 KiB) + WAIT 1 3000 in a loop (redis-py).
Prints ops/s for each and the ratio of the stream to Redis with 16 processes. Every child is
killed at the end, also on failure.
"""

import multiprocessing as mp
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

BODY = b"x" * 1024


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_hasync(binary, base, procs):
    ports = {}
    for name in ("master", "slave"):
        ports[name] = (free_port(), free_port(), free_port())
    for name in ("master", "slave"):
        ha, grpc_port, metrics = ports[name]
        d = os.path.join(base, name)
        os.makedirs(d)
        slave = ""
        role = "master"
        if name == "slave":
            role = "slave"
            slave = f'\n[slave]\nmaster-ha = "127.0.0.1:{ports["master"][0]}"\n'
        cfg = (
            f'[node]\nname = "{name}"\nrole = "{role}"\ndata-dir = "{d}/data"\n\n'
            f'[store]\nsegment-size = "256MiB"\n\n[ha]\nlisten = "127.0.0.1:{ha}"\n\n'
            f'[grpc]\nlisten = "127.0.0.1:{grpc_port}"\n\n[metrics]\nlisten = "127.0.0.1:{metrics}"\n\n'
            f'[replication]\nmode = "sync"\n{slave}\n[log]\nfilter = "warn"\n'
        )
        path = os.path.join(d, "hasync.toml")
        with open(path, "w") as f:
            f.write(cfg)
        log = open(os.path.join(d, "log"), "w")
        procs.append(subprocess.Popen([binary, "serve", "--config", path], stdout=log, stderr=log))
    return f"127.0.0.1:{ports['master'][1]}"


def start_redis(base, procs):
    server = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.path.exists(server):
        return None
    mport, rport = free_port(), free_port()
    for name, port, extra in (("redis-master", mport, []), ("redis-replica", rport, ["--replicaof", "127.0.0.1", str(mport)])):
        d = os.path.join(base, name)
        os.makedirs(d)
        log = open(os.path.join(d, "log"), "w")
        procs.append(subprocess.Popen(
            [server, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", d] + extra,
            stdout=log, stderr=log))
    return mport


def wait_hasync(pb, pb_grpc, grpc, addr):
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with grpc.insecure_channel(addr) as ch:
                st = pb_grpc.ReplicationStub(ch).GetStatus(pb.GetStatusRequest(), timeout=1)
                if st.in_sync_replicas >= 1:
                    return
        except grpc.RpcError:
            pass
        time.sleep(0.1)
    raise SystemExit("the hasync pair did not connect within 30 s")


def wait_redis(port):
    import redis
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            info = redis.Redis(port=port).info("replication")
            if info.get("connected_slaves") == 1 and info.get("slave0", {}).get("state") == "online":
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise SystemExit("the Redis pair did not connect within 30 s")


def stream_run(stubs, addr, in_flight, seconds, packed=False):
    """One client, one PutStream, `in_flight` single-message puts ahead of their answers.
    `packed`: the puts whose slots are free at once travel in one request (the first put, the
    others in its `more`) and are answered in one response; else one request per put."""
    sys.path.insert(0, stubs)
    import grpc
    from hasync.v1 import messages_pb2 as m, messages_pb2_grpc as mg
    msg = m.Message(topic="BenchTopic", queue_id=0, body=BODY, tags="b")
    window = threading.Semaphore(in_flight)
    stop = time.time() + seconds

    def requests():
        i = 0
        while time.time() < stop:
            window.acquire()
            n = 1
            while packed and n < in_flight and window.acquire(blocking=False):
                n += 1
            request = m.PutStreamRequest(id=i, messages=[msg])
            request.more.extend(m.PutStreamRequest(id=i + k, messages=[msg]) for k in range(1, n))
            yield request
            i += n

    ok = bad = 0
    with grpc.insecure_channel(addr) as ch:
        started = time.time()
        for a in mg.MessagesStub(ch).PutStream(requests()):
            answers = [a, *a.more]
            window.release(len(answers))
            for one in answers:
                if one.error_code == 0 and one.response.status == m.PUT_OK:
                    ok += 1
                else:
                    bad += 1
        elapsed = time.time() - started
    return ok / elapsed, bad


def redis_worker(port, seconds, out):
    import redis
    r = redis.Redis(port=port)
    key = f"bench:{os.getpid()}"
    n = bad = 0
    stop = time.time() + seconds
    started = time.time()
    while time.time() < stop:
        r.set(key, BODY)
        if r.wait(1, 3000) >= 1:
            n += 1
        else:
            bad += 1
    out.put((n, bad, time.time() - started))


def redis_run(port, procs, seconds):
    out = mp.Queue()
    workers = [mp.Process(target=redis_worker, args=(port, seconds, out)) for _ in range(procs)]
    for w in workers:
        w.start()
    results = [out.get(timeout=seconds + 30) for _ in workers]
    for w in workers:
        w.join(timeout=10)
    return sum(n / t for n, _, t in results), sum(b for _, b, _ in results)


def main():
    binary, stubs = sys.argv[1], sys.argv[2]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
    sys.path.insert(0, stubs)
    import grpc
    from hasync.v1 import replication_pb2 as pb, replication_pb2_grpc as pb_grpc
    base = tempfile.mkdtemp(prefix="hasync-pybench-")
    procs = []
    try:
        addr = start_hasync(binary, base, procs)
        port = start_redis(base, procs)
        wait_hasync(pb, pb_grpc, grpc, addr)
        print(f"Python clients, 1 KiB values, {seconds:g} s per run, SYNC with one replica, "
              f"each system a master and a replica process on loopback")
        stream = {}
        for packed in (False, True):
            for n in (16, 64, 256):
                rate, bad = stream_run(stubs, addr, n, seconds, packed)
                how = "packed" if packed else "one put per request"
                stream[(n, how)] = rate
                print(f"  hasync PutStream, 1 process, {n:>3} in flight, {how:<19}: "
                      f"{rate:>9.0f} ops/s  (not ok {bad})")
        if port is None:
            print("  redis-server is not installed: the Redis comparison is skipped")
            return
        wait_redis(port)
        redis16 = None
        for p in (1, 16):
            rate, bad = redis_run(port, p, seconds)
            if p == 16:
                redis16 = rate
            print(f"  Redis SET+WAIT 1, {p:>2} process(es){'':<31}: {rate:>9.0f} ops/s  (not ok {bad})")
        for how in ("one put per request", "packed"):
            best = max((k for k in stream if k[1] == how), key=stream.get)
            print(f"  one PutStream process ({best[0]} in flight, {how}) / Redis with 16 "
                  f"processes: {stream[best] / redis16:.2f}x")
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
