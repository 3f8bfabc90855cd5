"""Launch one untrusted program in its own namespaces, under its limits; report how it ended.

Run by the sandbox service, never imported by it: ``python -I -S -B runner.py`` with a JSON spec on stdin and a
status pipe on the file descriptor the spec names, or (the default) forked per run from one ``runner.py --zygote FD``
process that has already started and imported everything (see ``zygote``). Standard library only, and Python 3.10
compatible, because it runs before anything else is trusted and must start fast.

Process tree (isolation ``root`` or ``userns``)::

    runner (child of the zygote or the service)  joins the slot's cgroups, unshares the namespaces (pid, mount,
      │                                          network, IPC, UTS, cgroup), waits for init
      └─ init (pid 1 of the new pid namespace)   mounts, forks the program, waits for it (wall-clock limit)
           └─ program                            rlimits, unprivileged uid, no_new_privs, fixed environment, exec

When init exits, the kernel kills every other process of its pid namespace and waits for them, so nothing the
program started survives it; init dies with the runner and the runner with its parent (PR_SET_PDEATHSIG), so
killing the runner (the service's timeout or output cap), or the service itself, ends everything too. Isolation
``none`` skips the namespaces: the program gets its own session and init kills that process group (best effort: a
program can leave its session; a service running as root also kills whatever its slot's uid still runs).

Spec fields: ``mode`` (root | userns | none), ``argv`` (the program's command line), ``files`` (name -> text,
written into the working directory before the program starts), ``stdin`` (text), ``workdir`` (only for mode
none: an existing directory; namespaced modes get a fresh tmpfs at /tmp), ``uid`` / ``gid`` (a service running as
root: the unprivileged ids to run the program as), ``cgroups`` (cgroup directories to join), ``limits`` (``wall_s``, ``cpu_s``,
``address_space_bytes``, ``processes``, ``file_size_bytes``, ``open_files``, ``tmpfs_bytes``, ``shm_bytes``),
``hide`` (directories covered by an empty read-only tmpfs), ``status_fd``, ``result_fd`` (the fd number the
program gets for the test harness's verdict, or null).

Status (one JSON line on ``status_fd``): ``pid`` (the program's, as the program sees it), ``exit_code`` or ``signal``, ``timed_out``, ``wall_s``, ``cpu_s``,
``max_rss_kb``, ``result`` (what the program wrote on the result fd, at most 64 KiB), or ``setup_error``.
"""

import ctypes
import json
import os
import resource
import select
import signal
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_RELATIME = 0x200000
MS_STRICTATIME = 0x1000000

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

_MOUNT_OPTION_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
                       "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
RESULT_CAP = 65536
MAX_FD = 1 << 20

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class SetupError(Exception):
    pass


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)} (errno {err})")


def _b(s):
    return None if s is None else s.encode()


def mount(source, target, fstype, flags, data=None) -> None:
    _check(_libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)), f"mount {fstype or source} on {target}")


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) + 1 and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def remount_everything_read_only() -> None:
    """Make every mount of this (private) mount namespace read-only, keeping each mount's other flags (a user
    namespace may not clear nosuid/nodev/noexec/atime flags it inherited, so they are passed back unchanged)."""
    with open("/proc/self/mountinfo") as f:
        entries = [line.split() for line in f]
    seen = set()
    for fields in entries:
        target = _unescape(fields[4])
        if target in seen:
            continue
        seen.add(target)
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        for opt in fields[5].split(","):
            flags |= _MOUNT_OPTION_FLAGS.get(opt, 0)
        if _libc.mount(None, target.encode(), None, flags, None) != 0:
            err = ctypes.get_errno()
            if target == "/" or err not in (2, 13):  # a mount point that vanished, or one we may not see: skip
                raise SetupError(f"read-only remount of {target}: {os.strerror(err)}")


def setup_mounts(spec: dict) -> str:
    """Private, read-only view of the host; hidden directories; fresh /proc, /tmp (the working directory) and
    /dev/shm. Returns the working directory."""
    limits = spec["limits"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here propagates back to the host
    remount_everything_read_only()
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for path in spec.get("hide", []):
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0555")
    owner = f"uid={spec['uid']},gid={spec['gid']}" if spec.get("uid") is not None else ""
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={limits['tmpfs_bytes']},nr_inodes=4096,mode=0700" + (f",{owner}" if owner else ""))
    if os.path.isdir("/dev/shm"):
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              f"size={limits['shm_bytes']},nr_inodes=1024,mode=1777")
    return "/tmp"


