"""The sandbox engine behind the HTTP API: isolation set-up, the slot pool and queue, one program run, verdicts.

One *run* executes one program against one test (an assert statement, or one stdin/expected-stdout pair) in a
fresh process tree started by ``runner.py``. At most ``max_concurrency`` runs execute at once, one per *slot*; the
others wait in FIFO order. Root isolation gives each slot its own uid and cgroups, so after a run the service can
check that nothing of it is left (it kills and waits until the slot's cgroups are empty) before the slot is reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pwd
import secrets
import shutil
import signal
import stat
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from openrlhf_classmate.sandbox.cgroups import CgroupUnavailable, SlotCgroups
from openrlhf_classmate.sandbox.config import SandboxConfig
from openrlhf_classmate.sandbox.launch import DirectLauncher, Launched, LaunchError, ZygoteLauncher

logger = logging.getLogger("openrlhf_classmate.sandbox")

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "harness.py"), encoding="utf-8") as _f:
    HARNESS_SOURCE = _f.read()
RESULT_FD = 3
MIB = 1024 * 1024
# Memory the cgroup allows on top of the program's own limit: the runner's and init's interpreters (charged to the
# slot because they join it first) and the private /tmp and /dev/shm (tmpfs pages are charged too).
RUNNER_OVERHEAD = 48 * MIB
SHM_BYTES = 16 * MIB

PROBE_PROGRAM = r"""
import json, os, sys
facts = {"uid": os.getuid(), "pid": os.getpid(), "env": sorted(os.environ), "python": sys.version.split()[0]}
try:
    facts["interfaces"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:])
except OSError:
    facts["interfaces"] = None
try:
    open("/.openrlhf-sandbox-probe", "w").close()
    os.unlink("/.openrlhf-sandbox-probe")
    facts["root_writable"] = True
except OSError:
    facts["root_writable"] = False
print(json.dumps(facts))
"""


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program): the request gets a 500 and the caller must not score it."""


class QueueFull(RuntimeError):
    """More runs are waiting than ``max_queue`` allows."""


@dataclass
class RunOutcome:
    """How one program run ended, as observed from outside."""

    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    output_limit: bool = False
    oom: bool = False
    wall_s: float = 0.0
    cpu_s: float | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    result: str | None = None
    pid: int | None = None
    setup_error: str | None = None
    reported: bool = False
    """True once init's status line arrived."""


@dataclass
class TestVerdict:
    passed: bool
    reason: str | None = None
    """None when passed; else one of: assertion, exception, exit, killed, timeout, memory, output limit,
    wrong answer."""
    detail: str | None = None
    time_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Isolation:
    """What the service runs programs under; reported by /health."""

    mode: str
    uid_base: int | None
    python: str
    cgroups: SlotCgroups | None = None
    hidden: list[str] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)
    verified: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        ns = self.mode in ("root", "userns")
        return {
            "mode": self.mode,
            "pid_namespace": ns,
            "network_namespace": ns,
            "mount_namespace": ns,
            "read_only_root": ns,
            "private_tmp": ns,
            "hidden_paths": self.hidden if ns else [],
            "unprivileged_user": self.uid_base is not None or os.geteuid() != 0,
            "dedicated_uid_per_slot": self.uid_base is not None,
            "cgroups": f"v{self.cgroups.version}" if self.cgroups else None,
            "cgroup_dirs": list(self.cgroups.parents) if self.cgroups else [],
            "rlimits": ["cpu", "address_space", "processes", "file_size", "open_files", "core"],
            "empty_environment": True,
            "python": self.python,
            "verified": self.verified,
            "degraded": self.degraded,
        }


# ── start-up: choosing and checking the isolation ──


def _others_can_use(path: str) -> bool:
    """True when a user with no relation to the owner can traverse to and execute/read ``path``."""
    path = os.path.realpath(path)
    try:
        mode = os.stat(path).st_mode
        if not mode & stat.S_IXOTH:
            return False
        parent = os.path.dirname(path)
        while True:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            if parent == "/":
                return True
            parent = os.path.dirname(parent)
    except OSError:
        return False


