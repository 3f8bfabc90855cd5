"""Parsing the launcher's flags reads upstream's ``train_ppo_ray.py`` as text and runs its main block without
importing the module: its imports (Ray, DeepSpeed, the trainer, vLLM) took 8.7 of the 9.9-11.6 s of ``--check`` on a
2-core CPU machine (``bench/launcher_profile.py``, a 152k-entry tokenizer), 5.1-5.2 s without them. The run imports
them after the preflight, so a bad flag is told that much sooner."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

from openrlhf_classmate.integration.launch import args as launch_args


def test_the_pinned_main_block_reads_only_argparse_and_datetime_of_its_module():
    # 0.11.2: the parser's statements use argparse and datetime, the post-processing none of the module's globals
    # (hierarchize is imported inside it); a release whose block reads more still parses (the next test)
    build, post, _ = launch_args._upstream_main_block()
    assert launch_args.free_names(build) == {"argparse", "datetime"}
    assert launch_args.free_names(post) == set()
    namespace = launch_args._upstream_namespace(build)
    import argparse
    from datetime import datetime

    assert namespace.keys() - {"__builtins__"} == {"argparse", "datetime", "__name__"}
    assert namespace["argparse"] is argparse and namespace["datetime"] is datetime  # as upstream imports them


def test_a_block_reading_other_globals_gets_them_as_the_module_binds_them():
    # a name one of the module's imports binds: that import alone
    stmts = ast.parse("strategy = get_strategy\nparser = argparse.ArgumentParser()").body
    assert launch_args.free_names(stmts) == {"get_strategy", "argparse"}
    namespace = launch_args._upstream_namespace(stmts)
    launch_args._exec(stmts, namespace)
    from openrlhf.utils import get_strategy

    assert namespace["strategy"] is get_strategy and "ray" not in namespace
    # a function of the module itself: the module's own globals
    namespace = launch_args._upstream_namespace(ast.parse("f = train").body)
    assert callable(namespace["train"]) and "ray" in namespace


def test_parsing_imports_neither_ray_nor_the_trainer(tmp_path):
    code = f"""
import json, sys
from openrlhf_classmate.integration.launch.args import parse_args
args = parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl", "--actor.num_gpus_per_node",
                   "1", "--ref.num_gpus_per_node", "1", "--rollout.n_samples_per_prompt", "4", "--vllm.num_engines", "1",
                   "--classmate.model_name_or_path", "m"])
assert args.actor.model_name_or_path == "m" and args.algo.advantage.estimator == "group_norm"
json.dump({{m: m in sys.modules for m in ("ray", "deepspeed", "openrlhf.trainer.ray", "openrlhf.cli.train_ppo_ray")}},
          open({str(tmp_path / "modules.json")!r}, "w"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.load(open(tmp_path / "modules.json")) == {
        "ray": False, "deepspeed": False, "openrlhf.trainer.ray": False, "openrlhf.cli.train_ppo_ray": False}
