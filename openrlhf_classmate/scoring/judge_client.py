"""An OpenAI-compatible chat-completions client for the LLM judge and the CoT monitor.

Works against ``vllm serve <model>`` (base URL ``http://HOST:PORT/v1``) or any hosted OpenAI-compatible endpoint.
Keys never live in files: the client reads the API key from the environment variable named in the config at request
time, and sends no ``Authorization`` header when it is unset (fine for a local vllm server).

Failure policy: connection errors, HTTP 5xx and HTTP 429 are retried with exponential backoff (plus jitter, so that
a whole batch does not come back at the same instant); a request that runs past ``timeout_s`` is *not* retried (a
judge that is that slow usually stays slow, and retrying would multiply the step time); other HTTP errors and
malformed bodies are not retried either. Every failure becomes a ``JudgeReply`` with ``error`` set, never an
exception, so one bad request never loses the rest of the batch.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp


@dataclass
class JudgeConfig:
    """Where and how to call the judge model."""

    base_url: str
    """OpenAI-compatible API root, including the version path, e.g. ``http://127.0.0.1:8000/v1``; requests go to
    ``{base_url}/chat/completions``."""
    model: str
    """Model name sent in each request (the name ``vllm serve`` was started with, or the hosted model id)."""
    api_key_env: str | None = "OPENAI_API_KEY"
    """Environment variable holding the API key, read at request time. Unset/empty (or None here): no
    ``Authorization`` header is sent."""
    max_concurrency: int = 32
    """Requests in flight at once, per batch."""
    timeout_s: float = 60.0
    """Per-request time limit in seconds (connect + response). A timed-out request is not retried."""
    max_retries: int = 3
    """Retries per request after connection errors, HTTP 5xx or HTTP 429."""
    backoff_s: float = 0.5
    """First retry delay in seconds; doubles with each retry (times a random factor in [1, 1.5))."""
    temperature: float = 0.0
    """Sampling temperature sent with every request."""
    max_tokens: int = 1024
    """Completion token limit sent with every request."""
    extra_body: dict[str, Any] = field(default_factory=dict)
    """Extra JSON fields merged into every request, e.g. ``{"chat_template_kwargs": {"enable_thinking": false}}``
    for a Qwen3 judge on vllm."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"JudgeConfig.base_url must be an http(s) URL of an OpenAI-compatible API root such as "
                f"http://127.0.0.1:8000/v1, got {self.base_url!r}"
            )
        if not self.model:
            raise ValueError("JudgeConfig.model must name the judge model (as served by the endpoint)")
        if not (self.max_concurrency >= 1 and self.max_retries >= 0 and 0 < self.timeout_s < math.inf
                and 0 <= self.backoff_s < math.inf):  # NaN fails every comparison
            raise ValueError(
                "JudgeConfig needs max_concurrency >= 1, max_retries >= 0, a finite timeout_s > 0 and a finite "
                "backoff_s >= 0, got "
                f"{self.max_concurrency}, {self.max_retries}, {self.timeout_s}, {self.backoff_s}"
            )

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"


@dataclass(frozen=True)
class JudgeReply:
    """The answer to one prompt: ``text`` on success, ``error`` (and ``text=None``) on failure."""

    text: str | None
    error: str | None = None
    latency_s: float = 0.0
    """Seconds from the first attempt to the final answer, retries and backoff included (queueing excluded)."""
    retries: int = 0


@dataclass(frozen=True)
class JudgeStats:
    """Counters of one ``chat`` batch."""

    calls: int = 0
    """Prompts in the batch."""
    failures: int = 0
    """Prompts that ended with an error."""
    retries: int = 0
    """Retried requests, summed over the batch."""
    latency_p50: float = 0.0
    latency_p90: float = 0.0
    latency_p99: float = 0.0
    """Nearest-rank percentiles of ``JudgeReply.latency_s`` over all prompts, in seconds."""
    wall_s: float = 0.0
    """Seconds the whole batch took."""

    def as_dict(self, prefix: str = "judge/") -> dict[str, float]:
        return {f"{prefix}{k}": float(v) for k, v in asdict(self).items()}


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


class _Retryable(Exception):
    """A failure worth another try (connection error, 5xx, 429)."""


class _Fatal(Exception):
    """A failure that another try would repeat (4xx, malformed body)."""


