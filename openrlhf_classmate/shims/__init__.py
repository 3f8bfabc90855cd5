"""CPU import shims for ``flash_attn`` and ``vllm``.

OpenRLHF 0.11.2 imports both packages at module level on the PPO path (``openrlhf.models`` imports ``flash_attn``,
``openrlhf.trainer.ray`` imports ``vllm``), but neither installs
on a machine without CUDA. :func:`install` appends a directory holding a minimal stand-in to ``sys.path`` for each
package that cannot be found, so that every ``openrlhf.*`` module imports. Because the directories are appended
(never prepended) and only for packages that ``importlib`` cannot find, a real install always wins.

The stand-ins carry no ``*.dist-info``, so ``transformers.utils.is_flash_attn_2_available()`` stays False, and
anything that would really run vLLM raises :class:`VLLMNotInstalledError`.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
SHIM_DIRS = {
    "flash_attn": os.path.join(_HERE, "flash_attn_pkg"),
    "vllm": os.path.join(_HERE, "vllm_pkg"),
}


def _find_real(name: str):
    """``importlib.util.find_spec(name)`` with our shim directories hidden from the search."""
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p) not in SHIM_DIRS.values()]
        return importlib.util.find_spec(name)
    finally:
        sys.path[:] = saved


def is_shim(module) -> bool:
    """True when ``module`` is one of our stand-ins rather than the real package."""
    return bool(getattr(module, "__openrlhf_classmate_shim__", False))


def install() -> list[str]:
    """Make the stand-ins importable for every package that is missing. Returns the names shimmed."""
    shimmed = []
    for name, path in SHIM_DIRS.items():
        loaded = sys.modules.get(name)
        if loaded is not None and not is_shim(loaded):
            continue  # the real package is already imported
        if loaded is None and _find_real(name) is not None:
            continue  # the real package is installed
        if path not in sys.path:
            sys.path.append(path)
        shimmed.append(name)
    return shimmed