def write_files(workdir: str, files: dict, uid, gid) -> None:
    for name, text in files.items():
        path = os.path.join(workdir, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8", "surrogatepass"))
        if uid is not None:
            os.chown(path, uid, gid)


def _set_oom_score_adj(value: int) -> None:
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(value))
    except OSError:
        pass


def set_limits(limits: dict, extra_processes: int) -> None:
    cpu = max(1, int(limits["cpu_s"] + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["address_space_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"] + extra_processes,) * 2)


def user_processes(uid: int) -> int:
    """Processes (threads included, as RLIMIT_NPROC counts them) the user already runs."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                st = os.stat(f"/proc/{entry}")
                if st.st_uid == uid:
                    with open(f"/proc/{entry}/stat") as f:
                        count += int(f.read().rsplit(")", 1)[1].split()[17])
            except (OSError, ValueError, IndexError):
                pass
    return count


def exec_program(spec: dict, workdir: str, stdin_fd: int, result_w) -> None:
    """In the program's process: limits, identity, descriptors, then exec. Never returns."""
    try:
        os.setsid()
        os.dup2(stdin_fd, 0)
        keep = spec.get("result_fd") if result_w is not None else None
        if keep is not None:
            if result_w != keep:
                os.dup2(result_w, keep)
            os.set_inheritable(keep, True)
            os.closerange(3, keep)
            os.closerange(keep + 1, MAX_FD)
        else:
            os.closerange(3, MAX_FD)
        set_limits(spec["limits"], spec.get("extra_processes", 0))
        _set_oom_score_adj(0)
        if spec.get("uid") is not None:
            os.setgroups([])
            os.setgid(spec["gid"])
            os.setuid(spec["uid"])
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        os.chdir(workdir)
        # MALLOC_ARENA_MAX: glibc reserves 64 MiB of address space per thread arena, which RLIMIT_AS would count
        # as if it were used; two arenas keep threaded programs within a limit meant for real memory.
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8", "MALLOC_ARENA_MAX": "2"}
        os.execve(spec["argv"][0], spec["argv"], env)
    except BaseException as e:  # noqa: BLE001
        try:
            os.write(2, f"sandbox: could not start the program: {e}\n".encode())
        finally:
            os._exit(127)


