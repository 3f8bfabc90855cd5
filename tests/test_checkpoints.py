"""Checkpoint folders: which tag a resume loads when the newest one is torn, the ``*_hf`` rotation, and the strategy
subclass that applies both inside upstream's actors (the full resume runs in ``test_faults_cpu.py``)."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from openrlhf_classmate.integration.checkpoints import (
    CheckpointError,
    choose_resume_tag,
    inspect_tag,
    rotate_hf_folders,
)

MODEL = "mp_rank_00_model_states.pt"
OPTIM = "bf16_zero_pp_rank_{}_mp_rank_00_optim_states.pt"


def _tag(actor, step: int, ranks: int = 1, prefix: str = "") -> str:
    tag = actor / f"{prefix}global_step{step}"
    tag.mkdir(parents=True)
    torch.save({"module": {"w": torch.arange(8.0)}, "global_steps": step}, tag / MODEL)
    for rank in range(ranks):
        torch.save({"optimizer_state_dict": {"rank": rank}}, tag / OPTIM.format(rank))
    (actor / "latest").write_text(f"{prefix}global_step{step}")
    return str(tag)


def _cut(path, keep: int | None = None) -> None:
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2 if keep is None else keep])


def test_inspect_tag_names_the_broken_file(tmp_path):
    actor = tmp_path / "_actor"
    tag = _tag(actor, 1, ranks=3)
    assert inspect_tag(tag, zero_stage=2) is None
    _cut(os.path.join(tag, OPTIM.format(1)))
    assert inspect_tag(tag) == f"{tag}/{OPTIM.format(1)} is cut short or corrupt " \
                                f"({os.path.getsize(os.path.join(tag, OPTIM.format(1)))} bytes, no complete zip directory)"
    _cut(os.path.join(tag, OPTIM.format(1)), keep=0)
    assert inspect_tag(tag) == f"{tag}/{OPTIM.format(1)} is empty (0 bytes)"
    os.remove(os.path.join(tag, OPTIM.format(1)))
    assert "lacks the optim states of data-parallel rank(s) [1]" in inspect_tag(tag)
    for name in os.listdir(tag):
        if "optim" in name:
            os.remove(os.path.join(tag, name))
    assert inspect_tag(tag) is None  # ZeRO stage 0 keeps the optimizer inside the model states
    assert "has no *optim_states.pt file (ZeRO stage 2" in inspect_tag(tag, zero_stage=2)
    os.remove(os.path.join(tag, MODEL))
    assert "has no *model_states.pt file" in inspect_tag(tag)
    assert "does not exist" in inspect_tag(str(actor / "global_step9"))


def test_resume_takes_latest_or_falls_back_to_the_newest_complete_older_tag(tmp_path):
    actor = tmp_path / "_actor"
    assert choose_resume_tag(str(actor)) is None  # nothing saved yet: a fresh start
    for step in (1, 2, 3):
        _tag(actor, step)
    choice = choose_resume_tag(str(actor), zero_stage=2)
    assert choice.tag == "global_step3" and choice.skipped == [] and choice.notes(str(actor)) == []

    _cut(actor / "global_step3" / MODEL)
    _cut(actor / "global_step2" / OPTIM.format(0))
    choice = choose_resume_tag(str(actor), zero_stage=2)
    assert choice.tag == "global_step1" and [t for t, _ in choice.skipped] == ["global_step3", "global_step2"]
    notes = choice.notes(str(actor))
    assert notes[0].startswith(f"checkpoint {actor}/global_step3 is incomplete: {actor}/global_step3/{MODEL} is cut")
    assert notes[0].endswith("resuming from global_step1 instead (the steps after it are trained again)")

    (actor / "latest").write_text("")  # a torn 'latest' file: the newest complete tag
    assert choose_resume_tag(str(actor)).tag == "global_step1"
    (actor / "latest").write_text("global_step7")  # points at a tag that is gone
    choice = choose_resume_tag(str(actor))
    assert choice.tag == "global_step1" and "global_step7 does not exist" in choice.skipped[0][1]

    _cut(actor / "global_step1" / MODEL, keep=10)
    with pytest.raises(CheckpointError) as info:
        choose_resume_tag(str(actor))
    message = str(info.value)
    for tag in ("global_step3", "global_step2", "global_step1"):
        assert f"{actor}/{tag}/" in message
    assert "start without --ckpt.load_enable" in message


def test_a_newer_tag_than_latest_is_not_taken(tmp_path):
    """DeepSpeed writes ``latest`` last: a newer folder without it may be a save that never finished."""
    actor = tmp_path / "_actor"
    _tag(actor, 1)
    _tag(actor, 2)
    (actor / "latest").write_text("global_step1")
    assert choose_resume_tag(str(actor)).tag == "global_step1"


def test_hf_folders_rotate_like_the_deepspeed_tags(tmp_path):
    for name in ("global_step1_hf", "global_step2_hf", "global_step10_hf", "best_global_step1_hf",
                 "best_global_step10_hf", "global_step3", "final"):
        (tmp_path / name).mkdir()
    (tmp_path / "global_step4_hf").write_text("a file, not a folder: left alone")
    removed = rotate_hf_folders(str(tmp_path), 2)
    assert sorted(removed) == ["best_global_step1_hf", "global_step1_hf"]
    assert sorted(os.listdir(tmp_path)) == ["best_global_step10_hf", "final", "global_step10_hf", "global_step2_hf",
                                            "global_step3", "global_step4_hf"]
    assert rotate_hf_folders(str(tmp_path / "missing"), 2) == []


def test_strategy_subclass_is_what_upstream_builds_and_what_travels_to_the_actors():
    from openrlhf_classmate.integration.args import parse_args
    from openrlhf_classmate.integration.strategy import ResilientDeepspeedStrategy, get_strategy

    args = parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl",
                       "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1"])
    strategy = get_strategy(args)
    assert type(strategy) is ResilientDeepspeedStrategy and strategy.stage == args.ds.zero_stage
    assert type(pickle.loads(pickle.dumps(strategy))) is ResilientDeepspeedStrategy  # Ray pickles it


def test_launcher_rebinds_get_strategy(monkeypatch):
    import openrlhf.cli.train_ppo_ray as cli
    import openrlhf.trainer.ppo_trainer as ppo_trainer

    from openrlhf_classmate.integration import patches
    from openrlhf_classmate.integration.strategy import get_strategy

    for module, name in ((cli, "create_vllm_engines"), (cli, "PolicyModelActor"), (cli, "ReferenceModelActor"),
                         (cli, "placement_group"), (cli, "get_strategy"), (ppo_trainer, "PPOTrainer")):
        monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
    reference = object()
    patches.install_launcher(object(), object(), reference, object())
    assert cli.ReferenceModelActor is reference
    assert cli.get_strategy is get_strategy
