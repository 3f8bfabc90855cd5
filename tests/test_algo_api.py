"""The shape of the public ``openrlhf_classmate.algo`` API: data positionally, every option by keyword, and the layering
(``algo`` imports nothing of ours outside itself; ``algo``, ``scoring``, ``rewards`` and ``data`` never import the
launcher glue above them)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import openrlhf_classmate.algo as algo
from openrlhf_classmate.algo.losses import SeparatedPolicyLoss, VanillaClassmatePolicyLoss, _ClassmateLoss

MODULES = [importlib.import_module(f"openrlhf_classmate.algo.{m.name}") for m in pkgutil.iter_modules(algo.__path__)]


def _public_callables():
    for module in MODULES:
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(obj):
                yield f"{module.__name__}.{name}", obj
            elif inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if isinstance(member, classmethod):
                        member = member.__func__
                    if inspect.isfunction(member) and (attr == "__init__" or not attr.startswith("_")):
                        yield f"{module.__name__}.{name}.{attr}", member


def _is_flag(param: inspect.Parameter) -> bool:
    return isinstance(param.default, bool) or str(param.annotation) in ("bool", "bool | None")


@pytest.mark.parametrize(("name", "fn"), list(_public_callables()), ids=lambda x: x if isinstance(x, str) else "")
def test_boolean_options_are_keyword_only(name, fn):
    positional_flags = [p.name for p in inspect.signature(fn).parameters.values()
                        if _is_flag(p) and p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert positional_flags == [], f"{name} takes the flag(s) {positional_flags} positionally"


def test_compute_advantages_is_keyword_only_after_group_index():
    params = list(inspect.signature(algo.compute_advantages).parameters.values())
    names = [p.name for p in params]
    first_keyword = names.index("group_index") + 1
    assert names[:first_keyword] == ["estimator", "main_rewards", "classmate_rewards", "group_index"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[first_keyword:])


def test_both_losses_share_one_constructor():
    assert SeparatedPolicyLoss.__init__ is _ClassmateLoss.__init__
    shared = inspect.signature(_ClassmateLoss.__init__).parameters
    vanilla = inspect.signature(VanillaClassmatePolicyLoss.__init__).parameters
    # the vanilla loss only changes defaults (the reference's) and forwards everything else
    assert set(vanilla) - {"options"} <= set(shared)
    loss = VanillaClassmatePolicyLoss(classmate_clip_eps_low=0.3, max_response_len=16, is_correction_level="token")
    assert (loss.classmate_clip_eps_low, loss.max_response_len, loss.is_correction_level) == (0.3, 16, "token")
    assert (loss.dual_clip, loss.classmate_dual_clip, loss.loss_agg_mode) == (3.0, 3.0, "seq-mean-token-sum-norm")
    plain = SeparatedPolicyLoss()
    assert (plain.dual_clip, plain.classmate_dual_clip, plain.loss_agg_mode) == (None, None, "token-mean")
    with pytest.raises(TypeError):
        VanillaClassmatePolicyLoss(no_such_option=1)


def _imported_names(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth (function-local imports too); ``from pkg import mod`` counts as
    ``pkg.mod`` as well as ``pkg``."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return names


def test_algo_imports_nothing_of_ours_outside_algo():
    for module in MODULES:
        for imported in _imported_names(Path(module.__file__)):
            if imported.startswith("openrlhf_classmate"):
                assert imported.startswith("openrlhf_classmate.algo"), f"{module.__name__} imports {imported}"


# The layers that the launcher glue builds on: none of them may import the glue (or anything above it), even inside
# a function, or a lower module ends up in an import cycle with the code that imports it.
LOWER_PACKAGES = ("algo", "scoring", "rewards", "data")
UPPER_PACKAGES = ("integration", "cli", "demo")


@pytest.mark.parametrize("package", LOWER_PACKAGES)
def test_lower_layers_import_no_launcher_glue(package):
    root = Path(algo.__file__).parent.parent / package
    files = sorted(root.rglob("*.py"))
    assert files, f"no modules under {root}"
    upper = tuple(f"openrlhf_classmate.{name}" for name in UPPER_PACKAGES)
    bad = [f"{path.relative_to(root.parent)} imports {name}" for path in files for name in _imported_names(path)
           if name in upper or name.startswith(tuple(f"{u}." for u in upper))]
    assert not bad, "\n".join(bad)
