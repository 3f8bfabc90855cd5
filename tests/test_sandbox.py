"""The code-execution sandbox service: a real server on 127.0.0.1 running real programs in real subprocesses.

Benign programs must get the right verdict; hostile ones (infinite loops, fork bombs, memory hogs, floods of output,
writes outside their directory, reads of the service's environment, network connections, exit tricks) must be
stopped within their limits; afterwards nothing of them is left on the host. The limits are deliberately tiny
(160 MiB, 12 processes, 1-2 s) so that a containment bug cannot hurt the machine the tests run on.
"""

import asyncio
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import aiohttp
import pytest

from openrlhf_classmate.sandbox import service as service_mod
from openrlhf_classmate.sandbox.config import SandboxConfig
from openrlhf_classmate.sandbox.launch import RUNNER_PATH
from openrlhf_classmate.sandbox.service import normalise_output
from openrlhf_classmate.testing.sandbox_service import REPO_ROOT, running_service, start_service, stop_service

IS_ROOT = os.geteuid() == 0
SECRET = f"sandbox-secret-{uuid.uuid4().hex}"
SLOTS = 2
MEMORY_MB = 160
MAX_PROCESSES = 12
OUTPUT_KB = 64
UID_BASE = 40000 + (os.getpid() % 1000) * 8  # apart from other services (and test runs) on this machine
FLAGS = ["--max-concurrency", str(SLOTS), "--memory-mb", str(MEMORY_MB), "--max-processes", str(MAX_PROCESSES),
         "--default-time-limit", "5", "--max-time-limit", "20", "--max-output-kb", str(OUTPUT_KB), "--disk-mb", "16",
         "--file-size-mb", "2", "--max-request-mb", "1", "--uid-base", str(UID_BASE), "--grace-s", "3"]


@pytest.fixture(scope="module")
def service():
    env = dict(os.environ, SANDBOX_TEST_SECRET=SECRET)
    with running_service(*FLAGS, env=env) as handle:
        yield handle


def _live_processes(uids) -> list[int]:
    return service_mod._processes_of(uids)


def _children(pid: int) -> list[int]:
    out = []
    for stat_path in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat_path) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(stat_path.split("/")[2]))
        except (OSError, IndexError, ValueError):
            pass
    return out


