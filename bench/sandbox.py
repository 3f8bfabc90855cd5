"""Benchmark of the code-execution sandbox service.

Throughput and latency of a trivial passing program (one test per request) with exactly ``--concurrency`` requests
in flight (default: the service's concurrency bound, one request per slot), for ``/test_program`` and
``/test_program_stdio``. For scale, the same number of bare interpreter runs (``python -c`` of the same program, no
sandbox, same parallelism) in the same session: the ratio says what the isolation costs per run.

Usage: ``.venv/bin/python bench/sandbox.py [--concurrency N] [--requests 200] [--rounds 5] [--slots N]
[-- extra service flags]``
Run it as root for the full isolation (the service reports which one it got).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import time

import aiohttp

from openrlhf_classmate.testing.sandbox_service import running_service

PROGRAM = "def solve(n):\n    return n * (n + 1) // 2\n"
TEST = "assert solve(10) == 55"
STDIO_PROGRAM = "n = int(input())\nprint(n * (n + 1) // 2)\n"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


async def drive(url: str, endpoint: str, body: dict, n_requests: int, concurrency: int) -> tuple[float, list[float]]:
    """n_requests requests, ``concurrency`` in flight at all times; returns (wall seconds, latencies)."""
    latencies: list[float] = []
    queue = list(range(n_requests))
    failures = []

    async def worker(session: aiohttp.ClientSession) -> None:
        while queue:
            queue.pop()
            start = time.perf_counter()
            async with session.post(url + endpoint, json=body) as resp:
                reply = await resp.json()
            latencies.append(time.perf_counter() - start)
            if resp.status != 200 or reply["pass_fraction"] != 1.0:
                failures.append(reply)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    if failures:
        raise SystemExit(f"error: {len(failures)} requests did not pass, e.g. {failures[0]}")
    return wall, latencies


def bare_runs(python: str, n_runs: int, concurrency: int) -> tuple[float, list[float]]:
    """The same program started directly (no sandbox), ``concurrency`` at a time."""
    code = PROGRAM + TEST
    latencies: list[float] = []
    running: list[tuple[subprocess.Popen, float]] = []
    start = time.perf_counter()
    launched = 0
    while launched < n_runs or running:
        while launched < n_runs and len(running) < concurrency:
            running.append((subprocess.Popen([python, "-I", "-B", "-c", code], env={}), time.perf_counter()))
            launched += 1
        proc, t0 = running.pop(0)
        if proc.wait() != 0:
            raise SystemExit("error: the bare run failed")
        latencies.append(time.perf_counter() - t0)
    return time.perf_counter() - start, latencies


def report(name: str, wall: float, latencies: list[float]) -> float:
    rate = len(latencies) / wall
    print(f"  {name:<34} {rate:7.1f} /s   p50 {1000 * percentile(latencies, 50):6.0f} ms   "
          f"p95 {1000 * percentile(latencies, 95):6.0f} ms   ({len(latencies)} in {wall:.1f} s)")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", type=int, default=os.cpu_count() or 1, help="the service's --max-concurrency")
    parser.add_argument("--concurrency", type=int, default=None, help="requests in flight (default: --slots)")
    parser.add_argument("--requests", type=int, default=200, help="measured requests per endpoint")
    parser.add_argument("--rounds", type=int, default=5,
                        help="the three measurements alternate in this many rounds, so that they share the machine's "
                             "background load (their ratio is the robust figure on a shared machine)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("service_flags", nargs="*", help="extra flags for the service (after --)")
    args = parser.parse_args()
    concurrency = args.concurrency or args.slots
    per_round = max(1, args.requests // args.rounds)

    with running_service("--max-concurrency", str(args.slots), "--log-level", "warning",
                         *args.service_flags) as service:
        iso = service.health()["isolation"]
        print(f"sandbox: isolation {iso['mode']} (cgroups {iso['cgroups'] or 'off'}), launcher "
              f"{service.health()['launcher']}, programs run by {iso['python']} {iso['verified']['python']}; "
              f"{args.slots} slots, {concurrency} requests in flight, {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f}")
        body = {"program": PROGRAM, "tests": [TEST], "max_execution_time": 10}
        stdio_body = {"program": STDIO_PROGRAM, "tests": [{"input": "10\n", "output": "55"}], "max_execution_time": 10}
        asyncio.run(drive(service.url, "/test_program", body, args.warmup, concurrency))
        totals = {name: [0.0, []] for name in ("assert", "stdio", "bare")}
        for _ in range(args.rounds):
            for name, measure in (
                ("assert", lambda: asyncio.run(drive(service.url, "/test_program", body, per_round, concurrency))),
                ("stdio", lambda: asyncio.run(drive(service.url, "/test_program_stdio", stdio_body, per_round,
                                                    concurrency))),
                ("bare", lambda: bare_runs(iso["python"], per_round, concurrency)),
            ):
                wall, latencies = measure()
                totals[name][0] += wall
                totals[name][1] += latencies
        sandbox_rate = report("/test_program (1 assert test)", *totals["assert"])
        report("/test_program_stdio (1 stdin test)", *totals["stdio"])
        bare_rate = report("bare interpreter, no sandbox", *totals["bare"])
    print(f"  sandboxed / bare throughput: {sandbox_rate / bare_rate:.2f} (load average now {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
