"""Launch-time layout checks: the batch arithmetic refused with values that work, the GPUs a layout asks Ray for
counted against the GPUs available, ``--classmate.placement auto``, and the one placement rule that the flag's help,
the configs and the README state."""

from __future__ import annotations

import dataclasses
import glob
import os
import re
from types import SimpleNamespace

import pytest
import yaml

from openrlhf_classmate.cli import train_ppo_ray
from openrlhf_classmate.integration.classmate_config import AUTO_RULE, ClassmateConfig
from openrlhf_classmate.integration.launch import layout
from openrlhf_classmate.integration.launch.args import build_parser, parse_args
from openrlhf_classmate.integration.launch.layout import (
    Batches,
    batch_message,
    batch_problem,
    check_launch,
    fit_micro_batches,
    layout_of,
    rank_samples,
    working_values,
)
from openrlhf_classmate.integration.launch.preflight import PreflightError, PreflightReport

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GDPO = os.path.join(REPO, "configs", "classmate_gdpo.yaml")


@pytest.fixture(autouse=True)
def no_gpus(monkeypatch):
    """A CPU machine: no GPU count from the environment unless a test sets one (the count is cached per setting)."""
    for name in (layout.GPUS_ENV, layout.SERVER_MEMORY_ENV, "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    layout._available.cache_clear()
    yield
    layout._available.cache_clear()


def _gpus(n: int, nodes: int = 1) -> list[str]:
    """The flags train_scripts give a run on ``nodes`` x ``n`` GPUs: every GPU trains, engines colocated."""
    return ["--actor.num_nodes", str(nodes), "--actor.num_gpus_per_node", str(n), "--ref.num_nodes", str(nodes),
            "--ref.num_gpus_per_node", str(n), "--vllm.num_engines", str(n * nodes), "--classmate.num_engines",
            str(n * nodes)]


def _config_args(*extra: str):
    return parse_args(["--config", GDPO, "--engine.backend", "vllm", *extra])


def _refusal(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as info:
        train_ppo_ray.main(argv)
    return str(info.value.code)


# ── batch arithmetic ─────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("nodes, works", [(2, "--train.micro_batch_size 8"), (4, "--train.micro_batch_size 4")])
def test_the_shipped_configs_on_16_and_32_gpus_are_refused_by_check_naming_values_that_work(nodes, works):
    # 128 // 16 // 16 = 0 gradient-accumulation steps: DeepSpeed asserted after Ray and the engines had started,
    # while --check said the check passed
    error = _refusal(["--check", "--config", GDPO, *_gpus(8, nodes)])
    assert error.startswith(f"error: --train.batch_size 128 is not a multiple of --train.micro_batch_size 16 x "
                            f"{8 * nodes} actor GPUs = {16 * 8 * nodes}: DeepSpeed would take 128 // {128 * nodes} = "
                            "0 gradient-accumulation step(s) and assert"), error
    assert f"Values that work on {8 * nodes} actor GPU(s): {works}" in error and "\n" not in error
    # each value named works, and the config as it is works on one node
    b = layout.batches_of(parse_args(["--config", GDPO, *_gpus(8, nodes)]))
    for change in working_values(b):
        assert batch_problem(dataclasses.replace(b, **change)) is None
    check_launch(parse_args(["--config", GDPO, *_gpus(8)]), PreflightReport())


@pytest.mark.parametrize("b, start", [
    # DeepSpeed: train_batch_size == micro x gradient-accumulation steps x ranks
    (Batches(64, 8, 16, 96, 16, 4), "--train.batch_size 96 is not a multiple of --train.micro_batch_size 16 x 4 actor "
                                    "GPUs = 64: DeepSpeed would take 96 // 64 = 1 gradient-accumulation step(s)"),
    # a rollout that is not a whole number of optimizer steps (upstream's default --train.batch_size 128)
    (Batches(2, 2, 1, 128, 1, 1), "--rollout.batch_size 2 x --rollout.n_samples_per_prompt 2 = 4 samples per rollout "
                                  "is fewer than --train.batch_size 128"),
    (Batches(6, 4, 4, 16, 4, 1), "--rollout.batch_size 6 x --rollout.n_samples_per_prompt 4 = 24 samples per rollout "
                                 "is not a multiple of --train.batch_size 16"),
    # experiences the ranks cannot share evenly: upstream hands out ceil(experiences / ranks) per rank
    (Batches(3, 4, 5, 12, 1, 2), "the 12 samples of a rollout (--rollout.batch_size 3 x --rollout.n_samples_per_prompt "
                                 "4) in experiences of --rollout.micro_batch_size 5 cannot be shared evenly by the 2 "
                                 "actor GPUs: upstream's split gives them 2 to 10 samples each"),
    (Batches(4, 2, 8, 8, 1, 2), "the 8 samples of a rollout"),  # one experience for two ranks: one gets none
    # dynamic batching: each rank takes train_batch // ranks samples per optimizer step
    (Batches(8, 4, 4, 30, 1, 4, dynamic=True), "--train.batch_size 30 is not a multiple of the 4 actor GPUs: with "
                                               "--train.dynamic_batch_enable"),
    (Batches(8, 4, 4, 32, 1, 6, ring=4), "the 6 actor GPUs (--actor.num_nodes x --actor.num_gpus_per_node) are not a "
                                         "multiple of --ds.ring_attn_size 4"),
])
def test_every_batch_rule_is_refused_with_values_that_work(b, start):
    message = batch_message(b)
    assert message is not None and message.startswith(start), message
    changes = working_values(b)
    assert changes and f"Values that work on {b.actor_gpus} actor GPU(s): {layout.render_change(changes[0])}" in message
    for change in changes:
        assert batch_problem(dataclasses.replace(b, **change)) is None, change


def test_good_arithmetic_passes_and_micro_batch_sizes_are_preferred_over_the_algorithm_s_sizes():
    for b in (Batches(64, 8, 16, 128, 16, 8), Batches(4, 4, 4, 16, 4, 1), Batches(4, 4, 4, 16, 4, 2),
              Batches(64, 8, 16, 128, 1, 128, dynamic=True), Batches(8, 4, 4, 32, 2, 8, ring=2, tp=2)):
        assert batch_problem(b) is None, b
    # 16 GPUs: a smaller micro-batch first (memory only), then a larger optimizer step (the algorithm)
    assert working_values(Batches(64, 8, 16, 128, 16, 16))[:2] == [{"train_micro": 8}, {"train_batch": 256}]
    # 12 GPUs divide neither 128 nor 512: both global sizes must change together
    assert working_values(Batches(64, 8, 16, 128, 16, 12)) == [{"rollout_batch": 72, "train_batch": 192}]


def test_rank_samples_splits_a_rollout_as_upstream_does():
    # RayActorGroup.async_run_method_batch: chunk = ceil(experiences / ranks) consecutive experiences per rank
    assert rank_samples(512, 16, 16) == [32] * 16
    assert rank_samples(12, 5, 2) == [10, 2]  # experiences 5, 5, 2
    assert rank_samples(24, 4, 4) == [8, 8, 8, 0]  # 6 experiences: chunks of 2, the last rank none


def test_check_reports_the_batches_and_warns_about_idle_policy_engines():
    report = PreflightReport()
    check_launch(parse_args(["--config", GDPO, *_gpus(8)]), report)
    assert "batches: 512 samples per rollout = 4 optimizer step(s) of 128 = 1 micro-batch(es) of 16 on each of 8 " \
           "actor rank(s)" in report.lines
    assert report.warnings == []
    report = PreflightReport()
    check_launch(parse_args(["--config", GDPO, *_gpus(8), "--rollout.batch_size", "4", "--train.batch_size", "32",
                             "--train.micro_batch_size", "4", "--rollout.micro_batch_size", "4"]), report)
    assert report.warnings == ["--rollout.batch_size 4 prompts for --vllm.num_engines 8: 4 policy engine(s) idle "
                               "every rollout (upstream sends each prompt's samples to one engine)"]


def test_fit_micro_batches_keeps_the_global_sizes_and_the_user_s_micro_batches():
    b = Batches(64, 8, 16, 128, 16, 32)
    assert fit_micro_batches(b) == dataclasses.replace(b, train_micro=4)
    on_64 = dataclasses.replace(b, actor_gpus=64)
    assert fit_micro_batches(on_64) == dataclasses.replace(on_64, train_micro=2, rollout_micro=8)
    assert fit_micro_batches(b, keep={"train_micro"}) is None  # the user's 16: the preflight names values
    assert fit_micro_batches(dataclasses.replace(b, actor_gpus=12)) is None  # no micro-batch size helps
    assert fit_micro_batches(dataclasses.replace(b, actor_gpus=8)) == dataclasses.replace(b, actor_gpus=8)


def test_the_script_helper_fits_a_config_s_micro_batches(capsys):
    from openrlhf_classmate import script_helpers

    assert script_helpers.main(["fit-micro-batches", GDPO, "16"]) == 0
    out, err = capsys.readouterr()
    assert out.split() == ["--train.micro_batch_size", "8"]
    assert err.startswith("[train_scripts] 16 actor GPUs: --train.micro_batch_size 8 (the config's 16 per GPU)")
    # a flag given to the script wins over the config (and a micro-batch size given is kept); nothing to change
    assert script_helpers.main(["fit-micro-batches", GDPO, "16", "--rollout.batch_size", "128",
                                "--train.batch_size=256"]) == 0
    assert capsys.readouterr().out == ""
    assert script_helpers.main(["fit-micro-batches", GDPO, "16", "--train.micro_batch_size", "16"]) == 0
    assert capsys.readouterr().out == ""
    assert script_helpers.main(["fit-micro-batches", GDPO, "8"]) == 0
    assert capsys.readouterr().out == ""


def test_upstream_defaults_of_the_batch_flags():
    defaults = {a.dest: a.default for a in build_parser()._actions}
    for name, flag in layout.FLAGS.items():
        assert defaults[flag[2:]] == layout.UPSTREAM_DEFAULTS[name], flag


# ── GPUs: what a layout asks for, what is available ─────────────────────────────────────────────────────────────


def test_placement_separate_on_8_gpus_asking_for_16_is_one_line_before_ray(monkeypatch):
    # one classmate engine per GPU with placement separate = 16 GPUs on an 8-GPU node: the preflight passed and Ray
    # then waited for its placement group forever
    monkeypatch.setenv(layout.GPUS_ENV, "8")
    error = _refusal(["--check", "--config", GDPO, "--engine.backend", "vllm", *_gpus(8), "--classmate.placement",
                      "separate"])
    assert error == (
        "error: the layout asks Ray for 16 GPU(s) (8 for the actor, policy engines + 8 for the classmate engines "
        "(separate: a whole GPU for each)), but 8 are available (OPENRLHF_CLASSMATE_GPUS=8): Ray would wait for the "
        "missing 8 forever; use --classmate.placement share (the classmate engines beside the policy engines, no GPU "
        "of their own; the two engine groups' memory fractions summing below 1); train_scripts: CLASSMATE_GPUS=N "
        "keeps N GPUs of each node for them")
    # 12 GPUs: 4 classmate engines of their own fit
    monkeypatch.setenv(layout.GPUS_ENV, "12")
    error = _refusal(["--check", "--config", GDPO, "--engine.backend", "vllm", *_gpus(8), "--classmate.placement",
                      "separate"])
    assert "but 12 are available" in error and "or at most --classmate.num_engines 4;" in error
    report = PreflightReport()
    check_launch(_config_args(*_gpus(8), "--classmate.placement", "separate", "--classmate.num_engines", "4"), report)
    assert report.lines[0] == ("layout: 12 GPU(s) (8 for the actor, policy engines + 4 for the classmate engines "
                               "(separate: a whole GPU for each)) asked of Ray, of 12 available "
                               "(OPENRLHF_CLASSMATE_GPUS=12)")


MINIMAL = ["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl", "--engine.backend", "vllm",
           "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1",
           "--vllm.gpu_memory_utilization", "0.6", "--rollout.n_samples_per_prompt", "2", "--rollout.batch_size", "2",
           "--train.batch_size", "4", "--classmate.model_name_or_path", "c"]


def test_layout_counts_each_group_as_upstream_places_it():
    def total(*extra: str) -> int:
        return layout_of(parse_args([*MINIMAL, "--algo.kl.init_coef", "0", *extra])).total

    # actor 1 + reference 1 (init_coef > 0) + policy engine 1 + classmate share in the policy engines' group
    assert total("--algo.kl.init_coef", "0.01", "--classmate.placement", "share") == 3
    assert total("--algo.kl.init_coef", "0.01", "--train.colocate_actor_ref", "--classmate.placement", "share") == 2
    assert total("--classmate.placement", "separate", "--classmate.num_engines", "2") == 4
    assert total("--train.colocate_all", "--classmate.placement", "colocate") == 1
    # async: --train.colocate_all colocates the DeepSpeed models only, the policy engines get GPUs of their own
    assert total("--train.colocate_all", "--train.async_enable", "--classmate.placement", "share") == 2
    # HF engines ask Ray for no GPU
    assert total("--classmate.placement", "separate", "--engine.backend", "hf") == 1


@pytest.mark.parametrize("extra, message", [
    (["--train.colocate_all", "--vllm.num_engines", "2"],
     "--train.colocate_all puts a policy engine GPU on each actor GPU: --vllm.num_engines 2 x "
     "--vllm.tensor_parallel_size 1 = 2 must equal --actor.num_nodes 1 x --actor.num_gpus_per_node 1 = 1 (OpenRLHF "
     "asserts it after Ray has started): set --vllm.num_engines 1"),
    (["--train.colocate_actor_ref", "--algo.kl.init_coef", "0.01", "--ref.num_gpus_per_node", "2"],
     "--train.colocate_actor_ref puts the reference model on the actor's GPUs: --ref.num_nodes 1 / "
     "--ref.num_gpus_per_node 2 must equal --actor.num_nodes 1 / --actor.num_gpus_per_node 1"),
    (["--train.colocate_all", "--algo.kl.init_coef", "0.01", "--classmate.placement", "colocate",
      "--classmate.model_name_or_path", "a", "b", "c", "d"],
     "7 groups share each GPU of the actor's placement group (actor, reference, policy engines, classmate engines), "
     "and Ray gives each 0.2 of a GPU there, so at most 5 fit"),
])
def test_co_locations_upstream_asserts_on_after_ray_started_are_refused_before(extra, message):
    args = parse_args([*MINIMAL, *extra])
    with pytest.raises(PreflightError) as info:
        check_launch(args, PreflightReport())
    assert str(info.value).startswith(message), info.value


def test_cpu_runs_are_not_counted(monkeypatch):
    # the test worlds run on Ray's logical GPUs: nothing known to count against
    report = PreflightReport()
    check_launch(parse_args(["--config", GDPO, *_gpus(8), "--classmate.placement", "separate"]), report)
    assert report.lines[0] == ("layout: 8 GPU(s) (8 for the actor) asked of Ray; not counted (no CUDA device here, "
                               "no OPENRLHF_CLASSMATE_GPUS, no RAY_ADDRESS: Ray's logical GPUs)")


def test_available_gpus_prefers_the_smaller_of_the_cluster_and_the_scripts(monkeypatch, capsys):
    args = SimpleNamespace(actor=SimpleNamespace(num_nodes=2))
    monkeypatch.setattr(layout, "_ray_cluster_gpus", lambda address: 12)
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    assert layout.available_gpus(args) == layout.GpuCount(12, "the Ray cluster at http://head:8265")
    monkeypatch.setenv(layout.GPUS_ENV, "8")  # train_scripts: 8 of the cluster's GPUs train (servers on others)
    assert layout.available_gpus(args) == layout.GpuCount(8, "OPENRLHF_CLASSMATE_GPUS=8")
    monkeypatch.setenv(layout.GPUS_ENV, "eight")
    with pytest.raises(PreflightError, match=r"^OPENRLHF_CLASSMATE_GPUS='eight': must be a whole number >= 1"):
        layout.available_gpus(args)


def test_the_cluster_is_asked_through_its_dashboard_and_an_unreachable_one_is_said(monkeypatch, capsys):
    import ray.util.state

    def nodes(address, timeout, raise_on_missing_output):
        assert address == "http://head:8265" and timeout <= 10
        return [SimpleNamespace(state="ALIVE", resources_total={"GPU": 8.0, "CPU": 64.0}),
                SimpleNamespace(state="ALIVE", resources_total={"GPU": 8.0}),
                SimpleNamespace(state="DEAD", resources_total={"GPU": 8.0}),
                SimpleNamespace(state="ALIVE", resources_total={"CPU": 8.0})]

    monkeypatch.setattr(ray.util.state, "list_nodes", nodes)
    assert layout._ray_cluster_gpus("http://head:8265") == 16

    def unreachable(**kwargs):
        raise ConnectionError("Failed to connect to API server")

    monkeypatch.setattr(ray.util.state, "list_nodes", unreachable)
    assert layout._ray_cluster_gpus("http://head:8265") is None
    assert "could not count the GPUs of the Ray cluster at http://head:8265 (ConnectionError: Failed to connect" \
           in capsys.readouterr().err


# ── --classmate.placement auto ───────────────────────────────────────────────────────────────────────────────────


def _auto(monkeypatch, gpus: int | None, *extra: str, server_memory: str | None = None) -> tuple[str, str]:
    if gpus is not None:
        monkeypatch.setenv(layout.GPUS_ENV, str(gpus))
    else:
        monkeypatch.delenv(layout.GPUS_ENV, raising=False)
    if server_memory is not None:
        monkeypatch.setenv(layout.SERVER_MEMORY_ENV, server_memory)
    else:
        monkeypatch.delenv(layout.SERVER_MEMORY_ENV, raising=False)
    layout._available.cache_clear()
    return layout.choose_placement(_config_args(*extra))


def test_auto_resolves_per_gpu_count(monkeypatch, capsys):
    # one GPU, everything colocated: share (1.05-1.07x a GRPO step, colocate 1.31x), the memory plan fitting
    assert _auto(monkeypatch, 1, *_gpus(1))[0] == "share"
    # ... else colocate, with the reason in the one line
    placement, why = _auto(monkeypatch, 1, *_gpus(1), "--classmate.gpu_memory_utilization", "0.45")
    assert placement == "colocate" and "not share: --vllm.gpu_memory_utilization 0.6 + " \
        "--classmate.gpu_memory_utilization 0.45 = 1.05 of a GPU do not fit one GPU" in why
    # a judge server the train scripts started on the GPU counts too
    placement, why = _auto(monkeypatch, 8, *_gpus(8), server_memory="0.2")
    assert placement == "colocate" and "+ 0.2 held by servers on the training GPUs" in why
    # every GPU training (the train scripts): share; GPUs to spare for each classmate engine: separate
    assert _auto(monkeypatch, 8, *_gpus(8))[0] == "share"
    assert _auto(monkeypatch, 16, *_gpus(8, 2))[0] == "share"
    assert _auto(monkeypatch, 2, *_gpus(1)) == ("separate", "2 GPUs (OPENRLHF_CLASSMATE_GPUS=2), the rest of the "
                                                "layout takes 1: a whole GPU for each of the 1 classmate engine "
                                                "GPU(s)")
    assert _auto(monkeypatch, 12, *_gpus(8), "--classmate.num_engines", "4")[0] == "separate"
    # GPUs unknown (a CPU machine checking a GPU command line): share needs none of its own
    assert _auto(monkeypatch, None, *_gpus(8))[0] == "share"
    # HF engines hold no GPU: separate costs nothing (the CPU test worlds)
    assert layout.choose_placement(parse_args(["--config", GDPO, "--engine.backend", "hf"]))[0] == "separate"
    # more classmate engines than policy engine GPUs: colocate where there is an actor/ref group to join, else
    # separate (the layout check then counts its GPUs)
    args = parse_args([*MINIMAL, "--classmate.num_engines", "2", "--train.colocate_actor_ref",
                       "--actor.num_gpus_per_node", "2", "--ref.num_gpus_per_node", "2"])
    assert args.classmate.placement == "colocate"
    args = parse_args([*MINIMAL, "--classmate.num_engines", "2"])
    assert args.classmate.placement == "separate"
    assert "not share: --classmate.num_engines 2 x --classmate.tensor_parallel_size 1 exceed the policy engines' 1 " \
        "GPUs; not colocate: no actor/ref placement group to join" in capsys.readouterr().err


def test_auto_is_logged_once_and_stays_auto_without_a_classmate(monkeypatch, capsys):
    monkeypatch.setenv(layout.GPUS_ENV, "8")
    args = _config_args(*_gpus(8))
    lines = [line for line in capsys.readouterr().err.splitlines() if "--classmate.placement" in line]
    assert args.classmate.placement == "share" and lines == [
        "[openrlhf_classmate] --classmate.placement share (auto: 8 GPUs (OPENRLHF_CLASSMATE_GPUS=8) leave 0 beyond "
        "the 8 the rest of the layout takes, 8 needed for separate; the classmate engines beside the policy engines, "
        "awake through the step)"]
    assert parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl"]).classmate.placement \
        == "auto"
    assert parse_args(["--config", GDPO, "--classmate.placement", "colocate"]).classmate.placement == "colocate"
    assert "--classmate.placement" not in capsys.readouterr().err  # given: not logged


# ── one rule: the help, the configs and the README ──────────────────────────────────────────────────────────────


def _words(text: str) -> str:
    return " ".join(text.split())


def test_help_configs_and_readme_recommend_the_same_placement():
    field = {f.name: f for f in dataclasses.fields(ClassmateConfig)}["placement"]
    assert field.default == "auto"
    help_text = {a.dest: a.help for a in build_parser()._actions}["classmate.placement"]
    assert f"auto: {AUTO_RULE}" in help_text and "Default: auto." in help_text
    readme = _words(open(os.path.join(REPO, "README.md"), encoding="utf-8").read())
    assert f"`auto` picks {AUTO_RULE}" in readme
    # the README's table: one placement per GPU count, as auto resolves it
    assert re.search(r"\| 1 \| everything on the GPU \(`--train.colocate_all`\) \| `share`;", readme)
    assert "--classmate.placement share ..." not in readme  # the first example leaves it to auto
    with_classmate = []
    for path in sorted(glob.glob(os.path.join(REPO, "configs", "*.yaml"))):
        classmate = yaml.safe_load(open(path, encoding="utf-8")).get("classmate") or {}
        if classmate.get("model_name_or_path"):
            with_classmate.append(os.path.basename(path))
            assert classmate.get("placement", "auto") == "auto", path
        assert "micro_batch_size" not in open(path).read() or "per GPU" in open(path).read(), path
    assert len(with_classmate) >= 8