def assert_host_clean(service) -> None:
    """Nothing of any run is left: no process under the slot uids, none in the slot cgroups, no runner (child of
    the service or of its zygote), and the service's working directory is empty."""
    health = service.health()
    iso = health["isolation"]
    deadline = time.monotonic() + 5
    while True:
        children = _children(service.proc.pid)
        zygotes = [pid for pid in children if b"--zygote" in open(f"/proc/{pid}/cmdline", "rb").read()]
        leftovers = {"uids": _live_processes(range(UID_BASE, UID_BASE + SLOTS)) if iso["dedicated_uid_per_slot"] else [],
                     "runners": [c for pid in zygotes for c in _children(pid)] + [c for c in children if c not in zygotes],
                     "cgroups": []}
        for d in iso["cgroup_dirs"]:
            for procs in glob.glob(os.path.join(d, "slot-*", "cgroup.procs")):
                leftovers["cgroups"] += open(procs).read().split()
        if not any(leftovers.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not any(leftovers.values()), leftovers
    work = glob.glob(os.path.join(tempfile.gettempdir(), f"openrlhf-sandbox-{service.proc.pid}-*"))
    assert len(work) == 1 and os.listdir(work[0]) == [], work
    assert health["concurrency"]["running"] == 0 and health["concurrency"]["quarantined_slots"] == []


def run_assert(service, program: str, tests, limit: float | None = 5.0):
    body = {"program": program, "tests": tests if isinstance(tests, list) else [tests]}
    if limit is not None:
        body["max_execution_time"] = limit
    status, reply = service.post("/test_program", body)
    assert status == 200, reply
    return reply


def run_stdio(service, program: str, tests, limit: float | None = 5.0):
    body = {"program": program, "tests": tests}
    if limit is not None:
        body["max_execution_time"] = limit
    status, reply = service.post("/test_program_stdio", body)
    assert status == 200, reply
    return reply


def namespaces(service) -> bool:
    return service.health()["isolation"]["mode"] in ("root", "userns")


# ── health ──


def test_health_reports_the_active_isolation(service):
    health = service.health()
    iso = health["isolation"]
    assert health["status"] == "ok" and health["concurrency"]["limit"] == SLOTS
    assert health["limits"]["memory_mb"] == MEMORY_MB and health["limits"]["max_processes"] == MAX_PROCESSES
    assert iso["empty_environment"] and iso["verified"]["python"].startswith("3.")
    if IS_ROOT:
        assert iso["mode"] == "root"
        assert iso["pid_namespace"] and iso["network_namespace"] and iso["mount_namespace"] and iso["read_only_root"]
        assert iso["unprivileged_user"] and iso["dedicated_uid_per_slot"]
        # what the start-up probe program actually saw inside the sandbox
        assert iso["verified"]["uid"] == UID_BASE and iso["verified"]["interfaces"] == ["lo"]
        assert iso["verified"]["root_writable"] is False and iso["verified"]["pid"] <= 10
        assert REPO_ROOT in iso["hidden_paths"]
    else:
        assert iso["mode"] in ("userns", "none") and iso["degraded"]


# ── benign programs: the right verdicts ──


def test_correct_wrong_and_crashing_programs(service):
    program = "def add(a, b):\n    return a + b\n"
    reply = run_assert(service, program, ["assert add(1, 2) == 3", "assert add(2, 2) == 5", "assert add('a', 1)",
                                          "assert add(-1, 1) == 0"])
    assert reply["pass_fraction"] == 0.5 and reply["passed"] == 2 and reply["total"] == 4
    verdicts = [(r["passed"], r["reason"]) for r in reply["results"]]
    assert verdicts == [(True, None), (False, "assertion"), (False, "exception"), (True, None)]
    assert "TypeError" in reply["results"][2]["detail"]

    crash = run_assert(service, "def f(:\n    pass", "assert True")
    assert crash["results"][0]["reason"] == "exception" and "SyntaxError" in crash["results"][0]["detail"]
    boom = run_assert(service, "raise RuntimeError('boom')", "assert True")
    assert boom["results"][0]["reason"] == "exception" and "RuntimeError in the program: boom" in \
        boom["results"][0]["detail"]
    # the program runs as __main__, as if the test were appended to it
    main = run_assert(service, "if __name__ == '__main__':\n    ran = True", "assert ran")
    assert main["pass_fraction"] == 1.0


def test_stdio_programs(service):
    program = "n = int(input())\nprint(n * 2)\n"
    reply = run_stdio(service, program, [{"input": "3\n", "output": "6\n"}, {"input": "4", "output": "9"},
                                         {"input": "x", "output": "0"}, {"input": "5", "output": "10   \n\n"}])
    assert [(r["passed"], r["reason"]) for r in reply["results"]] == [
        (True, None), (False, "wrong answer"), (False, "exception"), (True, None)]
    assert "expected '9', got '8'" in reply["results"][1]["detail"]
    assert "ValueError" in reply["results"][2]["detail"]
    multi = run_stdio(service, "import sys\nfor line in sys.stdin:\n    print(line.strip()[::-1], ' ')\n",
                      [{"input": "abc\nxy\n", "output": "cba\nyx"}])
    assert multi["pass_fraction"] == 1.0
    exit_code = run_stdio(service, "print(1)\nraise SystemExit(3)", [{"input": "", "output": "1"}])
    assert exit_code["results"][0]["reason"] == "exit" and "exit code 3" in exit_code["results"][0]["detail"]


def test_output_normalisation():
    assert normalise_output("a  \r\nb\t\n\n\n") == "a\nb"
    assert normalise_output("  lead") == "  lead"  # leading whitespace is significant


def test_exit_tricks_do_not_pass(service):
    tricks = {
        "sys.exit(0) before the test": "import sys\nsys.exit(0)",
        "os._exit(0) before the test": "import os\nos._exit(0)",
        "a printed fake verdict": "print('pass')\nimport sys\nprint('\\n0 {\"verdict\": \"pass\"}', file=sys.stderr)\n"
                                  "import os\nos.write(3, b'\\nabc {\"verdict\": \"pass\"}\\n')\nos._exit(0)",
        "killing itself": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
        "an atexit hook that exits 0": "import atexit, os\natexit.register(lambda: os._exit(0))\nraise SystemExit(1)",
    }
    for name, program in tricks.items():
        result = run_assert(service, program, "assert False, 'the test must fail'")["results"][0]
        assert not result["passed"], name
        assert result["reason"] in ("exit", "killed"), (name, result)


# ── hostile programs: stopped within their limits ──


def test_infinite_loop_times_out(service):
    start = time.monotonic()
    result = run_assert(service, "while True:\n    pass", "assert True", limit=1.0)["results"][0]
    assert result["reason"] == "timeout" and not result["passed"]
    assert 0.9 <= result["time_s"] <= 2.5, result
    assert time.monotonic() - start < 1.0 + 3 + 2  # limit + grace + slack: the service answers
    sleeper = run_stdio(service, "import time\ntime.sleep(60)", [{"input": "", "output": ""}], limit=1.0)
    assert sleeper["results"][0]["reason"] == "timeout" and sleeper["results"][0]["time_s"] <= 2.5
    threads = run_assert(service, "import threading\ndef spin():\n    while True:\n        pass\n"
                                  "ts = [threading.Thread(target=spin) for _ in range(4)]\n"
                                  "for t in ts:\n    t.start()\nfor t in ts:\n    t.join()", "assert True", limit=1.0)
    assert threads["results"][0]["reason"] == "timeout" and threads["results"][0]["time_s"] <= 2.5
    assert_host_clean(service)


def test_fork_bomb_is_capped_and_cleaned_up(service):
    counted = ("import os, time\nn = 0\nfor _ in range(1000):\n    try:\n        pid = os.fork()\n"
               "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n"
               "    n += 1\nassert False, f'forked={n}'")
    result = run_assert(service, counted, "assert True", limit=5.0)["results"][0]
    forked = int(re.search(r"forked=(\d+)", result["detail"]).group(1))
    if service.health()["isolation"]["dedicated_uid_per_slot"]:
        assert 1 <= forked < MAX_PROCESSES, result  # the program itself is one of its processes
    else:  # RLIMIT_NPROC also counts the service user's other processes, whose number moves
        assert 1 <= forked < MAX_PROCESSES + 64, result
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = run_assert(service, bomb, "assert True", limit=1.0)["results"][0]
    assert result["reason"] == "timeout" and result["time_s"] <= 2.5, result
    assert_host_clean(service)  # the 60 s sleepers of the first bomb are gone too


def test_memory_hog_is_capped(service):
    counted = ("chunks = []\nn = 0\ntry:\n    while True:\n        chunks.append(bytearray(1 << 20))\n        n += 1\n"
               "except MemoryError:\n    pass\ndel chunks\nassert False, f'allocated={n}'")
    result = run_assert(service, counted, "assert True", limit=15.0)["results"][0]  # slow on a loaded machine
    assert "allocated=" in result["detail"], result
    allocated = int(re.search(r"allocated=(\d+)", result["detail"]).group(1))
    assert 50 <= allocated < MEMORY_MB, result
    plain = run_assert(service, "x = []\nwhile True:\n    x.append(bytearray(1 << 20))", "assert True", limit=15.0)
    assert plain["results"][0]["reason"] == "memory"
    stdio = run_stdio(service, "x = 'a' * (1 << 40)", [{"input": "", "output": ""}])
    assert stdio["results"][0]["reason"] == "memory"
    if service.health()["isolation"]["cgroups"]:
        # many processes, each under its own address-space limit, together over the program's memory limit
        spread = ("import os, time\nfor _ in range(6):\n    if os.fork() == 0:\n        break\nx = []\ntry:\n"
                  "    while True:\n        x.append(b'y' * (1 << 20))\nexcept MemoryError:\n    pass\ntime.sleep(30)")
        result = run_assert(service, spread, "assert True", limit=5.0)["results"][0]
        assert result["reason"] == "memory", result
    assert_host_clean(service)


def test_huge_output_is_cut(service):
    for stream in ("stdout", "stderr"):
        start = time.monotonic()
        reply = run_stdio(service, f"import sys\nwhile True:\n    sys.{stream}.write('x' * 65536)",
                          [{"input": "", "output": "x"}], limit=5.0)
        assert reply["results"][0]["reason"] == "output limit", reply
        assert time.monotonic() - start < 4.0  # stopped at the cap, not at the time limit
    # just under the cap is fine
    ok = run_stdio(service, f"print('x' * {OUTPUT_KB * 1024 - 100})",
                   [{"input": "", "output": "x" * (OUTPUT_KB * 1024 - 100)}])
    assert ok["pass_fraction"] == 1.0
    assert_host_clean(service)


def test_files_limits(service):
    big = run_assert(service, "with open('big', 'wb') as f:\n    f.write(b'x' * (3 << 20))", "assert True")
    assert big["results"][0]["reason"] == "exception" and "File too large" in big["results"][0]["detail"]
    small = run_assert(service, "with open('data.txt', 'w') as f:\n    f.write('hello')\n",
                       "assert open('data.txt').read() == 'hello'")
    assert small["pass_fraction"] == 1.0


def test_writes_outside_its_directory_fail(service):
    if not namespaces(service):
        pytest.skip("needs the mount namespace (isolation root or userns)")
    marker = f"sandbox-escape-{uuid.uuid4().hex}"
    host_targets = [os.path.join(REPO_ROOT, marker), f"/var/tmp/{marker}", f"/etc/{marker}", f"/{marker}",
                    f"/run/lock/{marker}", os.path.join(os.path.expanduser("~"), marker)]
    private_targets = [f"/dev/shm/{marker}", f"/tmp/{marker}", marker]  # the program's own, discarded with it
    program = (f"import os\nblocked, written = [], []\nfor p in {host_targets + private_targets!r}:\n    try:\n"
               "        with open(p, 'w') as f:\n            f.write('x')\n        written.append(p)\n"
               "    except OSError:\n        blocked.append(p)\n"
               "try:\n    os.mkdir('/usr/x')\nexcept OSError:\n    blocked.append('/usr/x')\n")
    test = f"assert sorted(written) == sorted({private_targets!r}), (written, blocked)"
    reply = run_assert(service, program, test)
    assert reply["pass_fraction"] == 1.0, reply
    for path in host_targets + [f"/dev/shm/{marker}", f"/tmp/{marker}"]:
        assert not os.path.exists(path), path
    # the service's own directories are not visible at all
    hidden = run_assert(service, f"import os\nseen = os.path.exists({REPO_ROOT!r} + '/openrlhf_classmate')",
                        "assert not seen")
    assert hidden["pass_fraction"] == 1.0


def test_the_service_environment_is_not_readable(service):
    program = ("import glob, os\nblob = repr(dict(os.environ))\nfor p in glob.glob('/proc/*/environ'):\n    try:\n"
               "        blob += open(p, 'rb').read().decode(errors='replace')\n    except OSError:\n        pass\n"
               f"for p in ['/proc/1/environ', '/proc/{service.proc.pid}/environ', '/proc/self/environ']:\n    try:\n"
               "        blob += open(p, 'rb').read().decode(errors='replace')\n    except OSError:\n        pass\n")
    test = ("assert os.environ.keys() == {'PATH', 'HOME', 'LANG', 'MALLOC_ARENA_MAX'}, dict(os.environ)\n"
            "assert 'PATH=' in blob\n"  # it did read its own environment
            f"assert {SECRET[:16]!r} + {SECRET[16:]!r} not in blob, 'the service environment leaked'\n"
            "assert 'PYTHONPATH' not in blob")
    reply = run_assert(service, program, test)
    assert reply["pass_fraction"] == 1.0, reply
    # as stdin/stdout: nothing of the service in the environment the program prints
    printed = run_stdio(service, "import os\nprint(sorted(os.environ))",
                        [{"input": "", "output": "['HOME', 'LANG', 'MALLOC_ARENA_MAX', 'PATH']"}])
    assert printed["pass_fraction"] == 1.0, printed


def test_network_is_unreachable(service):
    if not namespaces(service):
        pytest.skip("needs the network namespace (isolation root or userns)")
    program = ("import socket\nresults = {}\n"
               f"for host, port in [('127.0.0.1', {service.port}), ('localhost', {service.port}), ('8.8.8.8', 53), "
               "('1.1.1.1', 443)]:\n    try:\n        socket.create_connection((host, port), timeout=1).close()\n"
               "        results[host] = 'connected'\n    except OSError as e:\n        results[host] = str(e)\n"
               "try:\n    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    s.sendto(b'x', ('8.8.8.8', 53))\n"
               "    results['udp'] = 'sent'\nexcept OSError as e:\n    results['udp'] = str(e)\n")
    reply = run_assert(service, program, "assert 'connected' not in results.values() and results['udp'] != 'sent', "
                                         "results")
    assert reply["pass_fraction"] == 1.0, reply


def test_started_processes_do_not_outlive_the_program(service):
    program = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n"
               "    os._exit(0)\ntime.sleep(0.2)\n")
    reply = run_assert(service, program, "assert True")
    assert reply["pass_fraction"] == 1.0
    assert_host_clean(service)


