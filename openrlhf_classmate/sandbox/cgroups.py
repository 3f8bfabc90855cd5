"""Per-slot cgroups: one memory limit and one process limit for a whole program (all its processes), its OOM kills
counted, and every process in it killed at the end of a run.

Created under the service's own cgroup as ``openrlhf-sandbox-<pid>/slot-<i>``: with cgroup v1 in the memory and pids
hierarchies; with cgroup v2 only where the service's cgroup already delegates the memory and pids controllers to
its children (a v2 cgroup holding processes cannot enable them itself). Anything else leaves cgroups off, and the
service says why in /health.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

CGROUP_ROOT = "/sys/fs/cgroup"


class CgroupUnavailable(Exception):
    pass


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _own_cgroups() -> dict[str, str]:
    """controller ("memory", "pids", or "" for v2) -> this process's cgroup path inside that hierarchy."""
    out = {}
    for line in _read("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(directory: str) -> None:
    """Delete the (empty) cgroups of sandbox services that died without cleaning up (killed with SIGKILL)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        pid = name[len("openrlhf-sandbox-"):]
        if name.startswith("openrlhf-sandbox-") and pid.isdigit() and not _pid_alive(int(pid)):
            path = os.path.join(directory, name)
            for slot in os.listdir(path):
                if os.path.isdir(os.path.join(path, slot)):
                    try:
                        os.rmdir(os.path.join(path, slot))
                    except OSError:
                        pass
            try:
                os.rmdir(path)
            except OSError:
                pass


@dataclass
class SlotCgroups:
    """The cgroup directories of each slot (one per hierarchy)."""

    version: int
    parents: list[str]
    slots: list[list[str]] = field(default_factory=list)

    @classmethod
    def create(cls, n_slots: int, memory_bytes: int, max_pids: int) -> SlotCgroups:
        own = _own_cgroups()
        name = f"openrlhf-sandbox-{os.getpid()}"
        if "memory" in own and "pids" in own and os.path.isdir(os.path.join(CGROUP_ROOT, "memory")):
            version = 1
            parents = [os.path.join(CGROUP_ROOT, "memory", own["memory"].lstrip("/"), name),
                       os.path.join(CGROUP_ROOT, "pids", own["pids"].lstrip("/"), name)]
        elif "" in own and os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
            version = 2
            base = os.path.join(CGROUP_ROOT, own[""].lstrip("/"))
            delegated = _read(os.path.join(base, "cgroup.subtree_control")).split()
            if not {"memory", "pids"} <= set(delegated):
                raise CgroupUnavailable(f"cgroup v2: {base} does not delegate memory and pids to its children "
                                        f"(cgroup.subtree_control: {' '.join(delegated) or 'empty'})")
            parents = [os.path.join(base, name)]
        else:
            raise CgroupUnavailable("no memory and pids cgroup controllers found")
        for parent in parents:
            remove_stale(os.path.dirname(parent))
        groups = cls(version, parents)
        try:
            for parent in parents:
                os.makedirs(parent, exist_ok=True)
            for i in range(n_slots):
                dirs = [os.path.join(p, f"slot-{i}") for p in parents]
                for d in dirs:
                    os.makedirs(d, exist_ok=True)
                groups.slots.append(dirs)
                groups._limit(dirs, memory_bytes, max_pids)
        except OSError as e:
            groups.remove()
            raise CgroupUnavailable(f"cannot create or configure cgroups under {parents[0]}: {e}") from None
        return groups

    def _limit(self, dirs: list[str], memory_bytes: int, max_pids: int) -> None:
        if self.version == 1:
            mem, pids = dirs
            _write(os.path.join(mem, "memory.limit_in_bytes"), str(memory_bytes))
            if os.path.exists(os.path.join(mem, "memory.memsw.limit_in_bytes")):
                _write(os.path.join(mem, "memory.memsw.limit_in_bytes"), str(memory_bytes))
            _write(os.path.join(pids, "pids.max"), str(max_pids))
        else:
            (d,) = dirs
            _write(os.path.join(d, "memory.max"), str(memory_bytes))
            if os.path.exists(os.path.join(d, "memory.swap.max")):
                _write(os.path.join(d, "memory.swap.max"), "0")
            _write(os.path.join(d, "pids.max"), str(max_pids))

    def oom_kills(self, slot: int) -> int:
        """How many processes the kernel has OOM-killed in this slot so far (a counter: compare before/after)."""
        path = os.path.join(self.slots[slot][0], "memory.oom_control" if self.version == 1 else "memory.events")
        try:
            for line in _read(path).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except OSError:
            pass
        return 0

    def pids(self, slot: int) -> list[int]:
        out: set[int] = set()
        for d in self.slots[slot]:
            try:
                out.update(int(p) for p in _read(os.path.join(d, "cgroup.procs")).split())
            except OSError:
                pass
        return sorted(out)

    def kill_all(self, slot: int) -> list[int]:
        """SIGKILL every process in the slot; returns the pids that were there."""
        found = self.pids(slot)
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return found

    def remove(self) -> None:
        """Kill whatever is left and delete the slot groups and their parents (best effort)."""
        for i, dirs in enumerate(self.slots):
            deadline = time.monotonic() + 5
            while self.kill_all(i) and time.monotonic() < deadline:
                time.sleep(0.05)
            for d in dirs:
                try:
                    os.rmdir(d)
                except OSError:
                    pass
        for p in self.parents:
            try:
                os.rmdir(p)
            except OSError:
                pass
