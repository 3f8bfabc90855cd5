"""Checkpoint folders: which tag a resume loads when the newest one is torn, the rotation of the DeepSpeed tags (only
after the new tag is complete) and of the ``*_hf`` folders, and the strategy subclass that applies them inside
upstream's actors: on a real DeepSpeed engine in a subprocess (:mod:`openrlhf_classmate.testing.ckpt_engine`),
including a save killed half-way (the full launcher resume runs in ``test_faults_cpu.py``)."""

from __future__ import annotations

import inspect
import json
import os
import pickle
import sys

import pytest
import torch

from openrlhf_classmate.integration.training.checkpoints import (
    MARKER,
    CheckpointError,
    begin_marked_save,
    choose_resume_tag,
    inspect_tag,
    mark_complete,
    rotate_hf_folders,
    rotate_tags,
)

MODEL = "mp_rank_00_model_states.pt"
OPTIM = "bf16_zero_pp_rank_{}_mp_rank_00_optim_states.pt"


def _tag(actor, step: int, ranks: int = 1, prefix: str = "", marked: bool = False) -> str:
    """A tag as DeepSpeed writes it; ``marked``: saved as ``ResilientDeepspeedStrategy.save_ckpt`` saves it."""
    tag = actor / f"{prefix}global_step{step}"
    actor.mkdir(parents=True, exist_ok=True)
    if marked:
        begin_marked_save(str(actor), tag.name)
    tag.mkdir()
    torch.save({"module": {"w": torch.arange(8.0)}, "global_steps": step}, tag / MODEL)
    for rank in range(ranks):
        torch.save({"optimizer_state_dict": {"rank": rank}}, tag / OPTIM.format(rank))
    (actor / "latest").write_text(f"{prefix}global_step{step}")
    if marked:
        mark_complete(str(tag), dp_world_size=ranks, zero_stage=2)
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


def test_a_marked_tag_missing_its_highest_ranks_file_is_torn(tmp_path):
    """A torn tag: rank 1's optimizer file gone from a 2-rank tag leaves no gap below the highest rank seen (0), so the
    file checks alone took the tag, and rank 1 died in ``torch.load``; the completeness marker lists every file."""
    actor = tmp_path / "_actor"
    _tag(actor, 1, ranks=2, marked=True)
    tag = _tag(actor, 2, ranks=2, marked=True)
    assert inspect_tag(tag, zero_stage=2) is None
    os.remove(os.path.join(tag, OPTIM.format(1)))
    assert inspect_tag(tag, zero_stage=2) == (
        f"{tag}/{OPTIM.format(1)} is missing (the optim states of data-parallel rank 1 of 2): the save wrote it "
        f"({MARKER} lists it), so it was removed or not copied since")

    choice = choose_resume_tag(str(actor), zero_stage=2)
    assert choice.tag == "global_step1" and [t for t, _ in choice.skipped] == ["global_step2"]
    assert f"{tag}/{OPTIM.format(1)} is missing" in choice.notes(str(actor))[0]

    _tag(actor, 3, ranks=2, marked=True)  # the next save: the torn tag goes first, the complete older one stays
    _aged(actor, "global_step1", "global_step2", "global_step3")
    removed = rotate_tags(str(actor), "global_step3", 2, 1000, _metric, zero_stage=2)
    assert [(os.path.basename(p), why.split(":")[0]) for p, why in removed] == [("global_step2", "incomplete")]
    assert sorted(os.listdir(actor)) == ["checkpoint_markers.json", "global_step1", "global_step3", "latest"]

    # a file replaced by another complete torch file of another size: only the marker sees it
    tag3 = str(actor / "global_step3")
    saved = os.path.getsize(os.path.join(tag3, OPTIM.format(0)))
    torch.save({"optimizer_state_dict": {"rank": 0, "more": torch.zeros(64)}}, os.path.join(tag3, OPTIM.format(0)))
    size = os.path.getsize(os.path.join(tag3, OPTIM.format(0)))
    assert inspect_tag(tag3) == f"{tag3}/{OPTIM.format(0)} has {size} bytes, not the {saved} it had when " \
                                f"saved ({MARKER}): cut short or changed since"
    (actor / "global_step1" / MARKER).write_text("{")
    assert inspect_tag(str(actor / "global_step1")) == f"{actor}/global_step1/{MARKER} cannot be read"