def test_a_zygote_killed_from_outside_is_replaced(service):
    (zygote,) = [pid for pid in _children(service.proc.pid)
                 if b"--zygote" in open(f"/proc/{pid}/cmdline", "rb").read()]
    os.kill(zygote, signal.SIGKILL)
    time.sleep(0.2)
    reply = run_assert(service, "def f():\n    return 1", "assert f() == 1")
    assert reply["pass_fraction"] == 1.0
    assert service.health()["concurrency"]["launcher_restarts"] == 1
    assert_host_clean(service)


# ── malformed requests: a clear 4xx, never a 500 ──


def test_malformed_requests_get_a_clear_4xx(service):
    ok = {"program": "x = 1", "tests": ["assert x == 1"]}
    cases = [
        ({"tests": ["assert 1"]}, 422, "program: Field required"),
        ({"program": 1, "tests": ["assert 1"]}, 422, "program: Input should be a valid string"),
        ({"program": "x", "tests": "assert 1"}, 422, "tests: Input should be a valid list"),
        ({"program": "x", "tests": []}, 422, "tests: List should have at least 1 item"),
        ({"program": "x", "tests": [1]}, 422, "tests.0: Input should be a valid string"),
        ({**ok, "max_execution_time": -1}, 422, "max_execution_time: Input should be greater than 0"),
        ({**ok, "max_execution_time": "5"}, 422, "max_execution_time: Input should be a valid number"),
        ({**ok, "max_execution_time": 1000}, 422, "exceeds this service's limit of 20 s"),
        ({**ok, "tets": []}, 422, "tets: Extra inputs are not permitted"),
        ({**ok, "tests": ["assert 1"] * 600}, 422, "more than this service's limit of 512"),
    ]
    for body, status, message in cases:
        got_status, reply = service.post("/test_program", body)
        assert (got_status, message in reply["error"]) == (status, True), (body, got_status, reply)
    raw_cases = [(b'{"program": "x", "tests": ["assert 1"], "max_execution_time": NaN}', "application/json", 422,
                  "max_execution_time: Input should be a finite number"),  # was a 500: NaN in the 422's detail
                 (b"{not json", "application/json", 400, "not valid JSON"),
                 (b"[1, 2]", "application/json", 422, "valid dictionary"),
                 (b"", "application/json", 422, "body: Field required"),
                 (json.dumps(ok).encode(), "text/plain", 415, "Content-Type must be application/json"),
                 (b"x" * (2 << 20), "application/json", 413, "request body exceeds")]
    for raw, ctype, status, message in raw_cases:
        got_status, reply = service.post("/test_program", raw=raw, content_type=ctype)
        assert (got_status, message in reply["error"]) == (status, True), (raw[:20], got_status, reply)
    stdio_cases = [({"program": "x", "tests": [{"input": 1, "output": "a"}]}, "tests.0.input"),
                   ({"program": "x", "tests": ["a"]}, "tests.0"),
                   ({"program": "x", "tests": [{"input": "a"}]}, "tests.0.output: Field required")]
    for body, message in stdio_cases:
        got_status, reply = service.post("/test_program_stdio", body)
        assert got_status == 422 and message in reply["error"], reply
    assert service.get("/nope")[0] == 404 and service.get("/test_program")[0] == 405
    # odd but valid text is the program's problem, never the service's
    for program in ("x = 1\x00", "x = '\ud800'", "\ufeffx = 1"):
        status, reply = service.post("/test_program", {"program": program, "tests": ["assert True"]})
        assert status == 200, reply


