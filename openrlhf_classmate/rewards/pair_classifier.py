"""Client of DARLING's pairwise equivalence classifier served by vLLM (``vllm serve CKPT --runner pooling``).

Each pair text (``CLS a SEP b SEP``, built by :func:`openrlhf_classmate.algo.darling.pair_text`) is POSTed as
``{"model": NAME, "input": [text, ...]}`` to ``<server>/classify``; the reply's ``data[k].probs[-1]`` is P(similar).
The model name of each server is read once from its ``/v1/models`` (the first id), as for the verifier.

Requests go round-robin over the servers. A failed attempt (connection error, timeout, HTTP error, malformed body)
moves on to the next server, so one server that is down costs retries, not pairs; only after ``max_retries`` more
attempts does a pair become unknown (``None``), which the caller must count and never read as "different".
Backoff (exponential from ``backoff_s``) applies when an attempt returns to a server it already tried.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp


def server_root(url: str) -> str:
    """``http://host:port`` from ``http://host:port``, ``.../`` or the OpenAI-style ``.../v1``."""
    root = url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


@dataclass(frozen=True)
class ClassifierSettings:
    urls: tuple[str, ...]
    """Server roots (``http://host:port`` or ``http://host:port/v1``)."""
    model: str | None = None
    """Model name sent to every server; None reads each server's first ``/v1/models`` id."""
    max_concurrency: int = 32
    """Requests in flight per server."""
    timeout_s: float = 600.0
    """Per-request limit (connect + answer), seconds."""
    max_retries: int = 2
    """Further attempts of a failed request, each on the next server."""
    backoff_s: float = 1.0
    """Wait before an attempt that returns to an already tried server; doubles each time."""
    pairs_per_request: int = 1
    """Pair texts per ``/classify`` request (1 = the reference's one pair per request)."""

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("the pair classifier needs at least one server URL")
        bad = [u for u in self.urls if not u.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"classifier URLs must be http(s) URLs such as http://127.0.0.1:8010/v1, got {bad}")
        if self.max_concurrency < 1 or self.timeout_s <= 0 or self.max_retries < 0 or self.backoff_s < 0 \
                or self.pairs_per_request < 1:
            raise ValueError("need max_concurrency >= 1, timeout_s > 0, max_retries >= 0, backoff_s >= 0 and "
                             "pairs_per_request >= 1")


@dataclass
class ClassifierStats:
    """Counters of the last :meth:`PairClassifier.classify` call."""

    pairs: int = 0
    requests: int = 0
    failed_pairs: int = 0
    retries: int = 0
    wall_s: float = 0.0
    errors: tuple[str, ...] = ()
    """Distinct error messages (at most 5), for the log."""


class _AttemptFailed(Exception):
    pass


class PairClassifier:
    """Async client; :meth:`classify` returns P(similar) per text, or None where every attempt failed."""

    def __init__(self, settings: ClassifierSettings):
        self.settings = settings
        self.roots = [server_root(u) for u in settings.urls]
        self._models: dict[str, str] = {}
        self._next = itertools.count()
        self.stats = ClassifierStats()

    async def _model(self, session: aiohttp.ClientSession, root: str) -> str:
        if self.settings.model:
            return self.settings.model
        if root not in self._models:
            try:
                async with session.get(f"{root}/v1/models") as resp:
                    body = await resp.text()
                    status = resp.status
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                raise _AttemptFailed(f"{root}/v1/models: {type(e).__name__}: {e}") from None
            try:
                if status != 200:
                    raise ValueError(f"HTTP {status}")
                self._models[root] = json.loads(body)["data"][0]["id"]
            except (ValueError, KeyError, IndexError, TypeError) as e:
                raise _AttemptFailed(f"{root}/v1/models gave no model id ({e}): {body[:200]!r}") from None
        return self._models[root]

    async def _post(self, session: aiohttp.ClientSession, root: str, texts: Sequence[str]) -> list[float]:
        model = await self._model(session, root)
        try:
            async with session.post(f"{root}/classify", json={"model": model, "input": list(texts)}) as resp:
                body = await resp.text()
                status = resp.status
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise _AttemptFailed(f"{root}/classify: {type(e).__name__}: {e}") from None
        if status != 200:
            raise _AttemptFailed(f"{root}/classify: HTTP {status}: {body[:200]}")
        try:
            data = sorted(json.loads(body)["data"], key=lambda d: d.get("index", 0))
            probs = [float(d["probs"][-1]) for d in data]
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise _AttemptFailed(f"{root}/classify: malformed reply {body[:200]!r}") from None
        if len(probs) != len(texts) or not all(0.0 <= p <= 1.0 for p in probs):
            raise _AttemptFailed(f"{root}/classify: {len(probs)} probabilities in [0, 1] expected {len(texts)}")
        return probs

    async def _request(self, session, semaphores, texts: Sequence[str], errors: list[str]
                       ) -> tuple[list[float] | None, int]:
        cfg = self.settings
        start = next(self._next)
        tried: set[int] = set()
        for attempt in range(cfg.max_retries + 1):
            server = (start + attempt) % len(self.roots)
            if server in tried:
                await asyncio.sleep(cfg.backoff_s * 2 ** (attempt - len(self.roots)))
            tried.add(server)
            async with semaphores[server]:
                try:
                    return await self._post(session, self.roots[server], texts), attempt
                except _AttemptFailed as e:
                    if len(errors) < 5 and str(e) not in errors:
                        errors.append(str(e))
        return None, cfg.max_retries

    async def classify(self, texts: Sequence[str]) -> list[float | None]:
        """P(similar) of every pair text, in order; None for a text whose request failed on every attempt."""
        cfg = self.settings
        started = time.monotonic()
        if not texts:
            self.stats = ClassifierStats()
            return []
        chunks = [list(texts[i : i + cfg.pairs_per_request]) for i in range(0, len(texts), cfg.pairs_per_request)]
        semaphores = [asyncio.Semaphore(cfg.max_concurrency) for _ in self.roots]
        errors: list[str] = []
        connector = aiohttp.TCPConnector(limit=cfg.max_concurrency * len(self.roots))
        timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            answers = await asyncio.gather(*(self._request(session, semaphores, c, errors) for c in chunks))
        out: list[float | None] = []
        for chunk, (probs, _) in zip(chunks, answers, strict=True):
            out.extend(probs if probs is not None else [None] * len(chunk))
        self.stats = ClassifierStats(
            pairs=len(texts), requests=len(chunks), failed_pairs=sum(p is None for p in out),
            retries=sum(r for _, r in answers), wall_s=time.monotonic() - started, errors=tuple(errors),
        )
        return out