def test_an_unmarked_tag_from_the_marked_steps_on_is_a_save_that_did_not_finish(tmp_path):
    actor = tmp_path / "_actor"
    _tag(actor, 1, ranks=2)  # saved before markers: a tag without one is judged by its files, as before
    begin_marked_save(str(actor), "global_step2")  # the save of step 2 began, and died before its marker
    _tag(actor, 2, ranks=2)
    begin_marked_save(str(actor), "global_step3")  # the first marked step stays the record
    assert json.loads((actor / "checkpoint_markers.json").read_text()) == {"from_step": 2}
    assert inspect_tag(str(actor / "global_step1"), zero_stage=2) is None
    assert inspect_tag(str(actor / "global_step2"), zero_stage=2) == (
        f"{actor}/global_step2 has no {MARKER}: the save did not finish (saves into {actor} from step 2 on write it "
        "last, after every rank's files)")
    choice = choose_resume_tag(str(actor), zero_stage=2)
    assert choice.tag == "global_step1" and [t for t, _ in choice.skipped] == ["global_step2"]

    # saving a tag again: its old marker goes before the new files come, so a save dying half-way is not vouched for
    mark_complete(str(actor / "global_step2"), dp_world_size=2, zero_stage=2)
    assert choose_resume_tag(str(actor), zero_stage=2).tag == "global_step2"
    begin_marked_save(str(actor), "global_step2")
    assert "has no checkpoint_complete.json" in inspect_tag(str(actor / "global_step2"))


def test_a_folder_without_markers_is_checked_as_before(tmp_path):
    """Tags of upstream's save_ckpt (or of an earlier version of this project): no record, no marker, the file
    checks only. A missing highest rank cannot be seen there: the reason the markers exist."""
    actor = tmp_path / "_actor"
    _tag(actor, 1, ranks=2)
    tag = _tag(actor, 2, ranks=3)
    os.remove(os.path.join(tag, OPTIM.format(1)))
    assert "lacks the optim states of data-parallel rank(s) [1]" in inspect_tag(tag)
    os.remove(os.path.join(tag, OPTIM.format(2)))
    assert inspect_tag(tag, zero_stage=2) is None
    assert choose_resume_tag(str(actor), zero_stage=2).tag == "global_step2"


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
    from openrlhf_classmate.integration.launch.args import parse_args
    from openrlhf_classmate.integration.training.strategy import ResilientDeepspeedStrategy, get_strategy

    args = parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl",
                       "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1"])
    strategy = get_strategy(args)
    assert type(strategy) is ResilientDeepspeedStrategy and strategy.stage == args.ds.zero_stage
    assert type(pickle.loads(pickle.dumps(strategy))) is ResilientDeepspeedStrategy  # Ray pickles it


def test_launcher_rebinds_get_strategy(monkeypatch):
    import openrlhf.cli.train_ppo_ray as cli
    import openrlhf.trainer.ppo_trainer as ppo_trainer
    import openrlhf.trainer.ppo_trainer_async as ppo_trainer_async

    from openrlhf_classmate.integration import patches
    from openrlhf_classmate.integration.training.strategy import get_strategy

    for module, name in ((cli, "create_vllm_engines"), (cli, "PolicyModelActor"), (cli, "placement_group"),
                         (cli, "get_strategy"), (ppo_trainer, "PPOTrainer"), (ppo_trainer_async, "PPOTrainerAsync")):
        monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
    patches.install_launcher(object(), object(), object())
    assert cli.get_strategy is get_strategy


# ── DeepSpeed tag rotation, after the new tag is complete ──


def _metric(path: str) -> float | None:
    try:
        return json.load(open(os.path.join(path, "metric.json")))["metric_value"]
    except OSError:
        return None


def _aged(actor, *names: str) -> None:
    """mtimes in the order given (the rotation's tie-break), one second apart."""
    for i, name in enumerate(names):
        os.utime(actor / name, (1_000_000 + i, 1_000_000 + i))


def test_rotation_keeps_max_num_complete_tags_and_removes_a_torn_one_first(tmp_path):
    actor = tmp_path / "_actor"
    for step in (1, 2, 3):
        _tag(actor, step)
    _cut(actor / "global_step2" / MODEL)  # a save killed half-way, newer than global_step1
    _tag(actor, 4)
    _aged(actor, "global_step1", "global_step2", "global_step3", "global_step4")
    removed = rotate_tags(str(actor), "global_step4", 2, 1000, _metric, zero_stage=2)
    assert [(os.path.basename(p), why.split(":")[0]) for p, why in removed] == [
        ("global_step2", "incomplete"), ("global_step1", "no metric (oldest)")]
    assert sorted(os.listdir(actor)) == ["global_step3", "global_step4", "latest"]
    assert rotate_tags(str(actor), "global_step4", 2, 1000, _metric) == []  # nothing more to do
    assert [os.path.basename(p) for p, _ in rotate_tags(str(actor), "global_step4", 1, 1000, _metric)] == [
        "global_step3"]
    assert sorted(os.listdir(actor)) == ["global_step4", "latest"]  # the new tag is never a candidate


