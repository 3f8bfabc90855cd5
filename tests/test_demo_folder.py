"""The demo's output folder (fast: no demo runs): ``--output-dir`` is cleared only of the artefacts of an earlier demo
run, recognised by its marker or, for a folder written before the marker, by its summary; any other folder holding
those names is refused in one line before anything is touched (the demo's own command line refusing such a folder:
``tests/test_demo.py``, slow, as every test that starts the demo)."""

import json
import os

import pytest


def test_the_demo_clears_only_a_folder_it_wrote(tmp_path):
    # a folder of earlier training runs given as --output-dir: the demo deleted its runs/, world/ and summary.* (the
    # names of its own artefacts) before its first stage; now it refuses before touching anything
    from openrlhf_classmate.demo.report import MARKER, clear_previous_run

    foreign = tmp_path / "mine"
    (foreign / "runs" / "classmate_gdpo" / "ckpt").mkdir(parents=True)
    (foreign / "runs" / "classmate_gdpo" / "ckpt" / "latest").write_text("global_step100")
    (foreign / "summary.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"^error: --output-dir .*mine holds runs/, summary.json, which no demo run "
                                         r"wrote \(no \.openrlhf_classmate_demo\)"):
        clear_previous_run(str(foreign))
    assert (foreign / "runs" / "classmate_gdpo" / "ckpt" / "latest").read_text() == "global_step100"
    assert (foreign / "summary.json").read_text() == "{}"
    # a new folder, or one with only files the demo never replaces (a log redirected there before it starts), is
    # claimed (the marker), and a folder the demo wrote is cleared of its artefacts only
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "demo.log").write_text("")
    clear_previous_run(str(ours))
    assert (ours / "demo.log").exists()
    assert (ours / MARKER).exists()
    (ours / "runs").mkdir()
    (ours / "notes.txt").write_text("kept")
    clear_previous_run(str(ours))
    assert not (ours / "runs").exists() and (ours / "notes.txt").read_text() == "kept"


def test_a_demo_folder_written_before_the_marker_is_still_the_demos(tmp_path):
    from openrlhf_classmate.demo.report import MARKER, clear_previous_run

    old = tmp_path / "outputs_demo"
    (old / "runs" / "classmate").mkdir(parents=True)
    (old / "world").mkdir()
    (old / "summary.json").write_text(json.dumps({"seed": 0, "quick": False, "rl": {}, "world": {}}))
    (old / "eval_before.jsonl").write_text("")
    clear_previous_run(str(old))
    assert sorted(os.listdir(old)) == [MARKER]