# ── concurrency ──


def test_health_answers_while_every_slot_is_busy(service):
    replies = []
    threads = [threading.Thread(target=lambda: replies.append(
        run_assert(service, "import time\ntime.sleep(2)", "assert True", limit=5.0))) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.8)
    start = time.monotonic()
    health = service.health()
    assert time.monotonic() - start < 1.0
    assert health["concurrency"]["running"] == SLOTS and health["concurrency"]["queued"] == 2
    for t in threads:
        t.join(30)
    assert [r["pass_fraction"] for r in replies] == [1.0] * 4
    assert service.health()["concurrency"]["queued"] == 0


BENIGN = [
    # (endpoint, program, tests, expected per-test verdicts)
    ("/test_program", "def f(x):\n    return x * x", ["assert f(3) == 9", "assert f(-2) == 4"], [True, True]),
    ("/test_program", "def f(x):\n    return x + x", ["assert f(3) == 9", "assert f(2) == 4"], [False, True]),
    ("/test_program", "def f(x):\n    return 1 / x", ["assert f(0) == 0"], [False]),
    ("/test_program_stdio", "print(sum(map(int, input().split())))",
     [{"input": "1 2 3", "output": "6"}, {"input": "5 5", "output": "11"}], [True, False]),
    ("/test_program_stdio", "import sys\nprint(sys.stdin.read().upper(), end='')",
     [{"input": "abc\n", "output": "ABC"}], [True]),
]
HOSTILE = [
    # (endpoint, program, allowed reasons, time limit); the memory hog gets time to reach its limit on a busy machine
    ("/test_program", "while True:\n    pass", {"timeout"}, 1.0),
    ("/test_program", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", {"timeout"},
     1.0),
    ("/test_program", "x = []\nwhile True:\n    x.append(bytearray(1 << 20))", {"memory"}, 10.0),
    ("/test_program_stdio", "while True:\n    print('x' * 10000)", {"output limit"}, 5.0),
    ("/test_program", "import time, os\nfor _ in range(5):\n    os.fork()\ntime.sleep(60)", {"timeout", "exception"}, 1.0),
    ("/test_program", "import os\nos._exit(0)", {"exit"}, 1.0),
    ("/test_program", "import socket\nsocket.create_connection(('127.0.0.1', PORT), timeout=1)", {"exception"}, 1.0),
]


