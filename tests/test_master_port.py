"""The torch.distributed master port of the actor and reference groups. Upstream takes a free port from the kernel's
ephemeral range (bind to port 0), releases it and binds it again later in the worker's TCPStore; in between, any
outgoing connection on the machine (Ray's workers make many) can be given that port as its local port, and the
group fails with EADDRINUSE (CI's slow run hit it: "The server socket has failed to listen ... port: 36981").
Ports below the ephemeral range are never handed out to outgoing connections."""

import os
import socket

import pytest

from openrlhf_classmate import ports


def test_the_port_is_free_and_outside_the_ephemeral_and_ray_worker_ranges():
    low, high = ports.ephemeral_range()
    assert 1024 < low <= high  # this machine's /proc/sys/net/ipv4/ip_local_port_range
    for _ in range(50):
        port = ports.free_port()
        assert ports.FIRST_PORT <= port < low and not ports.RAY_WORKER_PORTS[0] <= port <= ports.RAY_WORKER_PORTS[1]
        with socket.socket() as sock:  # free: bindable as the TCPStore binds it
            sock.bind(("", port))


def test_a_port_in_use_is_not_returned(monkeypatch):
    low = ports.ephemeral_range()[0]
    busy = next(p for p in range(ports.FIRST_PORT + 5000, low) if ports._bindable(p) and ports._bindable(p + 1))
    with socket.socket() as holder:
        holder.bind(("", busy))
        holder.listen()
        candidates = iter([busy, busy, busy + 1])
        monkeypatch.setattr(ports._RNG, "randrange", lambda *a: next(candidates))
        assert ports.free_port() == busy + 1


def test_without_a_free_port_below_the_range_upstreams_choice_is_kept(monkeypatch):
    monkeypatch.setattr(ports, "_bindable", lambda port: False)
    port = ports.free_port()
    low, high = ports.ephemeral_range()
    assert low <= port <= high  # the kernel's own choice, as upstream makes it


def test_the_ephemeral_range_falls_back_to_linux_defaults(monkeypatch, tmp_path):
    monkeypatch.setattr(ports, "PORT_RANGE_FILE", str(tmp_path / "missing"))
    assert ports.ephemeral_range() == (32768, 60999)
    (tmp_path / "range").write_text("40000\t50000\n")
    monkeypatch.setattr(ports, "PORT_RANGE_FILE", str(tmp_path / "range"))
    assert ports.ephemeral_range() == (40000, 50000)


@pytest.mark.parametrize("name", ["ClassmatePolicyModelActor", "ClassmateReferenceModelActor"])
def test_the_actor_groups_rank_0_takes_its_master_port_from_here(name, monkeypatch):
    # upstream's BaseDistributedActor.__init__ (run for real) asks self._get_free_port() when no port is given
    from openrlhf_classmate.integration.training import actor

    for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)  # __init__ sets them in this process
    cls = getattr(actor, name)
    worker = cls.__new__(cls)
    monkeypatch.setattr(ports, "free_port", lambda: 23456)
    cls.__init__(worker, 1, 0, "127.0.0.1", None)  # upstream's: our classes define none
    assert worker.get_master_addr_port() == ("127.0.0.1", 23456) and os.environ["MASTER_PORT"] == "23456"