class _Alarm(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Alarm()


def run_init(spec: dict, alive_r: int, status_fd: int) -> None:
    """pid 1 of the new pid namespace (or a plain child without namespaces). Never returns."""
    status = {}
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
        if select.select([alive_r], [], [], 0)[0]:
            os._exit(1)  # end of file: the runner died before the death signal was armed
        os.close(alive_r)
        workdir = setup_mounts(spec) if spec["mode"] != "none" else spec["workdir"]
        write_files(workdir, spec.get("files", {}), spec.get("uid"), spec.get("gid"))
        stdin_fd = os.memfd_create("stdin", 0)
        os.write(stdin_fd, spec.get("stdin", "").encode("utf-8", "surrogatepass"))
        os.lseek(stdin_fd, 0, os.SEEK_SET)
        result_r = result_w = None
        if spec.get("result_fd") is not None:
            result_r, result_w = os.pipe()
            os.set_blocking(result_r, False)
    except BaseException as e:  # noqa: BLE001
        _report(status_fd, {"setup_error": f"{type(e).__name__}: {e}"})
        os._exit(70)
    limits = spec["limits"]
    start = time.monotonic()
    child = os.fork()
    if child == 0:
        exec_program(spec, workdir, stdin_fd, result_w)
    os.close(stdin_fd)
    if result_w is not None:
        os.close(result_w)
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, limits["wall_s"])
    timed_out, wait_status, usage = False, None, None
    try:
        while True:  # reap everything (orphans are re-parented to us); stop when the program itself ends
            pid, st, ru = os.wait4(-1, 0)
            if pid == child:
                wait_status, usage = st, ru
                break
    except _Alarm:
        timed_out = True
    except ChildProcessError:
        pass
    signal.setitimer(signal.ITIMER_REAL, 0)
    status["pid"] = child
    status["wall_s"] = round(time.monotonic() - start, 4)
    status["timed_out"] = timed_out
    if wait_status is not None:
        if os.WIFSIGNALED(wait_status):
            status["signal"] = os.WTERMSIG(wait_status)
        else:
            status["exit_code"] = os.WEXITSTATUS(wait_status)
        status["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 4)
        status["max_rss_kb"] = usage.ru_maxrss
    if result_r is not None:
        chunks, size = [], 0
        try:
            while size < RESULT_CAP:
                chunk = os.read(result_r, RESULT_CAP - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        except BlockingIOError:
            pass
        status["result"] = b"".join(chunks).decode("utf-8", "replace")
    try:
        os.killpg(child, signal.SIGKILL)  # without a pid namespace: the program's session, best effort
    except OSError:
        pass
    _report(status_fd, status)
    os._exit(0)  # as pid 1: the kernel now kills the rest of the namespace


def _report(fd: int, status: dict) -> None:
    try:
        os.write(fd, (json.dumps(status) + "\n").encode())
    except OSError:
        pass


def _write_id_maps(uid: int, gid: int) -> None:
    # Identity maps: the program keeps the service's (unprivileged) ids and, not being uid 0 in the namespace,
    # loses every capability at exec; init keeps them until then, for the mounts.
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def run(spec: dict) -> int:
    """One run, from this process (the outer runner): returns its exit status."""
    status_fd = spec["status_fd"]
    mode = spec["mode"]
    try:
        # Die with the parent (the zygote, or the service itself): a service killed outright takes every run down
        # with it, down to the program (init dies with this process, and the pid namespace with init).
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
        # The OOM killer must pick the program, never this process or init (they hold the verdict); init inherits
        # this, the program is set back to 0 before it starts. Lowering needs root: elsewhere it stays as it is.
        _set_oom_score_adj(-1000)
        # A service running as root gives each slot its own uid, so RLIMIT_NPROC counts this program alone.
        # Otherwise the program runs as the service's user: allow for the processes that user already runs
        # (counted here, while this process still sees the host's /proc).
        spec["extra_processes"] = 0 if spec.get("uid") is not None else user_processes(os.getuid())
        for cgroup in spec.get("cgroups", []):
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        if mode != "none":
            # (after joining the cgroups: the new cgroup namespace is rooted at the slot's group)
            flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
            uid, gid = os.getuid(), os.getgid()
            if mode == "userns":
                flags |= CLONE_NEWUSER
            _check(_libc.unshare(flags), "unshare")
            if mode == "userns":
                _write_id_maps(uid, gid)
    except (OSError, SetupError) as e:
        _report(status_fd, {"setup_error": f"{type(e).__name__}: {e}"})
        return 70
    alive_r, alive_w = os.pipe()  # held open by this process for its whole life: init sees EOF once it is gone
    pid = os.fork()
    if pid == 0:
        os.close(alive_w)
        run_init(spec, alive_r, status_fd)
    os.close(alive_r)
    os.close(status_fd)
    try:
        _, st = os.waitpid(pid, 0)
    except ChildProcessError:
        return 0
    return os.waitstatus_to_exitcode(st) if st else 0


def zygote(control_fd: int) -> None:
    """Serve runs without starting an interpreter for each: the service sends, over the Unix socket
    ``control_fd``, a short message with four descriptors (spec pipe, stdout, stderr, status pipe); the zygote forks
    a runner for them (which reads its spec and proceeds as ``main`` would) and answers with the runner's pid and a
    pidfd for it, through which the service waits for it and kills it. Ends when the service closes the socket or
    dies (the zygote dies with it)."""
    import socket

    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")  # (a dead service: socket EOF)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # runners are reaped by the kernel; the service holds pidfds
    sock = socket.socket(fileno=control_fd)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, 64, 4)
        except OSError:
            break
        if not data:
            break  # the service closed the socket
        if len(fds) != 4 or min(fds) < 3:  # 0-2 are taken, so the dup2s below use each fd before replacing it
            for fd in fds:
                os.close(fd)
            sock.sendall(b"error: expected 4 descriptors\n")
            continue
        pid = os.fork()
        if pid == 0:
            code = 71
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the runner waits for its init
                sock.close()
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                os.closerange(4, MAX_FD)
                os.setsid()
                spec = json.loads(_read_all(0))
                spec["status_fd"] = 3
                code = run(spec)
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            sock.sendall(b"error: pidfd_open failed\n")
            continue
        socket.send_fds(sock, [f"{pid}\n".encode()], [pidfd])
        os.close(pidfd)
    os._exit(0)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--zygote":
        zygote(int(sys.argv[2]))
    spec = json.loads(_read_all(0))
    sys.exit(run(spec))


if __name__ == "__main__":
    main()
