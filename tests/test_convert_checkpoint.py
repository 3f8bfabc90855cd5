"""A real CPU end-to-end plain-GRPO launcher run (one per module): what it trains and logs (upstream's GRPO through our
launcher), and checkpoint conversion on its checkpoint (DeepSpeed ZeRO checkpoint -> verified Hugging Face directory);
plus the conversion's error cases and the hub upload (mocked, no network)."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from openrlhf_classmate.cli import convert_checkpoint as cc
from openrlhf_classmate.testing.e2e import (
    build_world,
    launcher_argv,
    max_weight_change,
    model_weights,
    run_launcher,
    tensorboard_scalars,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-step plain GRPO run of the launcher (tiny e2e world, ZeRO-2, bf16, checkpoints and HF saves at steps 1 and
    2), shared by this module's tests: what the run trains and logs, and the conversion of its checkpoint (one launch:
    ~40 s of Ray, DeepSpeed and engine start-up on two cores for ~1 s per step). An entropy bonus moves the weights
    every step even when a tiny random policy's rewards do not vary within a group (then the policy loss alone has no
    gradient). Returns the world plus its ``log``."""
    world = build_world(str(tmp_path_factory.mktemp("convert") / "world"))
    log = os.path.join(world["root"], "launcher.log")
    code = run_launcher(launcher_argv(world, classmate=False, extra=["--actor.entropy_coef", "0.01"]), log, cwd=REPO)
    if code != 0:
        pytest.fail(f"launcher run failed ({code}):\n{open(log).read()[-4000:]}")
    return {**world, "log": log}


@pytest.mark.slow
def test_plain_grpo_baseline_runs_through_our_launcher(run):
    with open(os.path.join(run["root"], "ckpt", "engine_weight_updates.json")) as f:
        assert json.load(f) == {"policy": [2], "classmate": []}
    tb = tensorboard_scalars(os.path.join(run["root"], "tb"))
    assert not [tag for tag in tb if "classmate" in tag]
    assert set(tb["train/reward"]) == {1, 2}
    # train-inference mismatch on by default: the engine follows the weights (bf16 actor vs fp32 HF engine: ~0.006)
    for key in ("logprob_abs_diff_mean", "logprob_abs_diff_max", "kl_k3"):
        assert set(tb[f"train/mismatch/{key}"]) == {1, 2}
    assert all(0 < v < 0.02 for v in tb["train/mismatch/logprob_abs_diff_mean"].values())
    assert "train-inference mismatch" not in open(run["log"]).read()
    change = max_weight_change(model_weights(run["policy"]), model_weights(os.path.join(run["root"], "hf_final")))
    assert change > 1e-4


def _model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _max_diff(a, b) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    return max(float((sa[k] - sb[k]).abs().max()) for k in sa)


