"""Benchmark of the scoring layer.

1. math-verify throughput (items/s) through the worker-process pool, next to one in-process core for reference.
   Items are unique (math-verify caches parsed strings, so repeating a few pairs would flatter it).
2. Judge-client throughput against the fake OpenAI-compatible server (run in its own process, so the two do not
   share a GIL) with a fixed per-request latency: achieved requests/s, and its ratio to the ideal
   ``max_concurrency / latency``.

Usage: ``.venv/bin/python bench/scoring.py [--math-items 400] [--workers 2] [--requests 1024] [--concurrency 32]
[--latency 0.05]``
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import subprocess
import sys
import time

from openrlhf_classmate.scoring import JudgeClient, JudgeConfig, MathVerifyConfig, MathVerifyPool
from openrlhf_classmate.scoring.math_pool import verify_pair


def math_items(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n distinct (ground truth, response) pairs of the kinds MATH answers take; about 3/4 are equivalent."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        a, b = rng.randint(1, 500), rng.randint(2, 500)
        kind = i % 6
        if kind == 0:
            items.append((f"\\frac{{{a}}}{{{b}}}", f"So the value is \\boxed{{{a / b:.8f}}}."))
        elif kind == 1:
            items.append((f"\\frac{{{a}}}{{{b}}}", f"We get $\\boxed{{\\frac{{{2 * a}}}{{{2 * b}}}}}$"))
        elif kind == 2:
            items.append((f"[{a},{a + b})", f"The solution set is \\boxed{{[{a}, {a + b + 1})}}"))
        elif kind == 3:
            items.append((f"x^2+{2 * a}x+{a * a}", f"Expanding, \\boxed{{(x+{a})^2}}"))
        elif kind == 4:
            items.append((f"{a}\\sqrt{{2}}", f"\\boxed{{\\sqrt{{{2 * a * a}}}}}"))
        else:
            items.append((f"{a * b}", f"The total is {a} \\times {b} = \\boxed{{{a * b + (i // 6) % 2}}}"))
    return items


def bench_math(n_items: int, workers: int) -> None:
    items = math_items(n_items)
    n_local = max(20, n_items // 10)
    verify_pair("1", "\\boxed{1}")  # the first call loads sympy and the LaTeX grammar; time the steady state
    start = time.perf_counter()
    for gold, response in math_items(n_local, seed=1):
        verify_pair(gold, response)
    local_rate = n_local / (time.perf_counter() - start)

    with MathVerifyPool(MathVerifyConfig(num_workers=workers, timeout_s=5.0)) as pool:
        start = time.perf_counter()
        pool.start()
        startup = time.perf_counter() - start
        start = time.perf_counter()
        outcomes = pool.verify(items)
        elapsed = time.perf_counter() - start
    errors = sum(o.error is not None for o in outcomes)
    equal = sum(bool(o.equal) for o in outcomes)
    print(f"math-verify: {n_items} items, {workers} worker processes")
    print(f"  pool start (spawn + import + warm-up): {startup:.2f} s")
    print(
        f"  pool throughput:       {n_items / elapsed:8.1f} items/s  ({elapsed:.2f} s; {equal} equal, {errors} errors)"
    )
    print(f"  in-process, 1 core:    {local_rate:8.1f} items/s  (reference, {n_local} items)")


def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "openrlhf_classmate.testing.judge_server", "--port", "0", "--latency", str(latency)],
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if line.startswith("READY "):
            return proc, line.split()[1]
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("fake judge server did not start")


def bench_judge(n_requests: int, concurrency: int, latency: float) -> None:
    proc, base_url = start_server(latency)
    try:
        client = JudgeClient(
            JudgeConfig(base_url=base_url, model="fake", api_key_env=None, max_concurrency=concurrency, timeout_s=30)
        )
        asyncio.run(client.chat(["warm-up"] * concurrency))
        replies = asyncio.run(client.chat([f"prompt {i}" for i in range(n_requests)]))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    stats = client.stats
    achieved = n_requests / stats.wall_s
    ideal = concurrency / latency
    print(f"judge client: {n_requests} requests, max_concurrency {concurrency}, server latency {latency * 1000:.0f} ms")
    print(f"  achieved:   {achieved:8.1f} requests/s  ({stats.wall_s:.2f} s, {stats.failures} failures)")
    print(f"  ideal:      {ideal:8.1f} requests/s  (concurrency / latency)")
    print(f"  ratio:      {achieved / ideal:8.3f}")
    print(
        f"  latency p50/p90/p99: {stats.latency_p50 * 1000:.1f} / {stats.latency_p90 * 1000:.1f} / "
        f"{stats.latency_p99 * 1000:.1f} ms"
    )
    assert len(replies) == n_requests


def main() -> None:
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeouts disabled" notice: the pool has its own
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--math-items", type=int, default=400)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.05)
    args = parser.parse_args()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} CPUs, load average {load} (other processes skew the figures)")
    bench_math(args.math_items, args.workers)
    bench_judge(args.requests, args.concurrency, args.latency)


if __name__ == "__main__":
    main()
