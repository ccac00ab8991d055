"""Ports for other processes to listen on: torchrun's --master-port, a debug adapter per rank.

The launcher's own rendezvous needs none of this (its store binds port 0 and publishes the port
it got, rendezvous.py); these are ports a user or a test hands to a process that binds later.
"""

from __future__ import annotations

import random
import socket
from contextlib import ExitStack


def free_port(host: str = "127.0.0.1", count: int = 1) -> int:
    """A port P (with P+1 .. P+count-1) free now, for another process to listen on later:
    torchrun's --master-port, a debug adapter (rank R on BASE + R).

    Not one the kernel picks (bind to port 0): those come from the ephemeral range
    (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default), from which every
    outgoing connection on the machine takes its local port too, so between our check and the
    child's bind another job's connection could take it. Below that range a port is only ever
    taken by a bind that names it, so one that binds now stays free unless someone picks the
    same number: drawn at random (SystemRandom: a test that seeds `random` must not make two
    jobs draw alike). The launcher's own rendezvous needs none of this: its store binds port 0
    and publishes the port it got (rendezvous.py)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768   # Linux's default start; macOS and Windows start at 49152, above it
    low = max(low, 2048)   # a range that starts lower leaves nothing below it but 1024
    draw = random.SystemRandom()
    for _ in range(200):
        port = draw.randrange(max(1024, low // 2), low - count + 1)
        with ExitStack() as held:
            try:
                for p in range(port, port + count):
                    held.enter_context(socket.socket()).bind((host, p))
            except OSError:
                continue   # in use (or waiting out a closed connection): draw again
            return port
    raise OSError(f"no {count} free port(s) on {host} in {max(1024, low // 2)}-{low - 1}")