def test_200_concurrent_requests_with_hostile_programs(service):
    namespaced = namespaces(service)
    jobs = []
    for i in range(200):
        if i % 8 == 7:
            endpoint, program, reasons, limit = HOSTILE[(i // 8) % len(HOSTILE)]
            if "PORT" in program and not namespaced:
                continue
            program = program.replace("PORT", str(service.port))
            tests = ["assert True"] if endpoint == "/test_program" else [{"input": "", "output": "x"}]
            jobs.append(("hostile", endpoint, {"program": program, "tests": tests, "max_execution_time": limit},
                         reasons))
        else:
            endpoint, program, tests, expected = BENIGN[i % len(BENIGN)]
            jobs.append(("benign", endpoint, {"program": program, "tests": tests, "max_execution_time": 5.0}, expected))

    async def send_all():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                         connector=aiohttp.TCPConnector(limit=250)) as session:
            async def one(endpoint, body):
                async with session.post(service.url + endpoint, json=body) as resp:
                    return resp.status, await resp.json()
            return await asyncio.gather(*(one(endpoint, body) for _, endpoint, body, _ in jobs))

    start = time.monotonic()
    replies = asyncio.run(send_all())
    elapsed = time.monotonic() - start
    hostile_seen = set()
    for (kind, _, body, expected), (status, reply) in zip(jobs, replies):
        assert status == 200, (body, reply)
        results = reply["results"]
        if kind == "benign":
            assert [r["passed"] for r in results] == expected, (body["program"], results)
            assert reply["pass_fraction"] == sum(expected) / len(expected)
        else:
            result = results[0]
            assert not result["passed"] and result["reason"] in expected, (body["program"], result)
            assert result["time_s"] <= body["max_execution_time"] + 1.5, (body["program"], result)  # within its limit
            hostile_seen.add(body["program"])
    assert len(hostile_seen) >= len(HOSTILE) - (0 if namespaced else 1)
    assert elapsed < 300, elapsed
    assert service.health()["concurrency"]["completed_runs"] >= len(jobs)
    assert_host_clean(service)


# ── start-up and shutdown ──


def test_shutdown_kills_running_programs_and_removes_everything():
    handle = start_service(*FLAGS[:-4], "--uid-base", str(UID_BASE + SLOTS), "--grace-s", "3")
    iso = handle.health()["isolation"]
    def post():
        try:
            handle.post("/test_program", {"program": "import time\ntime.sleep(60)", "tests": ["assert True"] * 2,
                                          "max_execution_time": 20}, timeout=60)
        except OSError:
            pass  # the service went away mid-request, as it should

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    time.sleep(1.5)
    assert handle.health()["concurrency"]["running"] == 2 and handle.health()["launcher"] == "zygote"
    (zygote,) = _children(handle.proc.pid)
    assert len(_children(zygote)) == 2  # the two runners
    start = time.monotonic()
    status = stop_service(handle)
    assert time.monotonic() - start < 15 and status in (0, -signal.SIGTERM), handle.log()
    if iso["dedicated_uid_per_slot"]:
        assert _live_processes(range(UID_BASE + SLOTS, UID_BASE + 2 * SLOTS)) == []
    for d in iso["cgroup_dirs"]:
        assert not os.path.exists(d), d
    assert glob.glob(os.path.join(tempfile.gettempdir(), f"openrlhf-sandbox-{handle.proc.pid}-*")) == []
    time.sleep(0.2)
    assert not os.path.exists(f"/proc/{zygote}") or open(f"/proc/{zygote}/stat").read().split(")")[1].split()[0] == "Z"
    os.unlink(handle.log_path)


def test_a_killed_service_takes_its_runs_with_it_and_the_next_start_cleans_up():
    flags = [*FLAGS[:-4], "--uid-base", str(UID_BASE + 3 * SLOTS)]
    handle = start_service(*flags)
    iso = handle.health()["isolation"]

    def post():
        try:
            handle.post("/test_program", {"program": "import os, time\nos.fork()\ntime.sleep(60)",
                                          "tests": ["assert True"] * 2, "max_execution_time": 20}, timeout=60)
        except OSError:
            pass

    threading.Thread(target=post, daemon=True).start()
    time.sleep(1.5)
    assert handle.health()["concurrency"]["running"] == 2
    (zygote,) = _children(handle.proc.pid)
    stale = glob.glob(os.path.join(tempfile.gettempdir(), f"openrlhf-sandbox-{handle.proc.pid}-*"))
    assert stale and all(os.path.exists(d) for d in iso["cgroup_dirs"])  # what the killed service leaves behind
    os.kill(handle.proc.pid, signal.SIGKILL)  # no cleanup code of the service runs
    handle.proc.wait()
    uids = range(UID_BASE + 3 * SLOTS, UID_BASE + 4 * SLOTS)
    deadline = time.monotonic() + 5
    while (_live_processes(uids) or os.path.exists(f"/proc/{zygote}")) and time.monotonic() < deadline:
        time.sleep(0.1)
    if iso["dedicated_uid_per_slot"]:
        assert _live_processes(uids) == []  # the programs and the processes they forked
    assert not os.path.exists(f"/proc/{zygote}") or open(f"/proc/{zygote}/stat").read().split(")")[1].split()[0] == "Z"
    # not checked here: that they are still there. A service that another test file starts meanwhile (pytest-xdist
    # workers) removes every dead service's directories at its start, as the start below does; checking them here
    # failed under CI's parallel run
    with running_service(*flags):
        assert not any(os.path.exists(p) for p in stale + iso["cgroup_dirs"])
    os.unlink(handle.log_path)


def _start_fails(*flags: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "openrlhf_classmate.sandbox", "--port", "0", *flags],
                          capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
                          env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    assert proc.returncode != 0
    return proc.stderr.strip()


def test_bad_settings_stop_the_start_with_one_line():
    assert _start_fails("--memory-mb", "0") == "error: these settings must be finite numbers > 0: memory_mb=0"
    assert _start_fails("--max-time-limit", "inf").endswith(
        "argument --max-time-limit: must be a finite number, got 'inf'")
    assert _start_fails("--isolation", "sometimes").endswith("invalid choice: 'sometimes' (choose from 'auto', "
                                                             "'root', 'userns', 'none')")
    assert _start_fails("--default-time-limit", "30", "--max-time-limit", "10") == \
        "error: default_time_limit 30.0 exceeds max_time_limit 10.0"
    if IS_ROOT:
        message = _start_fails("--isolation", "userns")
        assert message.splitlines()[-1].startswith("error: no isolation mode works here: userns: is for services")
    else:
        assert "needs the service to run as root" in _start_fails("--isolation", "root").splitlines()[-1]


@pytest.mark.skipif(not IS_ROOT, reason="only a service running as root gives slots their own uids")
def test_a_uid_of_an_existing_account_is_refused():
    import pwd

    taken = next((p for p in pwd.getpwall() if 1000 <= p.pw_uid <= 2**31 - 2**16), None)
    if taken is None:
        pytest.skip("no account with a uid >= 1000")
    message = _start_fails("--uid-base", str(taken.pw_uid), "--max-concurrency", "1").splitlines()[-1]
    assert f"uid {taken.pw_uid} belongs to the account {taken.pw_name!r}" in message


def test_isolation_none_says_it_is_degraded_and_still_limits():
    # also the launcher without a zygote (a new runner interpreter per run)
    with running_service("--isolation", "none", "--launcher", "direct", *FLAGS[:-4], "--uid-base",
                         str(UID_BASE + 2 * SLOTS)) as handle:
        assert handle.health()["launcher"] == "direct"
        iso = handle.health()["isolation"]
        assert iso["mode"] == "none" and not iso["network_namespace"] and not iso["pid_namespace"]
        assert any("no pid, network or mount namespace" in note for note in iso["degraded"])
        ok = handle.post("/test_program", {"program": "def f():\n    return 2", "tests": ["assert f() == 2"]})[1]
        assert ok["pass_fraction"] == 1.0
        loop = handle.post("/test_program", {"program": "while True:\n    pass", "tests": ["assert True"],
                                             "max_execution_time": 1})[1]
        assert loop["results"][0]["reason"] == "timeout"
        hog = handle.post("/test_program", {"program": "x = []\nwhile True:\n    x.append(bytearray(1 << 20))",
                                            "tests": ["assert True"]})[1]
        assert hog["results"][0]["reason"] == "memory"
        escape = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\n")
        assert handle.post("/test_program", {"program": escape, "tests": ["assert True"]})[1]["pass_fraction"] == 1.0
        if iso["dedicated_uid_per_slot"]:  # root: the slot's uid finds the escaped process
            time.sleep(0.5)
            assert _live_processes(range(UID_BASE + 2 * SLOTS, UID_BASE + 3 * SLOTS)) == []
        assert handle.health()["concurrency"]["quarantined_slots"] == []


@pytest.mark.skipif(not (IS_ROOT and shutil.which("setpriv") and os.path.exists("/usr/bin/python3")),
                    reason="needs root (to become an unprivileged user), setpriv and /usr/bin/python3")
def test_runner_userns_mode_for_an_unprivileged_service():
    """The runner as a non-root service would start it: namespaces through a user namespace, no capabilities
    left for the program."""
    work = tempfile.mkdtemp()
    try:
        os.chmod(work, 0o755)
        shutil.copy(RUNNER_PATH, work)
        program = ("import os, socket\nprint(os.getuid(), os.getpid())\nprint(sorted(l.split(':')[0].strip() for l in "
                   "open('/proc/net/dev').read().splitlines()[2:]))\nfor p in ['/x', '/var/tmp/x']:\n    try:\n"
                   "        open(p, 'w')\n        print('wrote', p)\n    except OSError:\n        print('blocked', p)\n"
                   "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                   "print('umount', libc.umount2(b'/tmp', 2), ctypes.get_errno())\n")
        driver = (
            "import json, os, subprocess, sys\nr, w = os.pipe()\n"
            f"spec = {{'mode': 'userns', 'argv': ['/usr/bin/python3', '-I', '-B', 'program.py'], "
            f"'files': {{'program.py': {program!r}}}, 'stdin': '', 'uid': None, 'gid': None, 'cgroups': [], "
            "'limits': {'wall_s': 5, 'cpu_s': 5, 'address_space_bytes': 256 << 20, 'processes': 8, "
            "'file_size_bytes': 1 << 20, 'open_files': 64, 'tmpfs_bytes': 8 << 20, 'shm_bytes': 4 << 20}, "
            "'hide': [], 'status_fd': w, 'result_fd': None}\n"
            f"p = subprocess.run(['/usr/bin/python3', '-I', '-S', '-B', {work + '/runner.py'!r}], "
            "input=json.dumps(spec).encode(), capture_output=True, pass_fds=(w,), env={})\nos.close(w)\n"
            "print(json.dumps([p.stdout.decode(), p.stderr.decode(), os.read(r, 65536).decode()]))\n")
        proc = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                               "/usr/bin/python3", "-c", driver], capture_output=True, text=True, timeout=60, cwd="/")
        stdout, stderr, status = json.loads(proc.stdout)
        if "unshare" in status:
            pytest.skip(f"unprivileged user namespaces are not allowed here: {status}")
        lines = stdout.splitlines()
        assert lines[0] == "65534 2" and lines[1] == "['lo']", (stdout, stderr)
        assert lines[2:4] == ["blocked /x", "blocked /var/tmp/x"], stdout
        assert lines[4] == "umount -1 1", stdout  # EPERM: no capability survived the exec
        assert json.loads(status)["exit_code"] == 0
    finally:
        shutil.rmtree(work)


