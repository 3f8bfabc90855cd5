"""Benchmark of the sibling reward methods' server clients, against the local stand-in servers (each in its own
process, so that server and client do not share a GIL), with a fixed per-request server latency:

1. TinyV verifier client: verifier calls/s for a batch at the client's concurrency bound (``--tinyv.max_concurrency``),
   and its ratio to the ideal ``max_concurrency / latency``.
2. DARLING: the reward hook on whole rollout batches (decoded texts, all pairs per group, union-find, combination)
   with the pair classifier on ``--servers`` servers: classifier pairs/s for n = 8 and n = 16 samples per prompt, and
   the ratio to the ideal ``servers * max_concurrency * pairs_per_request / latency``, with one pair per request (the
   reference's) and with 8 (``--darling.pairs_per_request 8``).

Usage: ``.venv/bin/python bench/reward_methods.py [--calls 1024] [--concurrency 32] [--latency 0.05] [--groups 32]
[--servers 2]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time
from types import SimpleNamespace

import torch

from openrlhf_classmate.rewards.darling import DarlingConfig, DarlingRewardHook
from openrlhf_classmate.scoring.tinyv import TinyVConfig, VerifierClient, VerifierRequest
from openrlhf_classmate.scoring.tinyv_prompts import VERIFIER_MODELS, fill


def start_server(kind: str, latency: float, model: str | None = None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "openrlhf_classmate.testing.fake_servers", kind, "--port", "0", "--latency",
           str(latency)] + (["--model", model] if model else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if line.startswith("READY "):
            return proc, line.split()[1]
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"fake {kind} server did not start")


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=10)


def bench_verifier(calls: int, concurrency: int, latency: float) -> None:
    proc, base_url = start_server("verifier", latency)
    try:
        settings = VERIFIER_MODELS["zhangchenxu/TinyV-1.5B"]
        client = VerifierClient(TinyVConfig(base_url=base_url, max_concurrency=concurrency, timeout_s=60))
        requests = [VerifierRequest(fill(settings.template, question=f"What is {i} + {i}?", ground_truth=str(2 * i),
                                         model_answer=str(2 * i + i % 2)), settings) for i in range(calls)]
        asyncio.run(client.ask(requests[:concurrency]))  # warm-up: model discovery, connections
        start = time.perf_counter()
        verdicts = asyncio.run(client.ask(requests))
        elapsed = time.perf_counter() - start
    finally:
        stop([proc])
    failures = sum(v.value is None for v in verdicts)
    achieved, ideal = calls / elapsed, concurrency / latency
    print(f"TinyV verifier client: {calls} calls, max_concurrency {concurrency}, server latency {latency * 1000:.0f} ms")
    print(f"  achieved:   {achieved:8.1f} calls/s  ({elapsed:.2f} s, {failures} failures)")
    print(f"  ideal:      {ideal:8.1f} calls/s  (concurrency / latency)")
    print(f"  ratio:      {achieved / ideal:8.3f}")


def _batch(groups: int, n: int, rng: random.Random) -> tuple[list, list[str]]:
    vocab = [f"w{i}" for i in range(60)]
    samples, texts = [], []
    for _ in range(groups * n):
        samples.append(SimpleNamespace(rewards=torch.tensor([float(rng.random() < 0.5)]), info={}))
        texts.append(" ".join(rng.choice(vocab) for _ in range(40)))  # > 5 words: every pair goes to the classifier
    return samples, texts


def bench_classifier(groups: int, servers: int, concurrency: int, latency: float) -> None:
    procs, urls = [], []
    try:
        for i in range(servers):
            proc, url = start_server("classifier", latency, model=f"similarity_gpu_{i}")
            procs.append(proc)
            urls.append(url)
        rng = random.Random(0)
        ideal = servers * concurrency / latency
        print(f"DARLING pair classifier: {servers} servers, max_concurrency {concurrency} each, server latency "
              f"{latency * 1000:.0f} ms, {groups} prompt groups per batch")
        for per_request in (1, 8):
            for n in (8, 16):
                hook = DarlingRewardHook(DarlingConfig(diversity="partition", classifier_urls=urls,
                                                       max_concurrency=concurrency, pairs_per_request=per_request), n)
                hook.apply(*_batch(2, n, rng))  # warm-up: model discovery, connections
                samples, texts = _batch(groups, n, rng)
                start = time.perf_counter()
                metrics = hook.apply(samples, texts)
                elapsed = time.perf_counter() - start
                pairs = int(metrics["darling/pairs_classified"])
                achieved = pairs / elapsed
                print(f"  n = {n:2d}, {per_request} pair(s)/request: {pairs:5d} pairs in {elapsed:6.2f} s: "
                      f"{achieved:8.1f} pairs/s, ideal {ideal * per_request:8.1f}, "
                      f"ratio {achieved / ideal / per_request:5.3f} ({int(metrics['darling/pairs_unknown'])} unknown)")
    finally:
        stop(procs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--servers", type=int, default=2)
    args = parser.parse_args()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} CPUs, load average {load} (other processes skew the figures)")
    bench_verifier(args.calls, args.concurrency, args.latency)
    bench_classifier(args.groups, args.servers, args.concurrency, args.latency)


if __name__ == "__main__":
    main()