def _prefix_of(interpreter: str) -> str:
    return os.path.dirname(os.path.dirname(os.path.realpath(interpreter)))


def pick_interpreter(cfg: SandboxConfig, for_other_user: bool) -> tuple[str, list[str]]:
    """The programs' interpreter, and a note when it is not the service's own."""
    base = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    candidates = [cfg.python] if cfg.python else [base, "/usr/bin/python3", "/usr/local/bin/python3"]
    for c in candidates:
        if not (os.path.isfile(c) and os.access(c, os.X_OK)):
            continue
        if not for_other_user or (_others_can_use(c) and _others_can_use(os.path.join(_prefix_of(c), "lib"))):
            notes = []
            if not cfg.python and c != base:
                notes.append(f"the service's interpreter {base} is not reachable by the sandbox user; programs run "
                             f"with {c} (--python to choose)")
            return c, notes
    who = "an unprivileged user" if for_other_user else "the service's user"
    raise SandboxError(f"no Python interpreter that {who} can run among {candidates}; pass --python")


def hide_paths(cfg: SandboxConfig, interpreter: str) -> tuple[list[str], list[str]]:
    """Directories to cover, and notes on the ones left visible (because the interpreter lives there)."""
    wanted = ["/root", "/home", os.path.expanduser("~"), os.getcwd(), *cfg.hide]
    keep = [os.path.realpath(interpreter), _prefix_of(interpreter)]
    hidden, notes = [], []
    for path in dict.fromkeys(os.path.realpath(p) for p in wanted):
        if path == "/" or not os.path.isdir(path):
            continue
        if any(k == path or k.startswith(path.rstrip("/") + "/") for k in keep):
            notes.append(f"{path} stays visible: the program interpreter {interpreter} lives there")
            continue
        hidden.append(path)
    return hidden, notes


def _check_uids(base: int, n: int) -> None:
    for uid in range(base, base + n):
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            continue
        raise SandboxError(f"uid {uid} belongs to the account {name!r}; choose another --uid-base")
    busy = _processes_of(range(base, base + n))
    if busy:
        raise SandboxError(f"processes {busy[:5]} already run under the sandbox uids {base}..{base + n - 1}; "
                           "choose another --uid-base")


def _remove_stale_dirs(tmp: str) -> None:
    """Working directories of sandbox services that died without cleaning up (their pid is in the name)."""
    for name in os.listdir(tmp):
        parts = name.split("-")
        if name.startswith("openrlhf-sandbox-") and len(parts) == 4 and parts[2].isdigit():
            try:
                os.kill(int(parts[2]), 0)
            except ProcessLookupError:
                shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
            except PermissionError:
                pass


def _processes_of(uids) -> list[int]:
    """Live processes (zombies excluded: they are dead, only not yet reaped) owned by any of ``uids``."""
    uids = set(uids)
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid in uids:
                    with open(f"/proc/{entry}/stat") as f:
                        if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                            out.append(int(entry))
            except (OSError, IndexError):
                pass
    return out


