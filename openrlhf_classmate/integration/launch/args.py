"""Command line of ``python -m openrlhf_classmate.cli.train_ppo_ray``.

Upstream's parser and its validation live inside ``if __name__ == "__main__":`` of
``openrlhf/cli/train_ppo_ray.py`` and cannot be imported. Instead of copying ~430 lines we parse that file with
``ast`` (read as text: importing the module would import Ray, DeepSpeed, the trainer and vLLM, which parsing does not
need) and execute its own statements: everything before ``args = parser.parse_args()`` builds the parser, we add
the ``--classmate.*`` group and ``--config``, parse, then execute upstream's post-processing (``hierarchize`` and all
its checks) minus the final ``train(args)`` call. So every upstream flag, default and check is upstream's own.

``--config FILE.yaml`` holds nested keys (``actor: {adam: {lr: 1e-6}}``) that map to the dotted flags
(``--actor.adam.lr``). The file is turned into command-line tokens placed *before* the real command line, so
explicit flags win and every value goes through argparse's own type conversion and ``choices`` checks. Unknown or
duplicate keys, a flag written twice (nested and dotted), a key without a value, YAML syntax errors and non-UTF-8
files are refused with the file and line. YAML merge keys (``<<: *anchor``) work; a key that would silently replace
a whole merged mapping (merges are shallow) is refused.

Every problem ends in one line ``error: ...``: argparse's usage errors (without the few-hundred-flag usage text,
naming the config file when the value came from it) and upstream's ``assert`` checks included.

What runs when, in :func:`parse_args` (upstream = ``openrlhf/cli/train_ppo_ray.py``'s main block, split by
:func:`_upstream_main_block` at its ``args = parser.parse_args()`` line)::

    build_parser()
      exec upstream's statements before parse_args()   -> upstream's parser, every upstream flag and default
      add --config, --check and our groups             -> --classmate.* --engine.* --tinyv.* --darling.* --vrcli.*
                                                          --logprobs.*
    --config FILE.yaml -> argv tokens, placed before the command line (explicit flags win)
    parser.parse_args(argv)                            -> flat namespace, keys "actor.adam.lr", ...
      (every float: finite_float, NaN / inf refused)
    _resolve_upstream_defaults(flat, argv)             -> reward.remote_url := our reward function (no reward given),
                                                          algo.advantage.estimator := group_norm (classmate run
                                                          without one); each logged
    classmate run with --rollout.n_samples_per_prompt < 2 -> error (before upstream's bare assert on the same)
    exec upstream's statements after parse_args(),     -> hierarchize (nested args.actor.adam.lr) and upstream's
      except the final train(args)                        checks; an AssertionError becomes a ConfigError
    check_flag_groups                                  -> every number of our groups inside its field's range
    resolve_classmate_args -> validate_classmate_args  -> our derived values (logged; --classmate.placement auto
                                                          against the GPUs: integration/launch/layout.py), then our checks
    validate_model_options                             -> --ds.lora / ring_attn / tensor_parallel / liger: refused
                                                          where they cannot work (integration/launch/model_options.py)
    validate_reward_method_args, validate_vrcli_args   -> --tinyv/--darling/--vrcli checks (VR-CLI also swaps the
                                                          engine reward for a pending one, logged)
    validate_logprobs_args                             -> --logprobs.* checks (the model's config: preflight)
    check_sampling_args                                -> every sampling setting through vLLM's SamplingParams

The launcher (``cli/train_ppo_ray.py``) then runs the preflight and starts Ray.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import functools
import importlib
import importlib.util
import re
import sys
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import openrlhf_classmate  # noqa: F401  (CPU shims before openrlhf imports)
from openrlhf_classmate.config_fields import field_problem, refuse_non_finite
from openrlhf_classmate.integration.classmate_config import (
    REWARD_FUNC_PATH,
    add_classmate_arguments,
    is_registry_reward_func,
    log_resolved,
)
from openrlhf_classmate.integration.experience.reward_methods import (
    add_reward_method_arguments,
    validate_reward_method_args,
    validate_vrcli_args,
)
from openrlhf_classmate.integration.launch.classmate_args import resolve_classmate_args, validate_classmate_args
from openrlhf_classmate.integration.launch.model_options import validate_model_options
from openrlhf_classmate.integration.launch.sampling_checks import check_sampling_args
from openrlhf_classmate.integration.training.logprobs_options import add_logprobs_arguments, validate_logprobs_args
from openrlhf_classmate.rewards.vrcli import add_vrcli_arguments


class ConfigError(ValueError):
    """A bad ``--config`` file or an invalid combination of flags."""


INFINITE_OK = ("ckpt.max_mem", "reward.clip_range")
"""Upstream float flags where an infinite value means "no limit" (``--ckpt.max_mem``'s default is inf; a reward clip
range of -inf inf clips nothing); NaN is refused there too."""


def flag_groups() -> tuple[tuple[str, type], ...]:
    """Our flag groups: (prefix, config dataclass)."""
    from openrlhf_classmate.integration.classmate_config import ClassmateConfig, EngineConfig
    from openrlhf_classmate.integration.training.logprobs_options import LogprobsConfig
    from openrlhf_classmate.rewards.darling import DarlingConfig
    from openrlhf_classmate.rewards.vrcli import VrcliConfig
    from openrlhf_classmate.scoring.tinyv import TinyVConfig

    return (("classmate", ClassmateConfig), ("engine", EngineConfig), ("tinyv", TinyVConfig),
            ("darling", DarlingConfig), ("vrcli", VrcliConfig), ("logprobs", LogprobsConfig))


def check_flag_groups(args: SimpleNamespace) -> None:
    """Every number of every group we add: finite and inside its field's ``range`` (config_fields), whether the
    group is on or not; one ``error:`` line naming the flag."""
    for prefix, cls in flag_groups():
        problem = field_problem(prefix, cls, getattr(args, prefix))
        if problem:
            raise SystemExit(f"error: {problem}")


UPSTREAM_CLI = "openrlhf.cli.train_ppo_ray"


@functools.lru_cache(maxsize=1)
def _upstream_source() -> str:
    """``openrlhf/cli/train_ppo_ray.py``'s text, read without importing it: its imports pull in Ray, DeepSpeed,
    transformers and vLLM (8-9 s of the launcher's start on a CPU machine, more on the GPU machine), which parsing
    and the preflight do not need; the run imports them after the preflight."""
    spec = importlib.util.find_spec(UPSTREAM_CLI)  # imports the openrlhf and openrlhf.cli packages only
    if spec is None or not spec.origin:
        raise RuntimeError(f"{UPSTREAM_CLI} is not installed")
    with open(spec.origin, encoding="utf-8") as f:
        return f.read()


@functools.lru_cache(maxsize=1)
def _upstream_tree() -> ast.Module:
    """:func:`_upstream_source` parsed, once per process (compiling its statements leaves the tree as it is)."""
    return ast.parse(_upstream_source())


def _upstream_main_block() -> tuple[list[ast.stmt], list[ast.stmt], str]:
    source, tree = _upstream_source(), _upstream_tree()
    main = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and ast.unparse(node.test) in (
            "__name__ == '__main__'",
            '__name__ == "__main__"',
        )
    ]
    if len(main) != 1:
        raise RuntimeError("openrlhf.cli.train_ppo_ray has no single `if __name__ == '__main__':` block")
    body = main[0].body
    split = [i for i, stmt in enumerate(body) if ast.unparse(stmt) == "args = parser.parse_args()"]
    if len(split) != 1:
        raise RuntimeError("openrlhf.cli.train_ppo_ray: `args = parser.parse_args()` not found exactly once")
    build, post = body[: split[0]], body[split[0] + 1 :]
    if not post or ast.unparse(post[-1]) != "train(args)":
        raise RuntimeError("openrlhf.cli.train_ppo_ray: the main block no longer ends with `train(args)`")
    return build, post[:-1], source


def free_names(stmts: list[ast.stmt]) -> set[str]:
    """The names ``stmts`` read without binding them themselves (module globals or builtins)."""
    bound, read = set(), set()
    for node in (n for stmt in stmts for n in ast.walk(stmt)):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, ast.Store | ast.Del) else read).add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return read - bound - set(dir(builtins))


def _binds(node: ast.Import | ast.ImportFrom) -> set[str]:
    return {(alias.asname or alias.name).split(".")[0] for alias in node.names}


def _upstream_namespace(stmts: list[ast.stmt]) -> dict[str, Any]:
    """The globals ``stmts`` of upstream's main block run with, as the block would see them, minus ``__main__``: the
    module's own top-level imports that bind the names the statements read (0.11.2: ``import argparse`` and ``from
    datetime import datetime``), run on their own, so that the module's other imports (Ray, the trainer) are not;
    where a name read is no such import's (a function or constant of the module), the module's own globals."""
    needed = free_names(stmts) - {"args", "parser"}  # the two parse_args() provides
    imports = [node for node in _upstream_tree().body
               if isinstance(node, ast.Import | ast.ImportFrom) and _binds(node) & needed]
    namespace: dict[str, Any] = {}
    if needed <= set().union(*map(_binds, imports)):
        _exec(imports, namespace)
    else:
        namespace = dict(vars(importlib.import_module(UPSTREAM_CLI)))
    namespace["__name__"] = "openrlhf_classmate_args"
    return namespace


def _exec(stmts: list[ast.stmt], namespace: dict[str, Any]) -> None:
    module = ast.Module(body=stmts, type_ignores=[])
    exec(compile(module, "<openrlhf.cli.train_ppo_ray __main__>", "exec"), namespace)


def build_parser() -> argparse.ArgumentParser:
    """Upstream's parser plus the ``--classmate.*`` group and ``--config``."""
    build, _, _ = _upstream_main_block()
    namespace = _upstream_namespace(build)
    _exec(build, namespace)
    parser: argparse.ArgumentParser = namespace["parser"]
    parser.prog = "python -m openrlhf_classmate.cli.train_ppo_ray"
    parser.add_argument(
        "--config",
        type=str,
        default=None,
        help="YAML file whose nested keys map to the dotted flags; explicit command-line flags override it",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        default=False,
        help="parse the flags and run the preflight (paths, datasets, labels, judge, tokenizers, ranges), print "
        "what was checked and exit without starting Ray: 0 when the run would start",
    )
    add_classmate_arguments(parser)
    add_reward_method_arguments(parser)
    add_vrcli_arguments(parser)
    add_logprobs_arguments(parser)
    # upstream's float flags too: NaN / inf never; inf only where it means "no limit"
    refuse_non_finite(parser, allow_inf=INFINITE_OK)
    parser.error = _one_line_error  # type: ignore[method-assign]
    return parser


