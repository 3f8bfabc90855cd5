"""The demo's output folder (fast: no demo runs). The demo records every file it writes in ``--output-dir``
(``.openrlhf_classmate_demo.json``) and a later run removes those files only, refusing in one line, before touching
anything, where the folder no longer matches that record; a folder without a record that holds the names the demo
writes (another program's, or an older demo version's) is refused untouched; and ``--output-dir`` naming ``/``, the
home folder, a repository's root, a file or a folder that cannot be written is refused on the command line (the demo
itself refusing a folder it did not write: ``tests/test_demo.py``, slow, as every test that starts the demo)."""

import json
import os

import pytest

from openrlhf_classmate.demo import report as R


def _write(path, text="x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _first_run(out):
    """What a demo run leaves: its files, recorded as the demo records them (claim, write, record)."""
    since = R.claim_output_dir(str(out))
    for name in ("world/train.jsonl", "world/main_warmstart/model.safetensors", "runs/classmate/launcher.log",
                 "runs/classmate/ckpt/global_step5_hf/model.safetensors", "eval_before.jsonl", "summary.json",
                 "summary.md", "metrics.jsonl"):
        _write(out / name, f"demo's {name}")
    R.record_written(str(out), since)


def _recorded(out):
    with open(out / R.MANIFEST) as f:
        return json.load(f)["files"]


def test_a_second_run_removes_only_the_files_the_first_recorded(tmp_path):
    # after a first run, another program writes runs/ppo_run1/ into the folder; the second run deleted
    # runs/, world/ and summary.* whoever wrote them
    out = tmp_path / "demo"
    _first_run(out)
    assert "runs/classmate/ckpt/global_step5_hf/model.safetensors" in _recorded(out)
    _write(out / "runs" / "ppo_run1" / "model.safetensors", "someone's weights")
    _write(out / "notes.txt", "mine")
    R.clear_previous_run(str(out))
    assert (out / "runs" / "ppo_run1" / "model.safetensors").read_text() == "someone's weights"
    assert (out / "notes.txt").read_text() == "mine"
    # the demo's files are gone, and the folders they leave empty (runs/ still holds ppo_run1)
    assert sorted(os.listdir(out)) == [R.MANIFEST, "notes.txt", "runs"]
    assert os.listdir(out / "runs") == ["ppo_run1"]
    assert _recorded(out) == {}
    # the next run records what it writes, never the foreign file written before it started
    _first_run(out)
    assert not any(name.startswith("runs/ppo_run1") for name in _recorded(out))


def test_a_recorded_file_someone_rewrote_is_refused_before_anything_is_removed(tmp_path):
    out = tmp_path / "demo"
    _first_run(out)
    (out / "summary.json").write_text('{"mine": "rewritten"}')
    with pytest.raises(SystemExit) as refused:
        R.clear_previous_run(str(out))
    message = str(refused.value)
    assert message.startswith(f"error: --output-dir {out} holds summary.json (changed since the demo wrote it)")
    assert "\n" not in message and "move them out of the folder" in message
    assert (out / "summary.json").read_text() == '{"mine": "rewritten"}'
    assert (out / "world" / "train.jsonl").exists() and (out / "runs" / "classmate" / "launcher.log").exists()


def test_a_file_the_record_lacks_under_the_demos_names_is_refused(tmp_path):
    # written where the demo writes (world/, runs/classmate/, ...) but not by it: a new run would overwrite it
    out = tmp_path / "demo"
    _first_run(out)
    _write(out / "world" / "my_prompts.jsonl", "mine")
    with pytest.raises(SystemExit, match=r"^error: --output-dir .* holds world/my_prompts\.jsonl \(not in the "
                                         r"record\)"):
        R.clear_previous_run(str(out))
    assert (out / "world" / "my_prompts.jsonl").read_text() == "mine" and (out / "summary.json").exists()


def test_a_later_call_records_only_what_it_wrote(tmp_path):
    # the GPU demo resumes without clearing: the record at the end of a call keeps the entry of a recorded file that
    # someone rewrote before the call, and leaves out a file someone added, so that --fresh refuses both
    out = tmp_path / "demo"
    _first_run(out)
    recorded = _recorded(out)["summary.json"]
    (out / "summary.json").write_text('{"mine": "rewritten"}')
    _write(out / "world" / "my_prompts.jsonl", "mine")
    for name in ("summary.json", "world/my_prompts.jsonl"):  # before the call (a clock tick earlier at least)
        os.utime(out / name, ns=(recorded[1] - 10**9, recorded[1] - 10**9))
    since = R.claim_output_dir(str(out))
    _write(out / "stages" / "report.done", "{}")  # what the call wrote
    R.record_written(str(out), since)
    assert _recorded(out)["summary.json"] == recorded and "stages/report.done" in _recorded(out)
    assert "world/my_prompts.jsonl" not in _recorded(out)
    with pytest.raises(SystemExit, match=r"holds summary.json \(changed since the demo wrote it\), "
                                         r"world/my_prompts.jsonl \(not in the record\)"):
        R.clear_previous_run(str(out))


def test_the_record_removes_nothing_outside_the_demos_names(tmp_path):
    # a record edited by hand, or damaged: entries outside the names the demo writes are ignored
    out = tmp_path / "demo"
    _first_run(out)
    _write(out / "notes.txt", "mine")
    _write(tmp_path / "outside.txt", "mine")
    manifest = json.loads((out / R.MANIFEST).read_text())
    for name in ("notes.txt", "../outside.txt", "world/../notes.txt", str(tmp_path / "outside.txt")):
        manifest["files"][name] = [4, 0]
    (out / R.MANIFEST).write_text(json.dumps(manifest))
    R.clear_previous_run(str(out))
    assert (out / "notes.txt").exists() and (tmp_path / "outside.txt").exists()
    (out / R.MANIFEST).write_text("{not json")
    with pytest.raises(SystemExit, match=r"^error: --output-dir .*cannot be read.*give another --output-dir"):
        R.clear_previous_run(str(out))


def test_a_folder_the_demo_did_not_write_is_refused_untouched(tmp_path):
    # a folder of earlier training runs given as --output-dir: refused before anything in it is touched
    foreign = tmp_path / "mine"
    _write(foreign / "runs" / "classmate_gdpo" / "ckpt" / "latest", "global_step100")
    _write(foreign / "summary.json", "{}")
    for call in (R.clear_previous_run, R.claim_output_dir):
        with pytest.raises(SystemExit, match=r"^error: --output-dir .*mine holds runs/, summary.json, which no demo "
                                             r"run recorded writing \(no \.openrlhf_classmate_demo\.json\)"):
            call(str(foreign))
    assert sorted(os.listdir(foreign)) == ["runs", "summary.json"]
    # a new folder, or one holding only names the demo never writes (a log redirected there before it starts), is
    # claimed: its record is written
    ours = tmp_path / "ours"
    _write(ours / "demo.log", "")
    R.clear_previous_run(str(ours))
    R.claim_output_dir(str(ours))
    assert sorted(os.listdir(ours)) == [R.MANIFEST, "demo.log"] and _recorded(ours) == {}


@pytest.mark.parametrize("old_version", ["marker", "before the marker"])
def test_a_folder_of_an_older_demo_version_is_refused_untouched(tmp_path, old_version):
    # an older demo kept no record of what it wrote: its folder is named in one line, and nothing is removed
    old = tmp_path / "outputs_demo"
    _write(old / "runs" / "classmate" / "launcher.log")
    _write(old / "world" / "train.jsonl")
    _write(old / "summary.json", json.dumps({"seed": 0, "quick": False, "rl": {}, "world": {}}))
    _write(old / "eval_before.jsonl", "")
    if old_version == "marker":
        _write(old / R.OLD_MARKER, "written by python -m openrlhf_classmate.demo\n")
    before = sorted(os.listdir(old))
    for call in (R.clear_previous_run, R.claim_output_dir):
        with pytest.raises(SystemExit) as refused:
            call(str(old))
        assert str(refused.value) == (
            f"error: --output-dir {old} holds eval_before.jsonl, runs/, summary.json, world/ of an earlier demo "
            "version, which kept no record of the files it wrote: remove them, or give a new --output-dir")
    assert sorted(os.listdir(old)) == before


def _parse(argv):
    from openrlhf_classmate.demo.cli import parse_args

    return parse_args(argv)


@pytest.mark.parametrize("demo", [[], ["--gpu"]])
@pytest.mark.parametrize("case", ["root", "home", "repository", "file", "inside a file", "not writable"])
def test_output_dirs_the_demo_must_not_use_are_refused_on_the_command_line(tmp_path, monkeypatch, demo, case):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    path, why = {
        "root": ("/", "the file system's root"),
        "home": (str(home), "the home folder"),
        "repository": (str(tmp_path / "repo"), "a repository's root (it holds .git)"),
        "file": (str(tmp_path / "a_file"), "a file, not a folder"),
        "inside a file": (str(tmp_path / "a_file" / "demo"), f"{tmp_path / 'a_file'} is a file"),
        "not writable": (str(tmp_path / "locked" / "demo"), f"{tmp_path / 'locked'} cannot be written"),
    }[case]
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "a_file").write_text("")
    (tmp_path / "locked").mkdir(mode=0o500)
    if os.access(tmp_path / "locked", os.W_OK):  # root: permission bits do not bind; the check asks os.access
        access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: p != str(tmp_path / "locked") and access(p, mode))
    with pytest.raises(SystemExit) as refused:
        _parse([*demo, "--output-dir", path])
    assert str(refused.value) == f"error: --output-dir {path}: {why}; give the demo a folder of its own"
    # a folder inside those is fine, as is the default
    assert _parse([*demo, "--output-dir", str(home / "demo")]).output_dir == str(home / "demo")
    _parse(demo)


