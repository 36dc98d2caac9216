"""Hostile clients for a training process's /metrics and control endpoint (used by ``endpoints.py``).

    python benchmarks/attack.py scrape,idle,control --metrics 127.0.0.1:9464 --control 127.0.0.1:9470

Runs until its stdin closes, then prints one JSON line of counts. Modes (comma list):

* ``scrape``: ``--threads`` clients, each asking for /metrics in a loop (every other one gzipped);
* ``control``: ``--threads`` clients, each sending the control endpoint requests it must refuse, in a loop
  (wrong token, nested JSON, a bad Content-Length, an unknown path, a reset in mid-request);
* ``idle``: ``--idle`` connections that never send a byte, split between both endpoints, reopened as soon
  as the server closes one.

It prints ``ready`` once the idle connections are open. ``--nice`` (default 19) lowers its own priority, so
that on a small machine the clients' CPU use does not stand for the cost the attack has on the server.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import struct
import sys
import threading
from collections import Counter
from collections.abc import Callable

NESTED = b"[" * 30_000 + b"]" * 30_000


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def exchange(target: tuple[str, int], request: bytes, reset: bool = False) -> int:
    """Send ``request``; read the answer to its end (or reset the connection); the bytes read."""
    with socket.create_connection(target, timeout=15) as sock:
        sock.sendall(request)
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return 0
        total = 0
        while chunk := sock.recv(65536):
            total += len(chunk)
        return total


def scraper(target: tuple[str, int], index: int, counts: Counter[str], done: threading.Event) -> None:
    gzip = b"Accept-Encoding: gzip\r\n" if index % 2 else b""
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + gzip + b"\r\n"
    while not done.is_set():
        try:
            counts["scrape bytes"] += exchange(target, request)
            counts["scrapes"] += 1
        except OSError:
            counts["scrape errors"] += 1


def controller(target: tuple[str, int], token: str, counts: Counter[str], done: threading.Event) -> None:
    auth = f"Authorization: Bearer {token}\r\n".encode()
    requests = [
        (b"POST /v1/stop HTTP/1.1\r\nAuthorization: Bearer wrong\r\nContent-Length: 2\r\n\r\n{}", False),
        (b"POST /v1/stop HTTP/1.1\r\n" + auth + f"Content-Length: {len(NESTED)}\r\n\r\n".encode() + NESTED, False),
        (b"POST /v1/capture HTTP/1.1\r\n" + auth + b"Content-Length: abc\r\n\r\n{}", False),
        (b"GET /v1/nothing HTTP/1.1\r\n" + auth + b"\r\n", False),
        (b"POST /v1/stop HTTP/1.1\r\n" + auth + b"Content-Le", True),
    ]
    i = 0
    while not done.is_set():
        request, reset = requests[i % len(requests)]
        i += 1
        try:
            exchange(target, request, reset)
            counts["control requests"] += 1
        except OSError:
            counts["control errors"] += 1


def idler(targets: list[tuple[str, int]], count: int, counts: Counter[str], done: threading.Event,
          ready: Callable[[], None]) -> None:
    selector = selectors.DefaultSelector()

    def open_one(i: int) -> None:
        try:
            sock = socket.create_connection(targets[i % len(targets)], timeout=15)
        except OSError:
            counts["idle connect errors"] += 1
            return
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, i)

    for i in range(count):
        open_one(i)
    ready()
    while not done.is_set():
        for key, _ in selector.select(0.2):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            selector.unregister(sock)
            sock.close()
            counts["idle closed by server"] += 1
            open_one(key.data)
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modes", help="comma list of scrape, control, idle")
    parser.add_argument("--metrics", type=address, required=True, metavar="HOST:PORT")
    parser.add_argument("--control", type=address, required=True, metavar="HOST:PORT")
    parser.add_argument("--token", default="")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--idle", type=int, default=300)
    parser.add_argument("--nice", type=int, default=19)
    args = parser.parse_args(argv)
    os.nice(args.nice)
    modes = set(args.modes.split(","))
    counts: Counter[str] = Counter()
    done = threading.Event()
    threads = []
    ready = threading.Event()
    if "idle" in modes:
        threads.append(threading.Thread(target=idler, args=([args.metrics, args.control], args.idle, counts, done,
                                                            ready.set)))
    else:
        ready.set()
    for i in range(args.threads):
        if "scrape" in modes:
            threads.append(threading.Thread(target=scraper, args=(args.metrics, i, counts, done)))
        if "control" in modes:
            threads.append(threading.Thread(target=controller, args=(args.control, args.token, counts, done)))
    for thread in threads:
        thread.start()
    ready.wait()
    print("ready", flush=True)
    sys.stdin.read()
    done.set()
    for thread in threads:
        thread.join(20)
    print(json.dumps(dict(counts)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
