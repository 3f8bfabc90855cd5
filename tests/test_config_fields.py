"""Config dataclasses -> flags (``openrlhf_classmate.config_fields``): argparse types from the annotation objects,
help with range and default from the field alone, and, for every group we add, ranges stated in the help that the
launch checks enforce."""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field

import pytest

from openrlhf_classmate.config_fields import Bound, add_dataclass_group, option_help
from openrlhf_classmate.integration.classmate_config import ClassmateConfig, EngineConfig
from openrlhf_classmate.integration.launch.args import build_parser, parse_args
from openrlhf_classmate.integration.launch.preflight import RANGES
from openrlhf_classmate.integration.training.logprobs_options import LogprobsConfig
from openrlhf_classmate.rewards.darling import DarlingConfig
from openrlhf_classmate.rewards.vrcli import VrcliConfig
from openrlhf_classmate.scoring.tinyv import TinyVConfig


@dataclass
class Toy:
    """Toy group."""

    ids: list[int] | None = field(default=None, metadata={"help": "Ids"})
    scale: float | None = field(default=None, metadata={"help": "Scale, 50% by default", "range": Bound(0, 1)})
    flag: bool = field(default=False, metadata={"help": "A switch"})
    name: str = field(default="x", metadata={"help": "A name"})
    names: list[str] = field(default_factory=lambda: ["a"], metadata={"help": "Names"})
    pair: list[float] = field(default_factory=lambda: [0.5, 2.0], metadata={"help": "Two", "nargs": 2})


def _toy_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_dataclass_group(parser, "toy", Toy)
    return parser


def test_argparse_types_come_from_the_annotation_objects():
    ns = vars(_toy_parser().parse_args(["--toy.ids", "1", "22", "--toy.scale", "0.25", "--toy.flag", "--toy.name",
                                        "y", "--toy.names", "b", "c", "--toy.pair", "1", "3"]))
    assert ns == {"toy.ids": [1, 22], "toy.scale": 0.25, "toy.flag": True, "toy.name": "y", "toy.names": ["b", "c"],
                  "toy.pair": [1.0, 3.0]}
    assert all(type(v) is int for v in ns["toy.ids"]) and type(ns["toy.pair"][0]) is float


def test_defaults_and_bad_values():
    ns = vars(_toy_parser().parse_args([]))
    assert ns == {"toy.ids": None, "toy.scale": None, "toy.flag": False, "toy.name": "x", "toy.names": ["a"],
                  "toy.pair": [0.5, 2.0]}
    with pytest.raises(SystemExit):
        _toy_parser().parse_args(["--toy.ids", "1.5"])  # an int list refuses a float (a str list would take it)
    with pytest.raises(SystemExit):
        _toy_parser().parse_args(["--toy.pair", "1"])  # the explicit nargs wins over the list's "+"


def test_an_annotation_without_a_mapping_is_refused_naming_the_field():
    @dataclass
    class Bad:
        """Bad group."""

        table: dict[str, int] = field(default_factory=dict, metadata={"help": "A table"})

    with pytest.raises(TypeError, match=r"Bad.table: no argparse type .* config_fields.ARG_TYPES"):
        add_dataclass_group(argparse.ArgumentParser(), "bad", Bad)


def test_help_states_range_and_default_once_and_survives_a_percent_sign():
    fields = {f.name: f for f in dataclasses.fields(Toy)}
    assert option_help(fields["scale"]) == "Scale, 50% by default. Must be in [0, 1]; default: unset."
    assert option_help(fields["pair"]) == "Two. Default: 0.5 2."
    assert option_help(fields["flag"]) == "A switch. Default: off."
    assert "Scale, 50% by default" in _toy_parser().format_help()  # argparse %-formats help: escaped


def test_every_ranged_classmate_and_engine_option_states_the_range_preflight_enforces():
    helps = {action.dest: action.help for action in build_parser()._actions}
    for dotted, bound in RANGES.items():
        assert f"Must be {bound.text()}" in helps[dotted], dotted
    assert "Must be >= 1; default: 60." in helps["classmate.judge_timeout_s"]
    assert "Must be >= 0; default: 3." in helps["classmate.judge_max_retries"]
    assert "Must be >= 1; default: 32." in helps["classmate.judge_max_concurrency"]
    assert helps["classmate.top_p"].endswith("Must be in (0, 1]; default: 1.")


def _numeric(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if "int" in str(f.type) or "float" in str(f.type)]


@pytest.mark.parametrize("cls", [TinyVConfig, DarlingConfig, VrcliConfig, LogprobsConfig], ids=lambda c: c.__name__)
def test_every_numeric_option_of_the_reward_method_groups_has_a_range(cls):
    assert [f.name for f in _numeric(cls) if "range" not in f.metadata] == []


def _outside(f: dataclasses.Field) -> list[str]:
    """Values just outside the field's range (none for an unbounded one)."""
    bound: Bound | None = f.metadata["range"]
    if bound is None:
        return []
    step = 1 if "int" in str(f.type) else 0.01
    out = []
    if bound.lo != -math.inf:
        out.append(bound.lo if bound.lo_open else bound.lo - step)
    if bound.hi != math.inf:
        out.append(bound.hi if bound.hi_open else bound.hi + step)
    return [f"{v:g}" for v in out]


