"""Where the ranks meet: the rendezvous store, and what ties a rank's life to the launcher's.

``init_process_group(init_method="env://")`` makes every rank connect to a key-value store at
MASTER_ADDR:MASTER_PORT, where they exchange addresses before opening connections to each
other (and again for every new group). torchrun's agent serves that store itself and tells
the workers so with ``TORCHELASTIC_USE_AGENT_STORE=True``; minitron's launcher does the same.

Anyone who can reach that store can join the job or overwrite its keys, so it listens on
MASTER_ADDR only (loopback by default). torch's TCPStore server binds every interface
whatever host it is given (its libuv backend listens on ``::``, IPv4 and IPv6); the supported
way to choose is ``master_listen_fd``: bind a socket ourselves and hand the store its fd.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import sys

from minitron.launcher.processes import stop_signals_held

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (0: any free port), not yet listening: the store listens."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this rank if the launcher dies (killed, crashed): otherwise ranks
    blocked in a collective would wait out the distributed timeout, orphaned. No-op elsewhere."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() == 1:  # the launcher died before we asked
            os._exit(1)
    except (OSError, AttributeError):
        pass


class StoreKeeper:
    """Serve the ranks' rendezvous TCPStore from a process of the launcher's, as torchrun's
    agent does, instead of from rank 0.

    With env:// initialisation rank 0 hosts it, and a rank 0 that finishes first takes it
    down while slower ranks may still need it. Here it outlives every rank. It is a forked
    child, not a thread of the launcher: a TCPStore server runs threads, and the ranks are
    forked from the launcher afterwards — a fork copies a lock a thread holds, never the
    thread that would release it, and the child waits on it forever.
    """

    def __init__(self, cfg, scratch=None):
        if cfg.master_addr not in LOOPBACK:
            print(f"minitron: warning: the rendezvous listens on {cfg.master_addr}: anyone who can reach "
                  f"it can join or disturb this job", file=sys.stderr)
        port_r, port_w = os.pipe()
        self._stop_r, self._stop_w = os.pipe()
        self.pid = None
        try:
            with stop_signals_held() as mask:   # a stop now would be lost in the fork's hooks: see there
                self.pid = os.fork()
                if self.pid == 0:
                    self._serve(cfg, scratch, port_r, port_w, mask)  # never returns
                os.close(port_w)
                os.close(self._stop_r)
            answer = os.read(port_r, 4096).decode()
        except BaseException:   # a held Ctrl-C or SIGTERM, delivered as the block ended
            if self.pid is not None:
                self.close()
            raise
        finally:
            os.close(port_r)
        if not answer.isdigit():
            self.close()
            raise ValueError(f"cannot serve the rendezvous on {cfg.master_addr}:{cfg.master_port}: "
                             f"{answer.removeprefix('error ')}; choose another --master-port")
        cfg.master_port = int(answer)

    def _serve(self, cfg, scratch, port_r: int, port_w: int, mask: set) -> None:
        """Body of the keeper: serve the store until the launcher closes its end of the stop pipe
        (or dies). Never returns."""
        code = 1
        try:
            os.setsid()
            die_with_parent()
            os.close(port_r)
            os.close(self._stop_w)
            # The launcher killed outright takes us down with SIGTERM: still clean up.
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            import torch.distributed  # loaded in the launcher by now; this module stays torch-free
            sock = bound_socket(cfg.master_addr, cfg.master_port or 0)
            store = torch.distributed.TCPStore(cfg.master_addr, sock.getsockname()[1], cfg.world_size,
                                               is_master=True, wait_for_workers=False,
                                               master_listen_fd=sock.fileno())
            os.write(port_w, str(store.port).encode())
            os.close(port_w)
            port_w = None
            os.read(self._stop_r, 1)  # until the launcher closes its end (or dies)
            code = 0
        except BaseException as exc:
            if port_w is not None:
                os.write(port_w, f"error {exc}".encode())
        finally:
            if scratch is not None:  # the run's scratch folder outlives a SIGKILLed launcher otherwise
                shutil.rmtree(scratch, ignore_errors=True)
            os._exit(code)

    def close(self) -> None:
        os.close(self._stop_w)
        os.waitpid(self.pid, 0)
