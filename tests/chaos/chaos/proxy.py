"""A userspace TCP proxy for the HA link: delay, bandwidth limit and stall (no `tc netem` here).

Run inside a slave's namespace, listening on loopback, forwarding to the master's HA address:

    python3 -m chaos.proxy --listen 127.0.0.1:10999 --target 198.18.0.11:10912 --control SOCK

The slave's `slave.master-ha` points at the listen address, so the master still sees the slave's
own IP. The harness changes the link at run time through the unix socket SOCK (unix sockets do
not depend on the network namespace): one JSON object per line, any of
`{"delay_ms": 50, "rate": 262144, "stall": true}`; the answer is the settings now in force.
- delay_ms: every chunk is held this long before it is forwarded (both directions);
- rate: bytes per second per direction (0 = unlimited), a token bucket;
- stall: nothing is read or forwarded in either direction (connections stay open), as a slave
  whose network or process hangs.
`{"drop": true}` closes every proxied connection once.
"""

import argparse
import asyncio
import json
import os
import time

CHUNK = 64 * 1024


class Link:
    def __init__(self):
        self.delay_ms = 0
        self.rate = 0
        self.stall = False
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.conns = set()

    def settings(self):
        return {"delay_ms": self.delay_ms, "rate": self.rate, "stall": self.stall}

    def apply(self, req):
        if "delay_ms" in req:
            self.delay_ms = max(0, int(req["delay_ms"]))
        if "rate" in req:
            self.rate = max(0, int(req["rate"]))
        if "stall" in req:
            self.stall = bool(req["stall"])
            if self.stall:
                self.resumed.clear()
            else:
                self.resumed.set()
        if req.get("drop"):
            for w in list(self.conns):
                w.close()


async def pump(link, reader, writer, peer_writer):
    """Reads chunks from reader and forwards them to peer_writer, as the link says."""
    queue = asyncio.Queue(maxsize=64)

    async def read_side():
        try:
            while True:
                await link.resumed.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                await queue.put((time.monotonic(), data))
        except (ConnectionError, OSError):
            pass
        await queue.put((0.0, b""))

    async def write_side():
        allowance, last = 0.0, time.monotonic()
        try:
            while True:
                born, data = await queue.get()
                if not data:
                    break
                wait = born + link.delay_ms / 1000.0 - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await link.resumed.wait()
                view = memoryview(data)
                while view:
                    if link.rate:
                        now = time.monotonic()
                        allowance = min(link.rate, allowance + (now - last) * link.rate)
                        last = now
                        if allowance < 1:
                            await asyncio.sleep(min(0.05, (1 - allowance) / link.rate))
                            continue
                        n = min(len(view), int(allowance))
                        allowance -= n
                    else:
                        n = len(view)
                    peer_writer.write(view[:n])
                    await peer_writer.drain()
                    view = view[n:]
                    await link.resumed.wait()
        except (ConnectionError, OSError):
            pass
        finally:
            peer_writer.close()

    await asyncio.gather(read_side(), write_side())


async def handle(link, target, c_reader, c_writer):
    host, port = target
    try:
        s_reader, s_writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
    except (OSError, asyncio.TimeoutError):
        c_writer.close()
        return
    link.conns.update((c_writer, s_writer))
    try:
        await asyncio.gather(
            pump(link, c_reader, c_writer, s_writer), pump(link, s_reader, s_writer, c_writer)
        )
    finally:
        link.conns.discard(c_writer)
        link.conns.discard(s_writer)
        c_writer.close()
        s_writer.close()


async def control(link, reader, writer):
    try:
        line = await asyncio.wait_for(reader.readline(), 5)
        link.apply(json.loads(line or b"{}"))
        writer.write((json.dumps(link.settings()) + "\n").encode())
        await writer.drain()
    except (ValueError, OSError, asyncio.TimeoutError) as e:
        writer.write((json.dumps({"error": str(e)}) + "\n").encode())
    finally:
        writer.close()


async def main(args):
    link = Link()
    lhost, lport = args.listen.rsplit(":", 1)
    thost, tport = args.target.rsplit(":", 1)
    target = (thost, int(tport))
    server = await asyncio.start_server(
        lambda r, w: handle(link, target, r, w), lhost, int(lport)
    )
    if os.path.exists(args.control):
        os.unlink(args.control)
    ctl = await asyncio.start_unix_server(lambda r, w: control(link, r, w), args.control)
    print("proxy ready", flush=True)
    async with server, ctl:
        await asyncio.gather(server.serve_forever(), ctl.serve_forever())


def set_link(control_path, **settings):
    """Client side: changes a running proxy's link; returns the settings now in force."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(control_path)
        s.sendall((json.dumps(settings) + "\n").encode())
        data = b""
        while not data.endswith(b"\n"):
            part = s.recv(4096)
            if not part:
                break
            data += part
    return json.loads(data or b"{}")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--control", required=True)
    asyncio.run(main(p.parse_args()))