def test_the_cpu_demo_records_at_every_stage_end_and_after_a_failure(tmp_path, monkeypatch):
    # the demo's own main and stage progress, with a stand-in for its stages (no models, no launcher)
    from openrlhf_classmate.demo import cli

    out = tmp_path / "demo"
    seen = {}

    def stages(args, settings, rl, out_dir, runs, progress):
        t = progress.header("build the world")
        _write(out / "world" / "train.jsonl")
        progress.done("build world", t)
        seen["after stage 1"] = set(_recorded(out))
        _write(out / "eval_before.jsonl")
        raise RuntimeError("the second stage failed")

    monkeypatch.setattr(cli, "run_demo", stages)
    with pytest.raises(RuntimeError, match="the second stage failed"):
        cli.main(["--quick", "--output-dir", str(out)])
    assert seen["after stage 1"] == {"world/train.jsonl"}
    assert set(_recorded(out)) == {"world/train.jsonl", "eval_before.jsonl"}
    # and so the next run clears what the failed one wrote
    monkeypatch.setattr(cli, "run_demo", lambda *a: 0)
    assert cli.main(["--quick", "--output-dir", str(out)]) == 0
    assert os.listdir(out) == [R.MANIFEST]


def test_the_gpu_demo_records_at_every_stage_end_and_after_a_failure(tmp_path, monkeypatch):
    # the GPU demo's main and stage runner, with stand-ins for its stages (no GPU, no child processes)
    from openrlhf_classmate.demo import gpu
    from openrlhf_classmate.demo.gpu_stages import GPUDemo
    from openrlhf_classmate.demo.stages import EXIT_FAILED, Stage, mark_done

    out = tmp_path / "demo"
    seen = {}

    def warmstart(deadline):
        _write(out / "world" / "main_warmstart" / "model.safetensors")
        mark_done(str(out), "warmstart", {})
        return True

    def eval_before(deadline):
        seen["after warmstart"] = set(_recorded(out))
        _write(out / "eval_before.jsonl")
        raise RuntimeError("eval_before failed")

    monkeypatch.setattr(gpu, "_check_machine", lambda settings: None)
    monkeypatch.setattr(GPUDemo, "stages", lambda self: [Stage("warmstart", "", lambda: 1, warmstart),
                                                         Stage("eval_before", "", lambda: 1, eval_before)])
    argv = ["--gpu", "--output-dir", str(out)]
    # a failed stage ends the call with one line and exit 1 (tests/test_gpu_demo.py), what it wrote recorded
    assert gpu.main(_parse(argv), argv) == EXIT_FAILED
    assert {"world/main_warmstart/model.safetensors", "stages/warmstart.done", "settings.json"} <= seen[
        "after warmstart"]
    assert "eval_before.jsonl" in _recorded(out)
    # --fresh clears all of it (and the call writes its settings.json again)
    monkeypatch.setattr(GPUDemo, "stages", lambda self: [])
    assert gpu.main(_parse([*argv, "--fresh"]), argv) == 0
    assert sorted(os.listdir(out)) == [R.MANIFEST, "settings.json"] and set(_recorded(out)) == {"settings.json"}
