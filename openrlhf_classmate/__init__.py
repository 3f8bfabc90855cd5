"""openrlhf_classmate: classmate chain-of-thought RL and sibling reward methods on OpenRLHF 0.11.2.

Importing the package installs the CPU import shims for ``flash_attn`` / ``vllm`` where the real packages are
missing (never over a real install), so ``import openrlhf_classmate`` must come before any ``openrlhf`` import.
"""

from openrlhf_classmate import shims as _shims

SHIMMED = _shims.install()

__version__ = "0.1.0"