def test_config_defaults_are_sane():
    cfg = SandboxConfig()
    assert cfg.host == "127.0.0.1" and cfg.port == 8001 and cfg.isolation == "auto"
    assert cfg.max_concurrency == (os.cpu_count() or 1) and cfg.memory_mb == 1024
    with pytest.raises(ValueError, match="open_files must be >= 16"):
        SandboxConfig(open_files=8)


def test_the_preflight_checks_code_time_limits_against_the_running_sandbox(service, monkeypatch):
    """Rows (or OPENRLHF_CLASSMATE_CODE_TIME_LIMIT) asking for more time per test than this service's
    --max-time-limit (20 s) are refused before the run: the service would answer 422 to every such request."""
    from openrlhf_classmate.integration.launch.preflight import PreflightError, PreflightReport
    from openrlhf_classmate.integration.launch.preflight_data import _check_code_time_limits, _Lengths

    monkeypatch.setenv("OPENRLHF_CLASSMATE_SANDBOX_URL", service.url)
    found = _Lengths(first_use={"code": "d.jsonl:1"}, code_limit=(30.0, "d.jsonl:4"))
    with pytest.raises(PreflightError, match=r"^d.jsonl:4: max_execution_time 30 s exceeds the sandbox's "
                                             r"--max-time-limit 20 s"):
        _check_code_time_limits(found, PreflightReport())
    report = PreflightReport()
    _check_code_time_limits(_Lengths(first_use={"code": "d.jsonl:1"}, code_limit=(20.0, "d.jsonl:1")), report)
    assert report.warnings == []
    monkeypatch.setenv("OPENRLHF_CLASSMATE_CODE_TIME_LIMIT", "45")
    with pytest.raises(PreflightError, match=r"^OPENRLHF_CLASSMATE_CODE_TIME_LIMIT 45 s exceeds"):
        _check_code_time_limits(_Lengths(first_use={"code_stdio": "d.jsonl:1"}), PreflightReport())