def _one_line_error(message: str, config: str | None = None, config_flags: frozenset[str] = frozenset()) -> None:
    """argparse's usage error as one line (its usage text lists hundreds of flags), naming the config file when the
    offending value came from it."""
    m = re.match(r"argument (--[\w.]+)", message)
    if m and config and m.group(1) in config_flags:
        message += f" (set in --config {config})"
    sys.stderr.write(f"error: {message}\n")
    raise SystemExit(2)


class YamlMapping(dict):
    """A YAML mapping that remembers the line of each of its keys (``lines``), for messages."""

    lines: dict[Any, int]


def _flatten(tree: dict, path: str, prefix: str = "") -> dict[str, tuple[Any, int | None]]:
    """``{"actor.adam.lr": (value, line)}``; ConfigError for a flag written twice (nested and dotted, e.g.
    ``classmate: {temperature: 1}`` and ``classmate.temperature: 1``), naming both lines."""
    flat: dict[str, tuple[Any, int | None]] = {}
    lines = getattr(tree, "lines", {})
    for key, value in tree.items():
        dotted, line = f"{prefix}{key}", lines.get(key)
        items = _flatten(value, path, dotted + ".") if isinstance(value, dict) else {dotted: (value, line)}
        for name, (v, at) in items.items():
            if name in flat:
                raise ConfigError(f"--config {path}: '{name}' is given twice, at {path}:{flat[name][1]} and "
                                  f"{path}:{at} (nested and dotted keys name the same flag); keep one")
            flat[name] = (v, at)
    return flat