def test_rotation_follows_upstreams_metric_best_and_memory_rules(tmp_path):
    actor = tmp_path / "_actor"
    for step, metric in ((1, 0.9), (2, 0.1), (3, None), (4, 0.5)):
        _tag(actor, step)
        if metric is not None:
            (actor / f"global_step{step}" / "metric.json").write_text(json.dumps({"metric_value": metric}))
    _tag(actor, 2, prefix="best_")
    _aged(actor, "global_step1", "global_step2", "global_step3", "best_global_step2", "global_step4")
    # no metric first, then the worst metric; a best tag is neither counted nor removed by max_num
    assert [os.path.basename(p) for p, _ in rotate_tags(str(actor), "global_step4", 2, 1000, _metric)] == [
        "global_step3", "global_step2"]
    # max_mem (GiB) counts every folder but the new one, best included, and removes only regular ones
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(actor / "global_step1") for f in fs)
    assert [os.path.basename(p) for p, _ in rotate_tags(str(actor), "global_step4", 9, 1.5 * size / 1024**3,
                                                         _metric)] == ["global_step1"]
    assert sorted(os.listdir(actor)) == ["best_global_step2", "global_step4", "latest"]
    _tag(actor, 5, prefix="best_")  # a new best replaces the old best, once it is complete; max_num ignores it
    assert [os.path.basename(p) for p, _ in rotate_tags(str(actor), "best_global_step5", 1, 1000, _metric)] == [
        "best_global_step2"]
    assert sorted(os.listdir(actor)) == ["best_global_step5", "global_step4", "latest"]


def test_save_ckpt_override_keeps_upstreams_signature():
    """The override replaces upstream's ``save_ckpt`` whole (its rotation ran before the save); a change of
    upstream's signature, defaults or the metric helpers it uses must fail here (the file's hash is pinned too, in
    ``patches.UPSTREAM_SHA256``)."""
    from openrlhf.utils.deepspeed import DeepspeedStrategy

    from openrlhf_classmate.integration.training.strategy import ResilientDeepspeedStrategy

    ours, upstream = (inspect.signature(c.save_ckpt) for c in (ResilientDeepspeedStrategy, DeepspeedStrategy))
    assert list(ours.parameters.items()) == list(upstream.parameters.items())
    assert list(upstream.parameters) == ["self", "model", "save_dir", "tag", "max_num", "max_mem", "client_state",
                                         "save_latest", "metric_value", "metric_key"]
    for name in ("_write_ckpt_metric", "_read_ckpt_metric", "is_rank_0", "print"):
        assert callable(getattr(DeepspeedStrategy, name)), name
    from openrlhf_classmate.integration.patches import UPSTREAM_SHA256

    assert "utils/deepspeed/deepspeed.py" in UPSTREAM_SHA256


def _engine(*argv: str) -> list[dict]:
    """Run :mod:`openrlhf_classmate.testing.ckpt_engine`; its JSON lines (a killed save ends the list). A hang (a save
    that never returns) is stopped by the watchdog, not by a wall-clock limit that a loaded machine would overrun."""
    import tempfile

    from openrlhf_classmate.testing.ckpt_engine import CRASH_EXIT
    from openrlhf_classmate.testing.watchdog import run_watched

    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "engine.log")
        code = run_watched([sys.executable, "-m", "openrlhf_classmate.testing.ckpt_engine", *argv], log)
        text = open(log).read()
    assert code == (CRASH_EXIT if "--crash-in-save" in argv else 0), text[-3000:]
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_a_save_killed_at_max_num_1_leaves_the_previous_checkpoint_to_resume_from(tmp_path):
    actor = str(tmp_path / "_actor")
    saved, killed = _engine("save", actor, "--saves", "1,2", "--max-num", "1", "--crash-in-save", "2")
    assert saved["saved"] == "global_step1" and killed["killed_after"] == "mp_rank_00_model_states.pt"
    assert sorted(os.listdir(actor)) == ["checkpoint_markers.json", "global_step1", "global_step2", "latest",
                                         "zero_to_fp32.py"]
    assert open(os.path.join(actor, "latest")).read() == "global_step1"
    assert "no *optim_states.pt" in inspect_tag(os.path.join(actor, "global_step2"), zero_stage=2)
    assert sorted(os.listdir(os.path.join(actor, "global_step1"))) == [  # the marker of the save that finished
        "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", MARKER, "metric.json", "mp_rank_00_model_states.pt"]

    (resumed,) = _engine("resume", actor)
    assert resumed["loaded"] == "global_step1" and resumed["global_steps"] == 1 and resumed["data_step"] == 1
    assert resumed["weights"] == saved["weights"]  # the step-1 weights, not the fresh engine's (seed 1)


