"""Settings of the sandbox service (one dataclass; ``python -m openrlhf_classmate.sandbox --help`` lists them)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

ISOLATIONS = ("auto", "root", "userns", "none")
LAUNCHERS = ("auto", "zygote", "direct")


@dataclass
class SandboxConfig:
    """Where the service listens, how programs are isolated and limited, and what requests may hold."""

    host: str = field(default="127.0.0.1", metadata={"help": "Address to listen on (loopback by default)"})
    port: int = field(default=8001, metadata={"help": "Port to listen on"})
    isolation: str = field(
        default="auto",
        metadata={"help": "root: namespaces (pid, net, mount, ipc, uts, cgroup), a dedicated unprivileged uid per slot and "
                          "cgroups; needs root. userns: the same namespaces through an unprivileged user namespace, "
                          "for a service that does not run as root; programs run as the service's user. none: rlimits and an empty environment only. auto: "
                          "the strongest that works here (checked at start-up; /health says which)",
                  "choices": ISOLATIONS},
    )
    max_concurrency: int = field(
        default_factory=lambda: os.cpu_count() or 1,
        metadata={"help": "Programs running at once (each test is one program run); more wait in a FIFO queue. "
                          ">= 1, default: the number of CPUs"},
    )
    max_queue: int = field(
        default=4096,
        metadata={"help": "Program runs allowed to wait; a request that would exceed it gets 503 (retry later)"},
    )
    python: str | None = field(
        default=None,
        metadata={"help": "Interpreter that runs the programs (default: the service's base interpreter when the "
                          "sandbox user can execute it, else python3 from /usr/bin or /usr/local/bin)"},
    )
    default_time_limit: float = field(
        default=10.0, metadata={"help": "Seconds per test when a request gives no max_execution_time"}
    )
    max_time_limit: float = field(
        default=60.0, metadata={"help": "Largest max_execution_time a request may ask for (seconds); more is a 422"}
    )
    memory_mb: int = field(
        default=1024,
        metadata={"help": "Address-space limit of each program process (RLIMIT_AS, MiB); with cgroups also the "
                          "memory limit of the whole program (all its processes, its /tmp included)"},
    )
    max_processes: int = field(
        default=32, metadata={"help": "Processes and threads one program may have at once (RLIMIT_NPROC, cgroup pids)"}
    )
    file_size_mb: int = field(default=16, metadata={"help": "Largest file a program may write (RLIMIT_FSIZE, MiB)"})
    disk_mb: int = field(default=64, metadata={"help": "Size of the program's private /tmp (tmpfs, MiB)"})
    open_files: int = field(default=256, metadata={"help": "Open file descriptors per process (RLIMIT_NOFILE)"})
    max_output_kb: int = field(
        default=1024,
        metadata={"help": "Bytes read from a program's stdout, and from its stderr (KiB each); more stops the program "
                          "with the verdict 'output limit'"},
    )
    max_request_mb: float = field(default=16.0, metadata={"help": "Largest request body (MiB); more is a 413"})
    max_tests: int = field(default=512, metadata={"help": "Most tests in one request; more is a 422"})
    uid_base: int = field(
        default=61000,
        metadata={"help": "Root isolation: slot i runs programs as uid/gid uid_base + i (must belong to no account)"},
    )
    hide: list[str] = field(
        default_factory=list,
        metadata={"help": "Extra directories programs must not see (covered by an empty tmpfs), on top of the "
                          "defaults: /root, /home and the service's working directory", "nargs": "*"},
    )
    launcher: str = field(
        default="auto",
        metadata={"help": "zygote: runners are forked from one pre-started process (fast; needs pidfds, Linux 5.3+); "
                          "direct: a new interpreter per run; auto: zygote where it works", "choices": LAUNCHERS},
    )
    grace_s: float = field(
        default=5.0,
        metadata={"help": "Seconds beyond a program's time limit after which the service itself kills the run "
                          "(start-up and teardown are not counted against the program)"},
    )

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"--port {self.port!r} is not a TCP port: give one in [1, 65535] (the default is 8001; "
                             "0 picks a free one)")
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {ISOLATIONS}, got {self.isolation!r}")
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {LAUNCHERS}, got {self.launcher!r}")
        positive = {
            "max_concurrency": self.max_concurrency, "max_queue": self.max_queue, "memory_mb": self.memory_mb,
            "max_processes": self.max_processes, "file_size_mb": self.file_size_mb, "disk_mb": self.disk_mb,
            "open_files": self.open_files, "max_output_kb": self.max_output_kb, "max_tests": self.max_tests,
            "default_time_limit": self.default_time_limit, "max_time_limit": self.max_time_limit,
            "max_request_mb": self.max_request_mb, "grace_s": self.grace_s,
        }
        bad = [f"{k}={v}" for k, v in positive.items() if not 0 < v < math.inf]  # NaN fails the comparison
        if bad:
            raise ValueError(f"these settings must be finite numbers > 0: {', '.join(bad)}")
        if self.default_time_limit > self.max_time_limit:
            raise ValueError(f"default_time_limit {self.default_time_limit} exceeds max_time_limit {self.max_time_limit}")
        if self.open_files < 16:
            raise ValueError(f"open_files must be >= 16 (the interpreter needs a few), got {self.open_files}")
        if not 1000 <= self.uid_base <= 2**31 - 2**16:
            raise ValueError(f"uid_base must be in [1000, 2^31 - 65536], got {self.uid_base}")

    @property
    def max_output_bytes(self) -> int:
        return self.max_output_kb * 1024

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mb * 1024 * 1024)