MERGE_TAG = "tag:yaml.org,2002:merge"


def load_yaml(path: str, what: str = "--config") -> Any:
    """A YAML file's content (mappings as :class:`YamlMapping`); ConfigError naming the file and line for unreadable,
    non-UTF-8 or invalid YAML, for a key given twice in one mapping (PyYAML would silently keep the last) and for a
    key that replaces a whole mapping brought in by a merge key (``<<: *anchor`` merges are shallow: the merged
    mapping's other keys would be dropped silently). Merge keys work as YAML defines them otherwise."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        explicit = set()
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:
                continue
            explicit.add(id(key_node))
            key = loader.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(f"{what} {path}:{line}: duplicate key '{key}' (first at line {seen[key]}); "
                                  "keep one")
            seen[key] = line
        loader.flatten_mapping(node)  # merged pairs first, then the explicit ones (which win)
        merged = {k.value: v for k, v in node.value if id(k) not in explicit}
        for key_node, value_node in node.value:
            other = merged.get(key_node.value) if id(key_node) in explicit else None
            if (isinstance(other, yaml.MappingNode) and isinstance(value_node, yaml.MappingNode)
                    and not any(k.tag == MERGE_TAG for k, _ in value_node.value)):  # merging inside it is fine
                raise ConfigError(f"{what} {path}:{key_node.start_mark.line + 1}: '{key_node.value}' replaces the whole "
                                  f"'{key_node.value}' mapping of the merge key (YAML merges are shallow: its other "
                                  f"keys would be dropped); merge inside it ({key_node.value}: {{<<: *anchor, ...}}) "
                                  "or write every key")
        out = YamlMapping(loader.construct_mapping(node, deep=deep))
        out.lines = {loader.construct_object(k, deep=deep): k.start_mark.line + 1 for k, _ in node.value}
        return out

    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except IsADirectoryError:
        raise ConfigError(f"{what} {path}: is a directory, not a YAML file") from None
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot read the file ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(f"{what} {path}:{line}: not UTF-8 text (byte {e.start}); save the file as UTF-8") from None
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506  (SafeLoader subclass)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        problem = " ".join(str(getattr(e, "problem", "") or e).split())
        raise ConfigError(f"{what} {where}: not valid YAML ({problem})") from None


def config_to_argv(path: str, parser: argparse.ArgumentParser) -> list[str]:
    """Turn a YAML config into command-line tokens, checking every key against the parser."""
    tree = load_yaml(path)
    if tree is None:
        return []
    if not isinstance(tree, dict):
        raise ConfigError(f"--config {path}: the top level must be a mapping of flag groups, got {type(tree).__name__}")
    actions = {a.dest: a for a in parser._actions}
    argv: list[str] = []
    for key, (value, line) in _flatten(tree, path).items():
        where = f"{path}:{line}" if line else path
        if value is None:
            # an empty value (``model_name_or_path:``) would silently leave the flag at its default
            raise ConfigError(f"--config {where}: '{key}' has no value; give one or delete the key")
        action = actions.get(key)
        members = sorted(d for d in actions if d.startswith(key + "."))
        if action is None and members:  # ``classmate: 5``: a scalar or list where a mapping of flags belongs
            raise ConfigError(f"--config {where}: '{key}' is a group of flags ({', '.join(members[:2])}, ...), not "
                              f"a value: give it a mapping of their keys, got {value!r:.60}")
        if action is None or key in ("config", "check"):
            close = [d for d in actions if d.split(".")[-1] == key.split(".")[-1]][:3]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"--config {path}: unknown key '{key}'{hint}")
        flag = f"--{key}"
        if isinstance(action, argparse._StoreTrueAction):
            if not isinstance(value, bool):
                raise ConfigError(f"--config {path}: '{key}' is a switch; use true or false, got {value!r}")
            if value:
                argv.append(flag)
            continue
        if isinstance(value, bool) and action.choices is not None and {"on", "off"} <= set(action.choices):
            # YAML 1.1 reads on/off (and true/false) as booleans: a choice of on/off (--logprobs.chunked)
            argv += [flag, "on" if value else "off"]
            continue
        if isinstance(value, list):
            if action.nargs in (None, 0, "?"):
                raise ConfigError(f"--config {path}: '{key}' takes one value, got a list")
            if isinstance(action.nargs, int) and len(value) != action.nargs:
                raise ConfigError(f"--config {where}: '{key}' takes {action.nargs} values, got {len(value)}: "
                                  f"{value!r:.60}; give a list of {action.nargs}")
            if not value and action.nargs == "+":
                raise ConfigError(f"--config {where}: '{key}' is an empty list; give at least one value or delete "
                                  "the key")
            if any(isinstance(v, (list, dict)) or v is None for v in value):
                raise ConfigError(f"--config {where}: '{key}' takes a flat list of values, got {value!r:.60}")
            argv += [flag, *(str(v) for v in value)]
        elif isinstance(value, dict):
            raise ConfigError(f"--config {path}: '{key}' is a value, got a mapping")
        elif isinstance(action.nargs, int) and action.nargs > 1:
            raise ConfigError(f"--config {where}: '{key}' takes {action.nargs} values, got one ({value!r:.60}); give "
                              f"a list of {action.nargs}")
        else:
            argv += [flag, str(value)]
    return argv


def upstream_check_message(message: str, args) -> str:
    """Upstream's ``assert`` messages use its pre-0.11 flag names; name ours (and the fix) where we know them."""
    estimator = getattr(args, "algo.advantage.estimator", None)
    if "requires n_samples_per_prompt > 1" in message:
        return (f"--algo.advantage.estimator {estimator} normalises over the samples of each prompt: set "
                "--rollout.n_samples_per_prompt >= 2 (or use --algo.advantage.estimator reinforce)")
    if "number of sample batches must be greater" in message:
        return ("--rollout.n_samples_per_prompt x --rollout.batch_size / --rollout.micro_batch_size must be at least "
                "the number of actor processes (--actor.num_nodes x --actor.num_gpus_per_node)")
    if "eval_dataset" in message and "requires" in message:
        return "--eval.dataset needs a reward: --reward.remote_url or --train.agent_func_path"
    return f"OpenRLHF's checks refused the flags: {message or 'assertion failed'}"