class Sandbox:
    """Owns the isolation, the slots and their queue. ``await start()`` before use, ``await stop()`` after."""

    def __init__(self, cfg: SandboxConfig):
        self.cfg = cfg
        self.isolation: Isolation | None = None
        self.launcher: ZygoteLauncher | DirectLauncher | None = None
        self.launcher_note: str | None = None
        self._free: asyncio.Queue[int] | None = None
        self._base_dir: str | None = None
        self.running = 0
        self.waiting = 0
        self.completed = 0
        self.quarantined: list[int] = []
        self.started_at = time.time()

    # ── lifecycle ──

    async def start(self) -> None:
        cfg = self.cfg
        _remove_stale_dirs(tempfile.gettempdir())
        self._base_dir = tempfile.mkdtemp(prefix=f"openrlhf-sandbox-{os.getpid()}-")
        os.chmod(self._base_dir, 0o711)
        root = os.geteuid() == 0
        if cfg.isolation == "auto":
            modes = ["root", "none"] if root else ["userns", "none"]
        else:
            modes = [cfg.isolation]
        self.launcher, self.launcher_note = ZygoteLauncher(), None
        if cfg.launcher != "direct":
            try:
                self.launcher.start()
            except (LaunchError, OSError) as e:
                if cfg.launcher == "zygote":
                    raise SandboxError(f"cannot start the zygote: {e}") from None
                self.launcher_note = f"runners start as new interpreters (no zygote: {e}): about 30 ms more per run"
        if cfg.launcher == "direct" or self.launcher_note:
            self.launcher = DirectLauncher()
        failures = []
        for mode in modes:
            try:
                self.isolation = await self._try_isolation(mode)
                break
            except SandboxError as e:
                failures.append(f"{mode}: {e}")
                logger.warning("sandbox isolation %s unavailable: %s", mode, e)
        if self.isolation is None:
            shutil.rmtree(self._base_dir, ignore_errors=True)
            self.launcher.stop()
            raise SandboxError("no isolation mode works here: " + "; ".join(failures))
        if self.launcher_note:
            self.isolation.degraded.append(self.launcher_note)
        self.isolation.degraded[:0] = [f"isolation {f}" for f in failures]
        if self.isolation.mode == "none":
            self.isolation.degraded.append(
                "isolation none: no pid, network or mount namespace; programs can use the network, see the host's "
                "files and write wherever the sandbox user may; only rlimits and a fresh session contain them")
        self._free = asyncio.Queue()
        for i in range(cfg.max_concurrency):
            self._free.put_nowait(i)
        logger.debug("sandbox ready: %s", json.dumps(self.isolation.describe()))

    async def _try_isolation(self, mode: str) -> Isolation:
        cfg = self.cfg
        root = os.geteuid() == 0
        if mode == "root" and not root:
            raise SandboxError("needs the service to run as root")
        if mode == "userns" and root:
            raise SandboxError("is for services that do not run as root (as root, use isolation root)")
        uid_base = cfg.uid_base if root else None  # never run a program as root, in any mode
        if uid_base is not None:
            _check_uids(uid_base, cfg.max_concurrency)
        python, notes = pick_interpreter(cfg, for_other_user=uid_base is not None)
        iso = Isolation(mode=mode, uid_base=uid_base, python=python, degraded=notes)
        if mode != "none":
            iso.hidden, notes = hide_paths(cfg, python)
            iso.degraded.extend(notes)
        if root:
            try:
                memory = cfg.memory_mb * MIB + cfg.disk_mb * MIB + SHM_BYTES + RUNNER_OVERHEAD
                iso.cgroups = SlotCgroups.create(cfg.max_concurrency, memory, cfg.max_processes + 4)
            except CgroupUnavailable as e:
                iso.degraded.append(f"no cgroups ({e}): memory is limited per process (RLIMIT_AS) and processes "
                                    "per uid (RLIMIT_NPROC), not per program")
        else:
            iso.degraded.append("no cgroups (needs root): memory is limited per process (RLIMIT_AS) and the process "
                                "count through RLIMIT_NPROC of the service's user")
        self.isolation = iso
        try:
            outcome = await self._execute(0, [python, "-I", "-B", "program.py"], {"program.py": PROBE_PROGRAM}, "",
                                          time_limit=30.0, result_fd=None)
            if outcome.setup_error:
                raise SandboxError(outcome.setup_error)
            if outcome.exit_code != 0:
                raise SandboxError(f"the probe program failed (status {outcome.exit_code or outcome.signal}): "
                                   f"{outcome.stderr.decode(errors='replace')[-300:]}")
            facts = json.loads(outcome.stdout)
            problems = []
            if facts["env"] != ["HOME", "LANG", "MALLOC_ARENA_MAX", "PATH"]:
                problems.append(f"environment {facts['env']}")
            if uid_base is not None and facts["uid"] != uid_base:
                problems.append(f"uid {facts['uid']}, not {uid_base}")
            if mode != "none":
                if facts["interfaces"] != ["lo"]:
                    problems.append(f"network interfaces {facts['interfaces']}")
                if facts["root_writable"]:
                    problems.append("/ is writable")
                if facts["pid"] > 10:
                    problems.append(f"pid {facts['pid']}: no pid namespace")
            if problems:
                raise SandboxError("the probe program saw " + ", ".join(problems))
            iso.verified = {k: facts[k] for k in ("uid", "pid", "interfaces", "root_writable", "python")}
            return iso
        except BaseException:
            if iso.cgroups:
                iso.cgroups.remove()
            self.isolation = None
            raise

    async def stop(self) -> None:
        """Kill what is left, remove the cgroups and the working directories. Idempotent."""
        if self.launcher is not None:
            self.launcher.stop()
        if self.isolation and self.isolation.cgroups:
            self.isolation.cgroups.remove()
            self.isolation.cgroups = None
        if self._base_dir:
            shutil.rmtree(self._base_dir, ignore_errors=True)
            self._base_dir = None

    def stats(self) -> dict[str, Any]:
        return {"limit": self.cfg.max_concurrency, "running": self.running, "queued": self.waiting,
                "max_queue": self.cfg.max_queue, "completed_runs": self.completed,
                "quarantined_slots": list(self.quarantined),
                "launcher_restarts": self.launcher.restarts if self.launcher else 0}

    # ── runs ──

    def reserve(self, n: int) -> None:
        """Admission control: refuse a request whose runs would overflow the queue."""
        if self.waiting + n > self.cfg.max_queue:
            raise QueueFull(f"{self.waiting} runs are queued and this request adds {n}; the limit is "
                            f"{self.cfg.max_queue} (--max-queue). Retry later.")

    async def run_assert(self, program: str, test: str, time_limit: float) -> TestVerdict:
        nonce = secrets.token_hex(16)
        files = {"program.py": program, ".test": test, ".nonce": nonce}
        argv = [self.isolation.python, "-I", "-B", "-c", HARNESS_SOURCE]
        outcome = await self._queued(argv, files, "", time_limit, RESULT_FD)
        return assert_verdict(outcome, nonce, time_limit)

    async def run_stdio(self, program: str, stdin: str, expected: str, time_limit: float) -> TestVerdict:
        argv = [self.isolation.python, "-I", "-B", "program.py"]
        outcome = await self._queued(argv, {"program.py": program}, stdin, time_limit, None)
        return stdio_verdict(outcome, expected, time_limit)

    async def _queued(self, argv, files, stdin, time_limit, result_fd) -> RunOutcome:
        self.waiting += 1
        try:
            slot = await self._free.get()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            outcome = await self._execute(slot, argv, files, stdin, time_limit, result_fd)
        finally:
            self.running -= 1
            self.completed += 1
            if slot not in self.quarantined:
                self._free.put_nowait(slot)
        if outcome.setup_error:
            raise SandboxError(f"sandbox set-up failed: {outcome.setup_error}")
        return outcome

    async def _execute(self, slot: int, argv: list[str], files: dict[str, str], stdin: str, time_limit: float,
                       result_fd: int | None) -> RunOutcome:
        """One run in ``slot`` (held by the caller). Leaves the slot empty: nothing of the run survives it."""
        cfg, iso = self.cfg, self.isolation
        uid = iso.uid_base + slot if iso.uid_base is not None else None
        workdir = None
        if iso.mode == "none":
            workdir = tempfile.mkdtemp(prefix=f"run-{slot}-", dir=self._base_dir)
            if uid is not None:
                os.chown(workdir, uid, uid)
            os.chmod(workdir, 0o700)
        status_r, status_w = os.pipe()
        spec = {
            "mode": iso.mode, "argv": argv, "files": files, "stdin": stdin, "workdir": workdir,
            "uid": uid, "gid": uid, "cgroups": iso.cgroups.slots[slot] if iso.cgroups else [],
            "hide": iso.hidden, "status_fd": status_w, "result_fd": result_fd,
            "limits": {"wall_s": time_limit, "cpu_s": time_limit, "address_space_bytes": cfg.memory_mb * MIB,
                       "processes": cfg.max_processes, "file_size_bytes": cfg.file_size_mb * MIB,
                       "open_files": cfg.open_files, "tmpfs_bytes": cfg.disk_mb * MIB, "shm_bytes": SHM_BYTES},
        }
        oom_before = iso.cgroups.oom_kills(slot) if iso.cgroups else 0
        outcome = RunOutcome()
        launched = None
        started = time.monotonic()
        try:
            try:
                launched, _ = await self.launcher.launch(status_w)
            except LaunchError as e:
                raise SandboxError(f"could not start a runner: {e}") from None
            finally:
                os.close(status_w)
            outcome = await self._supervise(launched, json.dumps(spec).encode(), time_limit)
            _read_status(status_r, outcome)
            if not outcome.wall_s:  # stopped by the service before init could report: time as seen from here
                outcome.wall_s = round(time.monotonic() - started, 4)
        finally:
            os.close(status_r)
            if launched is not None:
                if not launched.exited.is_set():
                    launched.kill()
                launched.close()
            await self._clean_slot(slot, uid)
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
        if iso.cgroups and iso.cgroups.oom_kills(slot) > oom_before:
            outcome.oom = True
        if not (outcome.reported or outcome.setup_error or outcome.timed_out or outcome.output_limit or outcome.oom):
            raise SandboxError("the runner ended without reporting how the program ended (killed from outside the "
                               "service?)")
        return outcome

    async def _supervise(self, launched: Launched, spec: bytes, time_limit: float) -> RunOutcome:
        """Feed the runner its spec, collect the capped outputs, stop it at the output cap or the backstop time."""
        cap = self.cfg.max_output_bytes
        outcome = RunOutcome()
        over = asyncio.Event()
        buffers: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

        async def pump(stream, name):
            # Read to the end even past the cap (discarding): a reader that stops reading never sees the end.
            buf = buffers[name]
            while chunk := await stream.read(65536):
                room = cap - len(buf)
                if room > 0:
                    buf += chunk[:room]
                if len(chunk) > room:
                    over.set()

        pumps = [asyncio.ensure_future(pump(launched.stdout, "stdout")),
                 asyncio.ensure_future(pump(launched.stderr, "stderr"))]
        waiter = asyncio.ensure_future(launched.exited.wait())
        over_waiter = asyncio.ensure_future(over.wait())
        try:
            await launched.send_spec(spec)
            done, _ = await asyncio.wait({waiter, over_waiter}, timeout=time_limit + self.cfg.grace_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            if waiter not in done:
                if over.is_set():
                    outcome.output_limit = True
                else:
                    outcome.timed_out = True  # the runner's own clock did not stop it: the service does
                launched.kill()  # init dies with it (death signal), and with init its whole pid namespace
                await asyncio.wait({waiter}, timeout=5.0)
            # The pipes close once the last process holding them is gone: at once with a pid namespace (init's
            # exit waits for all of it); without one, a stray process may hold them until the slot is cleaned.
            await asyncio.wait(pumps, timeout=0.5)
            if over.is_set():
                outcome.output_limit = True
        finally:
            for task in (*pumps, waiter, over_waiter):
                if not task.done():
                    task.cancel()
        outcome.stdout, outcome.stderr = bytes(buffers["stdout"]), bytes(buffers["stderr"])
        return outcome

    async def _clean_slot(self, slot: int, uid: int | None) -> None:
        """Kill whatever the run left (normally nothing: the pid namespace is gone) and wait until it is gone."""
        iso = self.isolation
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            left = []
            if iso.cgroups:
                left += iso.cgroups.kill_all(slot)
            if uid is not None:
                for pid in _processes_of([uid]):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    left.append(pid)
            if not left:
                return
            await asyncio.sleep(0.01)
        logger.error("slot %d: processes %s survived SIGKILL for 10 s; the slot is taken out of service", slot, left)
        self.quarantined.append(slot)


def _read_status(fd: int, outcome: RunOutcome) -> None:
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 1 << 20):
            data += chunk
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            status = json.loads(line)
        except ValueError:
            continue
        if "setup_error" in status:
            outcome.setup_error = status["setup_error"]
        outcome.exit_code = status.get("exit_code")
        outcome.signal = status.get("signal")
        outcome.timed_out = outcome.timed_out or bool(status.get("timed_out"))
        outcome.wall_s = status.get("wall_s", outcome.wall_s)
        outcome.cpu_s = status.get("cpu_s")
        outcome.result = status.get("result")
        outcome.pid = status.get("pid")
        outcome.reported = "pid" in status