@pytest.mark.slow
def test_shell_script_converts_the_e2e_checkpoint_like_the_hf_save(run, tmp_path):
    ckpt = os.path.join(run["root"], "ckpt")
    out = str(tmp_path / "step2")
    # the interpreter running the tests (the script's default is the checkout's .venv, which a worktree may lack)
    proc = subprocess.run(["bash", os.path.join(REPO, "train_scripts", "convert_checkpoint.sh"), ckpt, out,
                           "global_step2"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{\n"):])
    assert report["verified"] and report["tag"] == "global_step2" and report["max_weight_diff"] == 0.0
    assert report["base_model"] == os.path.join(ckpt, "global_step2_hf")  # found next to the checkpoint

    # config, generation config, tokenizer and chat template come from the base model
    base = os.path.join(ckpt, "global_step2_hf")
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert open(os.path.join(out, name), "rb").read() == open(os.path.join(base, name), "rb").read(), name
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["dtype"] == "bfloat16" and config["vocab_size"] == json.load(open(os.path.join(base, "config.json")))["vocab_size"]
    assert not glob.glob(os.path.join(tmp_path, ".step2*"))  # no temporary directory left

    # same weights as OpenRLHF's own bf16 saves of that step (fp32 master weights vs bf16 params: rounding only)
    converted = _model(out)
    assert _max_diff(converted, _model(base)) < 1e-2
    assert _max_diff(converted, _model(os.path.join(run["root"], "hf_final"))) < 1e-2
    assert _max_diff(converted, _model(run["policy"])) > 1e-4  # and training did change them
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.allclose(converted(ids).logits, _model(base)(ids).logits, atol=5e-2)
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out).chat_template == AutoTokenizer.from_pretrained(base).chat_template


@pytest.mark.slow
def test_tags_actor_folder_fp32_and_overwrite(run, tmp_path):
    actor = os.path.join(run["root"], "ckpt", "_actor")
    out = str(tmp_path / "model")
    step1 = cc.convert(actor, out, tag="global_step1", dtype="fp32", log=lambda *_: None)
    assert step1.verified and step1.tag == "global_step1" and step1.max_logit_diff_vs_fp32 < 1e-5
    fp32_step1 = _model(out)
    assert json.load(open(os.path.join(out, "config.json")))["dtype"] == "float32"
    with pytest.raises(cc.ConversionError, match="exists; pass --overwrite"):
        cc.convert(actor, out, log=lambda *_: None)
    latest = cc.convert(actor, out, overwrite=True, log=lambda *_: None)  # tag from `latest`
    assert latest.tag == "global_step2" and latest.dtype == "bf16"
    assert _max_diff(_model(out), fp32_step1) > 1e-4  # step 2 replaced step 1
    assert sorted(os.listdir(tmp_path)) == ["model"]


@pytest.mark.slow
def test_converting_a_checkpoint_onto_itself_is_refused_and_the_checkpoint_survives(run, tmp_path):
    """`convert CKPT CKPT --overwrite` used to verify, install and so delete the whole training checkpoint."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(os.path.join(run["root"], "ckpt"), ckpt)
    before = _files(ckpt)
    assert cc.main([str(ckpt), str(ckpt), "--overwrite"]) == 1
    assert cc.main([str(ckpt / "_actor"), str(ckpt), "--overwrite", "--no-verify"]) == 1
    assert _files(ckpt) == before and sorted(os.listdir(tmp_path)) == ["ckpt"]


@pytest.mark.slow
def test_a_failed_verification_leaves_nothing_behind(run, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise cc.ConversionError("verification failed: simulated")

    monkeypatch.setattr(cc, "_verify", broken)
    with pytest.raises(cc.ConversionError, match="simulated"):
        cc.convert(os.path.join(run["root"], "ckpt"), str(tmp_path / "model"), log=lambda *_: None)
    assert os.listdir(tmp_path) == []


# ── errors, without a run ──


def _fake_checkpoint(root, tags=("global_step3",), latest="global_step3", hf=False):
    actor = root / "ckpt" / "_actor"
    for tag in tags:
        (actor / tag).mkdir(parents=True)
        torch.save({"module": {}}, actor / tag / "mp_rank_00_model_states.pt")  # complete file (no weights needed)
    if latest:
        (actor / "latest").write_text(latest)
    if hf:
        (root / "ckpt" / f"{tags[-1]}_hf").mkdir()
        (root / "ckpt" / f"{tags[-1]}_hf" / "config.json").write_text("{}")
    return root / "ckpt"


def test_missing_checkpoint_directory(tmp_path):
    assert cc.main([str(tmp_path / "nope"), str(tmp_path / "out")]) == 1
    with pytest.raises(cc.ConversionError, match="nope does not exist"):
        cc.convert(str(tmp_path / "nope"), str(tmp_path / "out"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(cc.ConversionError, match="holds no DeepSpeed checkpoint"):
        cc.convert(str(tmp_path / "empty"), str(tmp_path / "out"))


def test_missing_tag_lists_the_available_ones(tmp_path):
    ckpt = _fake_checkpoint(tmp_path, tags=("global_step3", "global_step10"), latest="global_step12")
    with pytest.raises(cc.ConversionError, match=r"'global_step12' not found .*global_step3, global_step10"):
        cc.convert(str(ckpt), str(tmp_path / "out"))
    with pytest.raises(cc.ConversionError, match="'global_step7' not found"):
        cc.convert(str(ckpt / "_actor"), str(tmp_path / "out"), tag="global_step7")


def test_no_latest_file_asks_for_a_tag(tmp_path):
    ckpt = _fake_checkpoint(tmp_path, latest=None)
    with pytest.raises(cc.ConversionError, match="no 'latest' file; pass --tag"):
        cc.convert(str(ckpt), str(tmp_path / "out"))


def test_missing_base_model(tmp_path, capsys):
    ckpt = _fake_checkpoint(tmp_path)
    with pytest.raises(cc.ConversionError, match="no base model found.*pass --base-model"):
        cc.convert(str(ckpt), str(tmp_path / "out"))
    with pytest.raises(cc.ConversionError, match="does not exist"):
        cc.convert(str(ckpt), str(tmp_path / "out"), base_model=str(tmp_path / "missing_base"))
    assert cc.main([str(ckpt), str(tmp_path / "out"), "--base-model", str(tmp_path / "missing_base")]) == 1
    assert "error: base model" in capsys.readouterr().err
    ckpt = _fake_checkpoint(tmp_path / "b", hf=True)
    assert cc.find_base_model(str(ckpt / "_actor"), "global_step3", None) == str(ckpt / "global_step3_hf")


def _files(root) -> dict[str, int]:
    return {os.path.relpath(os.path.join(d, f), root): os.path.getsize(os.path.join(d, f))
            for d, _, names in os.walk(root) for f in names}


def test_an_output_over_an_input_is_refused_without_suggesting_overwrite(tmp_path, capsys):
    ckpt = _fake_checkpoint(tmp_path, hf=True)
    actor = ckpt / "_actor"
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    os.symlink(ckpt, tmp_path / "link")
    before = _files(tmp_path)
    cases = [  # (CKPT_DIR, OUT_DIR, --base-model, expected words)
        (ckpt, ckpt, None, f"is the checkpoint folder {ckpt} "),
        (actor, actor, None, f"is the checkpoint folder {actor} "),
        (actor, ckpt, None, f"is the checkpoint folder {ckpt} "),  # the --ckpt.path above the _actor folder
        (ckpt, tmp_path, None, "contains the checkpoint folder"),
        (ckpt, actor / "global_step3", None, "lies inside the checkpoint folder"),
        (actor, ckpt / "converted", None, f"lies inside the checkpoint folder {ckpt} "),  # the --ckpt.path
        (actor, ckpt / "global_step3_hf", None, f"is the base model folder {ckpt / 'global_step3_hf'} "),  # found
        (ckpt, tmp_path / "link", None, "is the checkpoint folder"),  # through a symlink
        (tmp_path / "link" / "_actor", ckpt / "converted", None, "lies inside the checkpoint folder"),
        (ckpt, base, str(base), f"is the base model folder {base}"),
        (ckpt, base / "sub", str(base), "lies inside the base model folder"),
    ]
    for ckpt_dir, out, base_model, words in cases:
        for overwrite in (False, True):
            with pytest.raises(cc.ConversionError, match=re.escape(words)) as info:
                cc.convert(str(ckpt_dir), str(out), base_model=base_model, overwrite=overwrite)
            assert "--overwrite" not in str(info.value) and "\n" not in str(info.value)
    assert cc.main([str(ckpt), str(ckpt), "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: OUT_DIR {ckpt} is the checkpoint folder") and err.count("\n") == 1
    assert _files(tmp_path) == before  # nothing written, nothing removed
    # a sibling folder is fine (fails later, at the fake checkpoint's empty base config, not at the output check)
    with pytest.raises(cc.ConversionError, match="cannot build a model from its config"):
        cc.convert(str(ckpt), str(tmp_path / "out"), overwrite=True)


# ── hub upload (mocked) ──


class FakeHfApi:
    calls: list = []

    def __init__(self, token=None):
        FakeHfApi.calls.append(("init", {"token": token}))

    def create_repo(self, **kwargs):
        FakeHfApi.calls.append(("create_repo", kwargs))

    def create_branch(self, **kwargs):
        FakeHfApi.calls.append(("create_branch", kwargs))

    def upload_folder(self, **kwargs):
        FakeHfApi.calls.append(("upload_folder", kwargs))


def test_push_to_hub_one_branch_per_step(tmp_path, monkeypatch):
    import huggingface_hub

    FakeHfApi.calls = []
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHfApi)
    revisions = cc.push_to_hub(str(tmp_path), "me/warmup", "global_step20", also_main=True, private=True)
    assert revisions == ["global_step20", "main"]
    names = [c[0] for c in FakeHfApi.calls]
    assert names == ["init", "create_repo", "create_branch", "upload_folder", "upload_folder"]
    assert FakeHfApi.calls[1][1] == {"repo_id": "me/warmup", "repo_type": "model", "private": True, "exist_ok": True}
    assert FakeHfApi.calls[2][1] == {"repo_id": "me/warmup", "branch": "global_step20", "repo_type": "model",
                                     "exist_ok": True}
    uploads = [c[1] for c in FakeHfApi.calls if c[0] == "upload_folder"]
    assert [u["revision"] for u in uploads] == ["global_step20", "main"]
    assert all(u["folder_path"] == str(tmp_path) and u["repo_id"] == "me/warmup" for u in uploads)


def test_push_flag_of_the_entry_point(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    FakeHfApi.calls = []
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHfApi)
    report = cc.ConversionReport(checkpoint="c", tag="global_step7", base_model="b", output_dir=str(tmp_path),
                                 dtype="bf16", verified=True)
    monkeypatch.setattr(cc, "convert", lambda *a, **k: report)
    assert cc.main(["ckpt", str(tmp_path), "--push-to-hub", "me/run"]) == 0
    uploads = [c[1] for c in FakeHfApi.calls if c[0] == "upload_folder"]
    assert [u["revision"] for u in uploads] == ["global_step7"]  # the tag names the branch
    assert json.loads(capsys.readouterr().out.split("\n", 1)[1])["pushed"] == ["global_step7"]


def test_overwrite_replaces_only_a_model_folder(tmp_path, capsys):
    # a typo (models/ for models/step2) with --overwrite deleted every model in models/ and a README beside them
    ckpt = _fake_checkpoint(tmp_path, hf=True)
    models = tmp_path / "models"
    (models / "step1_model").mkdir(parents=True)
    (models / "step1_model" / "config.json").write_text("{}")
    (models / "README.md").write_text("notes")
    before = _files(tmp_path)
    assert cc.main([str(ckpt), str(models), "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: OUT_DIR {models} holds folders (step1_model/) and no config.json: --overwrite "
                          "replaces a converted model's folder, not a folder of models") and err.count("\n") == 1
    assert _files(tmp_path) == before