def _config_path(argv: Sequence[str]) -> str | None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    known, _ = pre.parse_known_args(list(argv))
    return known.config


def _resolve_upstream_defaults(flat: argparse.Namespace, argv: Sequence[str]) -> None:
    """The two upstream flags whose default we change, set before upstream's post-processing reads them; each change
    is logged."""
    urls = getattr(flat, "reward.remote_url")
    if isinstance(urls, str) and urls:
        # our reward function named by another path (relative, a symlink, a second checkout's copy): the launcher's
        # own path, which every later check compares against
        named = [u.strip() for u in urls.split(",")]
        resolved = [REWARD_FUNC_PATH if is_registry_reward_func(u) else u for u in named]
        if resolved != named:
            setattr(flat, "reward.remote_url", ",".join(resolved))
            log_resolved(f"--reward.remote_url {','.join(resolved)} (the scorer-registry reward function, given as "
                         f"{urls})")
    if not any(getattr(flat, key) for key in ("reward.remote_url", "reward.model_name_or_path", "train.agent_func_path")):
        # no reward model or function given: score answers with the scorer registry (the label's data_source)
        setattr(flat, "reward.remote_url", REWARD_FUNC_PATH)
        log_resolved(f"--reward.remote_url {REWARD_FUNC_PATH} (no reward given: the scorer registry scores the "
                     "answers by each label's data_source)")
    if getattr(flat, "classmate.model_name_or_path") and "--algo.advantage.estimator" not in argv:
        # upstream's default (gae) would build a critic; the classmate estimators need a per-prompt-group baseline,
        # and upstream's GRPO one (group_norm) is the default (dr_grpo, rloo, reinforce_baseline also work)
        previous = getattr(flat, "algo.advantage.estimator")
        setattr(flat, "algo.advantage.estimator", "group_norm")
        log_resolved(f"--algo.advantage.estimator group_norm (a classmate run needs a per-prompt-group baseline; "
                     f"upstream's default is {previous})")