# ── verdicts ──


def _last_line(data: bytes) -> str:
    lines = data.decode("utf-8", "replace").strip().splitlines()
    return lines[-1][:300] if lines else ""


def _limit_verdict(outcome: RunOutcome, time_limit: float) -> TestVerdict | None:
    """Verdicts for a run the sandbox stopped (or the kernel, at a limit), whatever the program printed."""
    t = outcome.wall_s
    if outcome.output_limit:
        return TestVerdict(False, "output limit", "stdout or stderr exceeded the service's output cap", t)
    if outcome.oom:  # before the timeout: a program whose worker was killed often waits for it until the end
        return TestVerdict(False, "memory", "a process was killed at the memory limit", t)
    if outcome.timed_out:
        return TestVerdict(False, "timeout", f"wall-clock limit of {time_limit:g} s", t)
    if outcome.signal in (signal.SIGXCPU, signal.SIGKILL) and (outcome.cpu_s or 0) >= max(1.0, time_limit) - 0.05:
        return TestVerdict(False, "timeout", f"CPU time limit of {time_limit:g} s", t)
    if _last_line(outcome.stderr).startswith("MemoryError"):
        return TestVerdict(False, "memory", "MemoryError", t)
    return None


def _ended(outcome: RunOutcome, when: str) -> TestVerdict:
    """A program that ended by itself without passing: killed by a signal, or exited."""
    when = f" {when}" if when else ""
    if outcome.signal is not None:
        try:
            name = f" ({signal.Signals(outcome.signal).name})"
        except ValueError:
            name = ""
        return TestVerdict(False, "killed", f"killed by signal {outcome.signal}{name}{when}", outcome.wall_s)
    last = _last_line(outcome.stderr)
    detail = f"exit code {outcome.exit_code}{when}" + (f": {last}" if last else "")
    return TestVerdict(False, "exit", detail, outcome.wall_s)


