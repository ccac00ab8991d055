"""free_port(): ports another process will bind later, drawn where no outgoing connection
takes its local port (below the ephemeral range), and free when handed out."""

import random
import socket

from minitron.launcher import free_port


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except OSError:
        return 32768


def test_ports_are_below_the_ephemeral_range_and_bind():
    start = _ephemeral_start()
    for count in (1, 4):
        port = free_port(count=count)
        assert 1024 <= port and port + count - 1 < start, (port, count, start)
        for p in range(port, port + count):
            with socket.socket() as s:
                s.bind(("127.0.0.1", p))   # raises if it was not free


def test_a_port_in_use_is_drawn_again(monkeypatch):
    """The draw lands on a listening port (and, for two ports, on one just below it): each is
    refused and the next draw is handed out."""
    other = free_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", free_port()))
        busy.listen()
        held = busy.getsockname()[1]
        for count, draws in ((1, [held, other]), (2, [held - 1, other])):
            left = iter(draws)
            monkeypatch.setattr(random, "SystemRandom", lambda: type("Draw", (), {
                "randrange": lambda self, a, b: next(left)})())
            assert free_port(count=count) == other, count


def test_a_seeded_random_module_does_not_repeat_the_draws():
    # Two test processes that both seed `random` must not draw the same ports.
    random.seed(0)
    first = [free_port() for _ in range(3)]
    random.seed(0)
    assert [free_port() for _ in range(3)] != first