BASE = ["--actor.model_name_or_path", "policy", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--data.prompt_dataset", "d.jsonl", "--rollout.batch_size", "4", "--rollout.micro_batch_size", "2",
        "--rollout.n_samples_per_prompt", "4", "--vllm.num_engines", "1"]
ENABLE = {
    "tinyv": ["--tinyv.base_url", "http://127.0.0.1:9/v1", "--tinyv.mode", "mixed"],
    "darling": ["--algo.advantage.estimator", "dr_grpo", "--darling.diversity", "partition",
                "--darling.classifier_urls", "http://127.0.0.1:9/v1", "--darling.combine", "additive"],
    "darling.ngram": ["--algo.advantage.estimator", "dr_grpo", "--darling.diversity", "ngram"],
    "vrcli": ["--algo.kl.init_coef", "1e-6", "--data.label_key", "label", "--vrcli.enable", "--vrcli.baseline",
              "online"],
    "logprobs": ["--logprobs.chunked"],
}
CASES = [(prefix, f.name, value) for prefix, cls in (("tinyv", TinyVConfig), ("darling", DarlingConfig),
                                                     ("vrcli", VrcliConfig), ("logprobs", LogprobsConfig))
         for f in _numeric(cls) for value in _outside(f)]


@pytest.mark.parametrize("prefix,name,value", CASES, ids=[f"{p}.{n}={v}" for p, n, v in CASES])
def test_the_launch_checks_refuse_a_value_just_outside_the_range_the_help_states(prefix, name, value):
    enable = ENABLE["darling.ngram" if name == "ngram_n" else prefix]
    parse_args(BASE + enable)  # the run is valid without the bad value
    with pytest.raises(SystemExit, match=rf"error: .*--{prefix}\.{name}"):
        parse_args(BASE + enable + [f"--{prefix}.{name}", value])


# ── every number finite: one type for every float flag, one check for every group's field ──

GROUPS = [("classmate", ClassmateConfig), ("engine", EngineConfig), ("tinyv", TinyVConfig), ("darling", DarlingConfig),
          ("vrcli", VrcliConfig), ("logprobs", LogprobsConfig)]
# (prefix, field, value); a field of two values gets the bad one first (argparse would read a second '-inf' as an
# option, so those fields get nan and inf only)
NON_FINITE = [(prefix, f.name, value) for prefix, cls in GROUPS for f in dataclasses.fields(cls)
              if "float" in str(f.type) for value in ("nan", "inf", "-inf")
              if not (f.metadata.get("nargs") == 2 and value == "-inf")]


@pytest.fixture(scope="module")
def parser():
    return build_parser()


def test_every_float_flag_ours_and_upstreams_parses_as_a_finite_number(parser):
    from openrlhf_classmate.config_fields import finite_float, not_nan_float
    from openrlhf_classmate.integration.launch.args import INFINITE_OK

    floats = {a.dest: a.type for a in parser._actions if a.type in (float, finite_float, not_nan_float)}
    assert len(floats) > 40 and float not in floats.values()
    assert {d for d, t in floats.items() if t is not_nan_float} == set(INFINITE_OK)


@pytest.mark.parametrize("prefix,name,value", NON_FINITE, ids=[f"{p}.{n}={v}" for p, n, v in NON_FINITE])
def test_every_float_field_of_every_group_refuses_non_finite_values(parser, prefix, name, value, capsys):
    action = next(a for a in parser._actions if a.dest == f"{prefix}.{name}")
    if isinstance(action.nargs, int):
        argv = [f"--{prefix}.{name}", value, "1"]
    else:
        argv = [f"--{prefix}.{name}={value}"]  # '=' keeps argparse from reading -inf as an option
    with pytest.raises(SystemExit):
        parser.parse_args(BASE + argv)
    assert capsys.readouterr().err == (f"error: argument --{prefix}.{name}: must be a finite number, got "
                                       f"{value!r}\n")


def test_configs_built_in_code_are_checked_by_the_same_ranges():
    from openrlhf_classmate.config_fields import field_problem
    from openrlhf_classmate.sandbox.config import SandboxConfig

    with pytest.raises(ValueError, match=r"--tinyv.timeout_s must be a finite number, got inf"):
        TinyVConfig(base_url="http://127.0.0.1:9/v1", timeout_s=math.inf)  # e.g. from OPENRLHF_CLASSMATE_TINYV
    with pytest.raises(ValueError, match=r"--tinyv.backoff_s must be >= 0, got -1"):
        TinyVConfig(base_url="http://127.0.0.1:9/v1", backoff_s=-1)
    assert field_problem("darling", DarlingConfig, DarlingConfig(quality_values=[1.0, math.nan])) == (
        "--darling.quality_values must be a finite number, got nan")
    assert field_problem("vrcli", VrcliConfig, VrcliConfig(thresholds=[math.nan, 1.0])) == (
        "--vrcli.thresholds must be a finite number, got nan")
    assert field_problem("darling", DarlingConfig, DarlingConfig()) is None
    with pytest.raises(ValueError, match="finite numbers > 0: max_time_limit=inf"):
        SandboxConfig(max_time_limit=math.inf)