def assert_verdict(outcome: RunOutcome, nonce: str, time_limit: float) -> TestVerdict:
    limit = _limit_verdict(outcome, time_limit)
    if limit:
        return limit
    found = None
    for line in (outcome.result or "").splitlines():
        if line.startswith(nonce + " "):
            with contextlib.suppress(ValueError):
                verdict = json.loads(line[len(nonce) + 1:])
                if isinstance(verdict, dict) and verdict.get("pid") == outcome.pid:
                    found = verdict  # the program's own process, not one it forked
    t = outcome.wall_s
    if found is None:
        return _ended(outcome, "before the test finished")
    if found.get("verdict") == "pass":
        if outcome.exit_code == 0:
            return TestVerdict(True, None, None, t)
        return _ended(outcome, "after the test passed")
    return TestVerdict(False, str(found.get("verdict")), str(found.get("detail", ""))[:500], t)


def normalise_output(text: str) -> str:
    """Output as compared: trailing whitespace stripped from every line and from the end."""
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def stdio_verdict(outcome: RunOutcome, expected: str, time_limit: float) -> TestVerdict:
    limit = _limit_verdict(outcome, time_limit)
    if limit:
        return limit
    t = outcome.wall_s
    if outcome.signal is not None or outcome.exit_code != 0:
        verdict = _ended(outcome, "")
        if outcome.signal is None and "Error" in _last_line(outcome.stderr):
            verdict.reason = "exception"
        return verdict
    got = normalise_output(outcome.stdout.decode("utf-8", "replace"))
    want = normalise_output(expected)
    if got == want:
        return TestVerdict(True, None, None, t)
    return TestVerdict(False, "wrong answer", f"expected {want[:150]!r}, got {got[:150]!r}", t)
