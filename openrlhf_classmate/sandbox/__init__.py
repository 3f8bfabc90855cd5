"""Code-execution sandbox service: runs untrusted programs against tests, for the ``code`` / ``code_stdio`` scorers.

``python -m openrlhf_classmate.sandbox --host 127.0.0.1 --port 8001`` serves ``GET /health``,
``POST /test_program`` (a program plus assert statements) and ``POST /test_program_stdio`` (a program plus
stdin / expected-stdout pairs). Modules: ``config`` (settings), ``service`` (isolation, slots and queue, one run,
verdicts), ``runner`` (builds the namespaces and limits of one run; a standalone script), ``launch`` (starts runners:
zygote or new interpreter), ``harness`` (the in-sandbox test harness), ``cgroups`` (per-slot cgroups), ``app`` (the
HTTP layer), ``testing`` (a real service in a subprocess, for tests and benchmarks).
"""

from openrlhf_classmate.sandbox.config import SandboxConfig

__all__ = ["SandboxConfig"]
