"""An independent client of the hasync gRPC API: Python grpcio stubs generated from proto/.

Run by .ci/run after the Rust tests: starts `hasync serve` (a master on OS-assigned loopback
ports, temporary data dir), drives health, GetStatus, SetReplicationMode, Put, Read and a bad
request, then stops it with SIGTERM and expects a clean exit. Prints a
"N passed, N failed" line; exits non-zero on any failure.
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, sys.argv[2])
from hasync.v1 import messages_pb2, messages_pb2_grpc, replication_pb2, replication_pb2_grpc  # noqa: E402

BINARY = sys.argv[1]
passed, failed = 0, 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


def start_node(tmp):
    cfg = os.path.join(tmp, "hasync.toml")
    with open(cfg, "w") as f:
        f.write(
            '[node]\nname = "py-master"\n'
            '[store]\nsegment-size = "1MiB"\nmax-message-size = "64KiB"\n'
            '[ha]\nlisten = "127.0.0.1:0"\n[grpc]\nlisten = "127.0.0.1:0"\n'
            '[metrics]\nlisten = "127.0.0.1:0"\n'
        )
    proc = subprocess.Popen(
        [BINARY, "serve", "--config", cfg, "--data-dir", os.path.join(tmp, "data")],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "RUST_LOG": "info", "NO_COLOR": "1"},
    )
    deadline = time.time() + 30
    for line in proc.stderr:
        m = re.search(r"grpc_listen=(\S+)", line)
        if m:
            return proc, m.group(1)
        if time.time() > deadline:
            break
    proc.kill()
    raise SystemExit("hasync serve did not report its gRPC address")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        proc, addr = start_node(tmp)
        try:
            channel = grpc.insecure_channel(addr)
            grpc.channel_ready_future(channel).result(timeout=10)
            health = health_pb2_grpc.HealthStub(channel)
            r = health.Check(health_pb2.HealthCheckRequest(service=""))
            check("health SERVING", r.status == health_pb2.HealthCheckResponse.SERVING)

            repl = replication_pb2_grpc.ReplicationStub(channel)
            st = repl.GetStatus(replication_pb2.GetStatusRequest())
            check("status role master", st.role == replication_pb2.ROLE_MASTER)
            check("status node name", st.node_name == "py-master", st.node_name)

            mode = repl.SetReplicationMode(
                replication_pb2.SetReplicationModeRequest(mode=replication_pb2.REPLICATION_MODE_ASYNC)
            )
            check("mode async", mode.mode == replication_pb2.REPLICATION_MODE_ASYNC)

            msgs = messages_pb2_grpc.MessagesStub(channel)
            bodies = [b"alpha", b"beta", b"gamma"]
            put = msgs.Put(
                messages_pb2.PutRequest(
                    messages=[
                        messages_pb2.Message(topic="PyTopic", queue_id=0, tags="py", body=b)
                        for b in bodies
                    ]
                )
            )
            check("put PUT_OK", put.status == messages_pb2.PUT_OK, str(put.status))
            check("put stored", put.stored and len(put.results) == 3)

            read = msgs.Read(messages_pb2.ReadRequest(offset=0))
            check("read bodies", [m.body for m in read.messages] == bodies)
            check("read next offset", read.next_offset == put.end_offset)
            check("read tags", all(m.tags == "py" for m in read.messages))

            try:
                msgs.Put(messages_pb2.PutRequest(messages=[messages_pb2.Message(topic="")]))
                check("empty topic refused", False, "no error")
            except grpc.RpcError as e:
                check("empty topic refused", e.code() == grpc.StatusCode.INVALID_ARGUMENT, str(e.code()))
            st = repl.GetStatus(replication_pb2.GetStatusRequest())
            check("nothing written by the bad put", st.max_offset == put.end_offset)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
            check("clean exit on SIGTERM", code == 0, f"exit {code}")
    print(f"python api check: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