def parse_args(argv: Sequence[str] | None = None) -> SimpleNamespace:
    """Parse, run upstream's post-processing and checks, then resolve and validate our groups (see the module
    docstring for the order)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    config = _config_path(argv)
    if config:
        from_config = config_to_argv(config, parser)
        flags = frozenset(t for t in from_config if t.startswith("--")) - frozenset(argv)
        parser.error = lambda message: _one_line_error(message, config, flags)  # type: ignore[method-assign]
        argv = from_config + argv
    flat = parser.parse_args(argv)
    _resolve_upstream_defaults(flat, argv)
    if getattr(flat, "classmate.model_name_or_path") and getattr(flat, "rollout.n_samples_per_prompt") < 2:
        # before upstream's bare assertion on the same
        raise SystemExit("error: classmate estimators normalise per prompt group: set "
                         "--rollout.n_samples_per_prompt >= 2")
    _, post, _ = _upstream_main_block()
    namespace = _upstream_namespace(post)
    namespace.update(args=flat, parser=parser)
    try:
        _exec(post, namespace)
    except AssertionError as e:
        raise ConfigError(upstream_check_message(str(e), flat)) from None
    args = namespace["args"]
    check_flag_groups(args)
    resolve_classmate_args(args)
    validate_classmate_args(args)
    validate_model_options(args)
    validate_reward_method_args(args)
    validate_vrcli_args(args)
    validate_logprobs_args(args)
    check_sampling_args(args)
    return args
