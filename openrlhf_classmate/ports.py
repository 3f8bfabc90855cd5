"""Free TCP ports that a process binds some time after choosing them: the master port of the actor and reference
process groups (torch.distributed's TCPStore), and the test helpers' services. Shared across the layers (as
``errors``).

Upstream's ``BaseDistributedActor._get_free_port`` binds port 0, so the kernel picks the port from its ephemeral
range; the port is released and bound again later, by the TCPStore in ``deepspeed.init_distributed``. In between,
any outgoing connection on the machine may be given that same port as its local port (Ray's workers open many), and
the group fails with ``EADDRINUSE``. Ports below the ephemeral range are never handed out that way, so the choice
here is a free port between Ray's worker ports and the ephemeral range; upstream's own choice where there is none.
"""

from __future__ import annotations

import random
import socket

PORT_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LINUX_DEFAULT_RANGE = (32768, 60999)
RAY_WORKER_PORTS = (10002, 19999)  # ray start's default --min-worker-port / --max-worker-port
FIRST_PORT = RAY_WORKER_PORTS[1] + 1
TRIES = 64
# not the `random` module's state: seeded training code would make concurrent runs draw the same ports
_RNG = random.SystemRandom()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (Linux), or its default where unreadable."""
    try:
        with open(PORT_RANGE_FILE) as f:
            low, high = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        return LINUX_DEFAULT_RANGE
    return low, high


def _bindable(port: int) -> bool:
    try:
        with socket.socket() as sock:
            sock.bind(("", port))
        return True
    except OSError:
        return False


def free_port() -> int:
    """A port free now, from ``[FIRST_PORT, ephemeral low)`` where that range exists; else the kernel's choice."""
    low = ephemeral_range()[0]
    if low > FIRST_PORT:
        for _ in range(TRIES):
            port = _RNG.randrange(FIRST_PORT, low)
            if _bindable(port):
                return port
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]