class JudgeClient:
    """Async, bounded-concurrency chat-completions client. ``stats`` describes the most recent ``chat`` batch."""

    def __init__(self, config: JudgeConfig):
        self.config = config
        self.stats = JudgeStats()
        self._log: list[JudgeReply] = []

    def take_replies(self) -> list[JudgeReply]:
        """Every reply since the previous call (all batches, in order), then forget them: per-step judge health
        (requests, failures, retries, latency percentiles, first failure) is computed from these."""
        replies, self._log = self._log, []
        return replies

    async def chat(self, prompts: Sequence[str]) -> list[JudgeReply]:
        """Send each prompt as one user message; one reply per prompt, in order. Never raises for a failed request."""
        cfg = self.config
        start = time.monotonic()
        if not prompts:
            self.stats = JudgeStats()
            return []
        semaphore = asyncio.Semaphore(cfg.max_concurrency)
        # One session per batch: aiohttp sessions belong to one event loop, and the sync API runs a loop per call.
        connector = aiohttp.TCPConnector(limit=cfg.max_concurrency)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=cfg.timeout_s)) as s:
            replies = await asyncio.gather(*(self._one(s, semaphore, p) for p in prompts))
        self._log.extend(replies)
        latencies = [r.latency_s for r in replies]
        self.stats = JudgeStats(
            calls=len(replies),
            failures=sum(r.error is not None for r in replies),
            retries=sum(r.retries for r in replies),
            latency_p50=percentile(latencies, 50),
            latency_p90=percentile(latencies, 90),
            latency_p99=percentile(latencies, 99),
            wall_s=time.monotonic() - start,
        )
        return list(replies)

    def _request(self, prompt: str) -> tuple[dict[str, Any], dict[str, str]]:
        cfg = self.config
        body = {
            **cfg.extra_body,
            "model": cfg.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": cfg.temperature,
            "max_tokens": cfg.max_tokens,
        }
        key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return body, headers

    async def _one(self, session: aiohttp.ClientSession, semaphore: asyncio.Semaphore, prompt: str) -> JudgeReply:
        cfg = self.config
        body, headers = self._request(prompt)
        started: float | None = None
        error = "no attempt made"
        for attempt in range(cfg.max_retries + 1):
            if attempt:
                # Backoff outside the semaphore, so that waiting retries do not hold a concurrency slot.
                await asyncio.sleep(cfg.backoff_s * 2 ** (attempt - 1) * random.uniform(1.0, 1.5))
            async with semaphore:
                started = started if started is not None else time.monotonic()
                try:
                    text = await self._attempt(session, body, headers)
                    return JudgeReply(text=text, latency_s=time.monotonic() - started, retries=attempt)
                except _Retryable as e:
                    error = str(e)
                except (asyncio.TimeoutError, TimeoutError):
                    error = f"judge request timed out after {cfg.timeout_s:g}s"
                    return JudgeReply(text=None, error=error, latency_s=time.monotonic() - started, retries=attempt)
                except _Fatal as e:
                    return JudgeReply(text=None, error=str(e), latency_s=time.monotonic() - started, retries=attempt)
        return JudgeReply(
            text=None,
            error=f"{error} (gave up after {cfg.max_retries} retries)",
            latency_s=time.monotonic() - (started or time.monotonic()),
            retries=cfg.max_retries,
        )

    async def _attempt(self, session: aiohttp.ClientSession, body: dict[str, Any], headers: dict[str, str]) -> str:
        try:
            async with session.post(self.config.url, json=body, headers=headers) as resp:
                raw = await resp.text()
                status = resp.status
        except (asyncio.TimeoutError, TimeoutError):
            raise
        except aiohttp.ClientError as e:  # refused, reset, dropped mid-response
            raise _Retryable(f"judge connection error: {type(e).__name__}: {e}") from None
        if status >= 500 or status == 429:
            raise _Retryable(f"judge HTTP {status}: {raw[:200]}")
        if status != 200:
            raise _Fatal(f"judge HTTP {status}: {raw[:300]}")
        try:
            content = json.loads(raw)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise _Fatal(f"judge returned a malformed chat-completions body: {raw[:200]!r}") from None
        if not isinstance(content, str):
            raise _Fatal("judge reply has no text content (a reasoning-only answer?)")
        return content
