"""Coding-task scorers ``code`` and ``code_stdio``: run the model's program in the sandbox service against tests.

The program is the last complete fenced code block of the answer (```` ```python ... ``` ````; any language tag or
none). The service (``python -m openrlhf_classmate.sandbox``) runs it once per test; the score is the fraction of
tests passed, or 1/0 when ``reward`` is ``all_or_nothing``. A response without a code block is the model's failure:
a valid 0. The service being unreachable, overloaded past the retries, or answering with an error is the scorer's
failure: the sample is invalid (``valid=False``), never a 0.

Labels::

    {"data_source": "code", "tests": ["assert add(1, 2) == 3", ...], "max_execution_time": 5}
    {"data_source": "code_stdio", "tests": [{"input": "1 2\\n", "output": "3\\n"}, ...]}

``max_execution_time`` (seconds per test, optional) overrides the configured default. Configuration comes from the
environment, so that it reaches OpenRLHF's engine processes (the launcher forwards ``OPENRLHF_CLASSMATE_*``):
``OPENRLHF_CLASSMATE_SANDBOX_URL`` (default ``http://127.0.0.1:8001``), ``OPENRLHF_CLASSMATE_CODE_REWARD``
(``fraction`` or ``all_or_nothing``), ``OPENRLHF_CLASSMATE_CODE_TIME_LIMIT`` (seconds; default: the service's),
``OPENRLHF_CLASSMATE_SANDBOX_TIMEOUT`` (seconds per HTTP request, default 600).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from openrlhf_classmate.scoring.base import BaseScorer
from openrlhf_classmate.scoring.labels import LabelError
from openrlhf_classmate.scoring.result import ScoreResult

REWARD_MODES = ("fraction", "all_or_nothing")
MIN_TIME_LIMIT_S = 0.1
"""Smallest time limit per test (a label's ``max_execution_time``, ``OPENRLHF_CLASSMATE_CODE_TIME_LIMIT``): a run of
an empty program takes ~20 ms of it on an idle machine, so below this every test times out (a valid 0 for every
sample), and at a microsecond or less the service fails every request (HTTP 500)."""
MIN_REQUEST_TIMEOUT_S = 1.0
"""Smallest ``OPENRLHF_CLASSMATE_SANDBOX_TIMEOUT`` (one request, all its tests), as the model-server request time
limits of the flag groups (``config_fields.REQUEST_TIMEOUT_S``)."""
_FENCE_RE = re.compile(r"```([^\n`]*)\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = ("", "python", "python3", "py", "py3")
# what a program has and an example call, its output or a shell line does not
_PROGRAM_RE = re.compile(r"^\s*(?:def |class |import |from \S+ import )|\bprint\(|\binput\(|\bsys\.stdin", re.MULTILINE)


@dataclass
class CodeSandboxConfig:
    """Where the sandbox service is and how its answers become rewards."""

    url: str = "http://127.0.0.1:8001"
    """Root URL of the sandbox service (``/test_program`` and ``/test_program_stdio`` are appended)."""
    reward: str = "fraction"
    """``fraction``: the share of tests passed, in [0, 1]; ``all_or_nothing``: 1.0 only when every test passes."""
    max_execution_time: float | None = None
    """Seconds per test sent when the label gives none; None lets the service use its default (10 s)."""
    timeout_s: float = 600.0
    """Time limit of one HTTP request (all its tests, queueing included). A timed-out request is not retried."""
    max_concurrency: int = 32
    """Requests in flight at once, per batch (the service queues the runs beyond its own concurrency)."""
    max_retries: int = 3
    """Retries after a connection error or an HTTP 5xx (503: the service's queue is full)."""
    backoff_s: float = 0.5
    """First retry delay in seconds; doubles with each retry (times a random factor in [1, 1.5))."""

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"sandbox url must be http(s)://HOST:PORT, got {self.url!r}")
        if self.reward not in REWARD_MODES:
            raise ValueError(f"code reward must be one of {REWARD_MODES}, got {self.reward!r}")
        if self.max_execution_time is not None and not MIN_TIME_LIMIT_S <= self.max_execution_time < math.inf:
            raise ValueError(f"max_execution_time must be a finite number of seconds >= {MIN_TIME_LIMIT_S:g}, got "
                             f"{self.max_execution_time}")
        if not (0 < self.timeout_s < math.inf and self.max_concurrency >= 1 and self.max_retries >= 0
                and 0 <= self.backoff_s < math.inf):  # NaN fails every comparison
            raise ValueError("sandbox client needs a finite timeout_s > 0, max_concurrency >= 1, max_retries >= 0 and "
                             "a finite backoff_s >= 0")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CodeSandboxConfig:
        env = os.environ if environ is None else environ
        kwargs: dict[str, Any] = {}
        names = {"url": "OPENRLHF_CLASSMATE_SANDBOX_URL", "reward": "OPENRLHF_CLASSMATE_CODE_REWARD",
                 "max_execution_time": "OPENRLHF_CLASSMATE_CODE_TIME_LIMIT",
                 "timeout_s": "OPENRLHF_CLASSMATE_SANDBOX_TIMEOUT"}
        for key, name in names.items():
            value = env.get(name)
            if value:
                if key in ("max_execution_time", "timeout_s"):
                    try:
                        kwargs[key] = float(value)
                    except ValueError:
                        raise ValueError(f"{name}={value!r} is not a number") from None
                    if not math.isfinite(kwargs[key]):
                        raise ValueError(f"{name}={value!r}: must be a finite number of seconds")
                    least = MIN_TIME_LIMIT_S if key == "max_execution_time" else MIN_REQUEST_TIMEOUT_S
                    if kwargs[key] < least:
                        what = "test" if key == "max_execution_time" else "sandbox request"
                        raise ValueError(f"{name}={value!r}: the time limit per {what} must be >= {least:g} s (below "
                                         f"it every {what.split()[-1]} times out); raise it")
                else:
                    kwargs[key] = value
        try:
            return cls(**kwargs)
        except ValueError as e:
            raise ValueError(f"{e} (from the OPENRLHF_CLASSMATE_SANDBOX_* / _CODE_* environment)") from None


def extract_program(text: str) -> str | None:
    """The program of a response: the last complete fenced block that is Python (tagged ``python``/``py`` or not
    tagged) and reads like a program (a ``def``, ``class``, import, ``print``, ``input`` or ``sys.stdin``), so that an
    example call or its output in a block after the program is not what runs; else the last complete fenced block;
    None when there is none."""
    blocks = _FENCE_RE.findall(text)
    programs = [body for tag, body in blocks if tag.strip().lower() in _PYTHON_TAGS and _PROGRAM_RE.search(body)]
    if programs:
        return programs[-1]
    return blocks[-1][1] if blocks else None


class _Retryable(Exception):
    pass


class CodeScorer(BaseScorer):
    """``code`` (assert tests, ``/test_program``) or ``code_stdio`` (stdin/stdout tests, ``/test_program_stdio``)."""

    def __init__(self, name: str = "code", config: CodeSandboxConfig | None = None):
        if name not in ("code", "code_stdio"):
            raise ValueError(f"CodeScorer name must be code or code_stdio, got {name!r}")
        self.name = name
        self.stdio = name == "code_stdio"
        self._config = config
        self.stats: dict[str, int] = {"requests": 0, "failures": 0, "retries": 0, "no_code_block": 0}
        """Counters of the most recent batch: service requests, failed ones (invalid samples), retries, and
        responses without a code block."""

    @property
    def config(self) -> CodeSandboxConfig:
        if self._config is None:
            self._config = CodeSandboxConfig.from_env()
        return self._config

    def check_config(self) -> None:
        self.config  # noqa: B018  (a malformed environment fails here, before any request)

    def check_label(self, label: Mapping[str, Any]) -> None:
        source = label.get("data_source")
        tests = label.get("tests")
        if not isinstance(tests, list) or not tests:
            raise LabelError("missing or not a non-empty list of tests", data_source=source, field="tests")
        for i, t in enumerate(tests):
            if self.stdio:
                ok = isinstance(t, Mapping) and isinstance(t.get("input"), str) and isinstance(t.get("output"), str)
                what = 'an object {"input": str, "output": str}'
            else:
                ok = isinstance(t, str) and bool(t.strip())
                what = "a non-empty string (an assert statement)"
            if not ok:
                raise LabelError(f"test {i} is not {what}: {t!r:.80}", data_source=source, field="tests")
        limit = label.get("max_execution_time")
        number = not isinstance(limit, bool) and isinstance(limit, (int, float))
        if limit is not None and not (number and MIN_TIME_LIMIT_S <= limit < math.inf):  # NaN fails it too
            short = (" (below it every test times out); raise it, or leave it out for the sandbox's default"
                     if number and 0 < limit < MIN_TIME_LIMIT_S else "")
            raise LabelError(f"must be a finite number of seconds >= {MIN_TIME_LIMIT_S:g}, got {limit!r:.40}{short}",
                             data_source=source, field="max_execution_time")

    async def _ascore_answers(self, items: Sequence[tuple[str, Mapping[str, Any]]]) -> list[ScoreResult]:
        cfg = self.config
        self.stats = {"requests": 0, "failures": 0, "retries": 0, "no_code_block": 0}
        semaphore = asyncio.Semaphore(cfg.max_concurrency)
        connector = aiohttp.TCPConnector(limit=cfg.max_concurrency)
        timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            return list(await asyncio.gather(*(self._one(session, semaphore, r, label) for r, label in items)))

    def _body(self, program: str, label: Mapping[str, Any]) -> dict[str, Any]:
        tests = [{"input": t["input"], "output": t["output"]} for t in label["tests"]] if self.stdio else list(
            label["tests"])
        body: dict[str, Any] = {"program": program, "tests": tests}
        limit = label.get("max_execution_time", self.config.max_execution_time)
        if limit is not None:
            body["max_execution_time"] = float(limit)
        return body

    async def _one(self, session: aiohttp.ClientSession, semaphore: asyncio.Semaphore, response: str,
                   label: Mapping[str, Any]) -> ScoreResult:
        program = extract_program(response)
        if program is None:
            self.stats["no_code_block"] += 1
            return ScoreResult(score=0.0, explanation="no fenced code block in the answer")
        cfg = self.config
        url = cfg.url.rstrip("/") + ("/test_program_stdio" if self.stdio else "/test_program")
        body = self._body(program, label)
        self.stats["requests"] += 1
        error = "no attempt made"
        for attempt in range(cfg.max_retries + 1):
            if attempt:
                self.stats["retries"] += 1
                await asyncio.sleep(cfg.backoff_s * 2 ** (attempt - 1) * random.uniform(1.0, 1.5))
            async with semaphore:
                try:
                    reply = await self._post(session, url, body)
                    return self._result(program, reply)
                except _Retryable as e:
                    error = str(e)
                except (asyncio.TimeoutError, TimeoutError):
                    error = f"sandbox request timed out after {cfg.timeout_s:g} s"
                    break
                except ValueError as e:  # a 4xx or a malformed reply: another try would repeat it
                    error = str(e)
                    break
        else:
            error = f"{error} (gave up after {cfg.max_retries} retries)"
        self.stats["failures"] += 1
        return ScoreResult.invalid(error, extracted=program)

    async def _post(self, session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            async with session.post(url, json=body) as resp:
                raw = await resp.text()
                status = resp.status
        except (asyncio.TimeoutError, TimeoutError):
            raise
        except aiohttp.ClientError as e:
            raise _Retryable(f"sandbox unreachable at {self.config.url}: {type(e).__name__}: {e}") from None
        if status >= 500:
            raise _Retryable(f"sandbox HTTP {status}: {raw[:300]}")
        if status != 200:
            raise ValueError(f"sandbox refused the request (HTTP {status}): {raw[:300]}")
        try:
            reply = json.loads(raw)
            fraction = float(reply["pass_fraction"])
            results = list(reply["results"])
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"sandbox returned a malformed body: {raw[:200]!r}") from None
        if not 0.0 <= fraction <= 1.0 or len(results) != len(body["tests"]):
            raise ValueError(f"sandbox returned an inconsistent body: {raw[:200]!r}")
        return reply

    def _result(self, program: str, reply: dict[str, Any]) -> ScoreResult:
        results = reply["results"]
        passed = sum(bool(r.get("passed")) for r in results)
        fraction = passed / len(results)
        score = fraction if self.config.reward == "fraction" else float(passed == len(results))
        explanation = f"{passed}/{len(results)} tests passed"
        failed = [(i, r) for i, r in enumerate(results) if not r.get("passed")]
        if failed:
            i, r = failed[0]
            explanation += f"; test {i}: {r.get('reason')}" + (f" ({r['detail']})" if r.get("detail") else "")
        return ScoreResult(score=score, extracted=program, explanation=explanation[:500])
