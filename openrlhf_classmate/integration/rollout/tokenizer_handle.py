"""The policy's tokenizer sent to each engine actor once, not with every prompt group.

Upstream's ``SamplesGenerator._dispatch_prompts_to_vllm`` passes ``hf_tokenizer=self.tokenizer`` in each
``generate_responses.remote(...)`` call, one call per prompt. Ray pickles the tokenizer for every call and the engine
actor unpickles it before the call starts, one call after the other: for a 152k-entry vocabulary that is 2.4 MB and
0.15-0.25 s of unpickling per call (`bench/tokenizer_dispatch.py`), so with 16 prompt groups the last group reaches
vLLM seconds after the first: on one H200 the rollout took 4-5.5 s where the standalone engine writes the same batch
in 1.8 s (``bench/GPU_RESULTS.md`` section 10).

Here the generator gives each engine the tokenizer once (``remember_tokenizer``, a method of both engine actors) and
then dispatches a :class:`TokenizerHandle` in its place: a few bytes that unpickle, in the engine's process, into the
tokenizer it already holds. The executors (upstream's, ours, a user's ``--train.agent_func_path``) get the real
tokenizer object, as before.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

# the tokenizers this process was given, by key (in an engine actor's process)
_REMEMBERED: dict[str, Any] = {}


def remember(key: str, tokenizer: Any) -> None:
    """Keep ``tokenizer`` under ``key`` in this process (an engine actor's ``remember_tokenizer``)."""
    _REMEMBERED[key] = tokenizer


def remembered(key: str) -> Any:
    """The tokenizer kept under ``key``; what a :class:`TokenizerHandle` unpickles into."""
    try:
        return _REMEMBERED[key]
    except KeyError:
        raise RuntimeError(f"engine process {os.getpid()} was sent tokenizer handle {key!r} without "
                           "the tokenizer (remember_tokenizer was not called on this engine first)") from None


class TokenizerHandle:
    """Stands for a tokenizer an engine actor already holds; it pickles as its key and unpickles as that tokenizer.

    In the process that made it (the generator's), it is never unpickled: it only travels."""

    def __init__(self, key: str | None = None):
        self.key = key or uuid.uuid4().hex

    def __reduce__(self):
        return remembered, (self.key,)


def engine_key(engine) -> Any:
    """An engine actor's identity: its Ray actor id (the same for every handle to it)."""
    actor_id = getattr(engine, "_actor_id", None)
    return actor_id.hex() if actor_id is not None else id(engine)


class TokenizerShipping:
    """Which engines of one generator hold its tokenizer; :meth:`handle_for` gives each one first, then the handle."""

    def __init__(self):
        self.handle = TokenizerHandle()
        self._given: set = set()  # the engine actors that hold it (engine_key)

    def handle_for(self, engines: list, tokenizer: Any) -> Any:
        """The object to dispatch as ``hf_tokenizer`` to ``engines``: the handle, once every engine holds the
        tokenizer (given here, all at once, on first use); the tokenizer itself where an engine cannot keep one."""
        import ray

        new = [e for e in engines if engine_key(e) not in self._given]
        if new:
            if not all(hasattr(e, "remember_tokenizer") for e in new):
                return tokenizer  # an engine class without the method: upstream's way, one copy per call
            ref = ray.put(tokenizer)  # pickled once for all the engines
            ray.get([e.remember_tokenizer.remote(self.handle.key, ref) for e in new])
            self._given.update(engine_key(e) for e in new)
        return self.handle
