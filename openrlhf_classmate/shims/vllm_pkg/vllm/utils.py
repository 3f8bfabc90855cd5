"""``vllm.utils.random_uuid``: 16 hex characters (the low 64 bits of a UUID4), as in vLLM 0.26-0.29."""

import uuid


def random_uuid() -> str:
    return f"{uuid.uuid4().int & ((1 << 64) - 1):016x}"