@pytest.mark.slow
def test_upstream_save_ckpt_still_deletes_the_old_tag_before_the_save(tmp_path):
    """Why the override exists: the same kill under upstream's ``save_ckpt`` leaves no complete tag. When this fails
    upstream has changed its order, and the override may go."""
    actor = str(tmp_path / "_actor")
    _engine("save", actor, "--saves", "1,2", "--max-num", "1", "--crash-in-save", "2", "--upstream")
    assert sorted(os.listdir(actor)) == ["global_step2", "latest", "zero_to_fp32.py"]
    with pytest.raises(CheckpointError, match="global_step1 does not exist"):
        choose_resume_tag(actor, zero_stage=2)


@pytest.mark.slow
def test_rotation_on_a_real_engine_keeps_what_upstream_keeps(tmp_path):
    scenarios = []
    for name, tags, extra in [
        ("max_num", ["global_step1", "global_step2", "global_step3"], {"max_num": 2}),
        ("metrics", ["global_step1", "global_step2", "global_step3"], {"max_num": 2, "metrics": [0.9, 0.1, 0.5]}),
        ("max_mem", ["global_step1", "global_step2", "global_step3"], {"max_num": 9, "max_mem": 1e-9}),
        ("best", ["global_step1", "best_global_step2", "global_step3", "best_global_step4"], {"max_num": 1}),
    ]:
        for upstream in (False, True):
            scenarios.append({"dir": str(tmp_path / f"{name}_{upstream}"), "tags": tags, "upstream": upstream,
                              **extra})
    results = _engine("rotate", json.dumps(scenarios))
    kept = {(sc["dir"].rsplit("/", 1)[1]): r["listing"] for sc, r in zip(scenarios, results)}
    assert kept["max_num_False"] == ["global_step2", "global_step3"]  # max_num 2, three saves: the newest two
    assert kept["metrics_False"] == ["global_step1", "global_step3"]  # the worst metric (0.1) went
    assert kept["max_mem_False"] == ["global_step3"]
    assert kept["best_False"] == ["best_global_step4", "global_step3"]
    for name in ("max_num", "metrics", "max_mem", "best"):
        assert kept[f"{name}_False"] == kept[f"{name}_True"], name  # upstream's policy, applied later


@pytest.mark.slow
def test_two_ranks_a_lost_file_of_the_highest_rank_resumes_from_the_complete_tag(tmp_path):
    """The same torn tag on a real 2-rank ZeRO-2 run (gloo, one process per rank): rank 1's optimizer file of the newest tag
    deleted. The resume chose that tag and rank 1 died in ``torch.load``; now both ranks load the complete earlier
    tag, and the next save's rotation removes the torn one first (``max_num 2`` keeps the earlier tag)."""
    from openrlhf_classmate.testing.gloo_ranks import run_ranks

    actor = str(tmp_path / "_actor")
    target = "openrlhf_classmate.testing.ckpt_engine:on_ranks"
    saved = run_ranks(target, 2, {"save_dir": actor, "saves": [1, 2], "max_num": 2})
    assert [r.get("error") for r in saved] == [None, None], saved[1]["log"][-3000:]
    step2 = os.path.join(actor, "global_step2")
    marker = json.load(open(os.path.join(step2, MARKER)))
    assert marker["dp_world_size"] == 2 and marker["zero_stage"] == 2
    assert {OPTIM.format(0), OPTIM.format(1), MODEL} <= set(marker["files"])
    assert choose_resume_tag(actor, zero_stage=2).tag == "global_step2"

    os.remove(os.path.join(step2, OPTIM.format(1)))
    choice = choose_resume_tag(actor, zero_stage=2)
    assert choice.tag == "global_step1"
    assert f"{step2}/{OPTIM.format(1)} is missing (the optim states of data-parallel rank 1 of 2)" in choice.skipped[0][1]

    resumed = run_ranks(target, 2, {"save_dir": actor, "saves": [3], "max_num": 2, "resume": True})
    assert [r.get("error") for r in resumed] == [None, None], resumed[1]["log"][-3000:]
    for r in resumed:
        assert r["loaded"] == "global_step1" and r["global_steps"] == 1 and r["data_step"] == 1
    assert resumed[0]["loaded_weights"] == resumed[1]["loaded_weights"] != saved[0]["weights"]  # step 1's, not 2's
    assert f"Deleted checkpoint {step2} (incomplete: {step2}/{OPTIM.format(1)} is missing" in resumed[0]["log"]
    assert [d for d in resumed[0]["listing"] if d.startswith("global_step")] == ["global_step1", "global_step3"]
