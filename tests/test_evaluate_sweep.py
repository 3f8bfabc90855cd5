"""``evaluate --run-dir`` / ``--checkpoints``: every checkpoint of a run, truncated-CoT transfer and unseen readers.

* The demo world's checkpoints with the HF backend, for real: tiny demo models saved as a run (a starting model,
  ``ckpt/global_stepN_hf`` with perturbed weights, ``final``, a tensorboard log for the final step), evaluated with
  a classmate and an unseen reader; the files, the numbers against the per-sample records, resume.
* The vLLM path (0.29's ``LLM(...).generate`` on ``TokensPrompt``s, ``llm_engine.engine_core.shutdown``) with a
  scripted ``LLM`` whose answers are known, so every transfer accuracy is known exactly: one engine per model and
  checkpoint, closed before the next opens.
* The input errors (one line each, before any model is loaded).
"""

import csv
import json
import os
import re
import shutil
from types import SimpleNamespace

import pytest
import torch

from openrlhf_classmate.cli import evaluate as ev
from openrlhf_classmate.eval import generation
from openrlhf_classmate.testing.e2e import build_world

FRACTIONS = ["0", "0.25", "0.5", "0.75", "1"]


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models on a shared 2-core machine: one thread is faster than contending ones."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _rows(path):
    return [json.loads(line) for line in open(path)]


# ── the demo world's checkpoints, HF backend ──


def _perturbed(model, seed: int, scale: float):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """A run of the demo world on disk, as the launcher lays it out (no training: perturbed copies of a model)."""
    from torch.utils.tensorboard import SummaryWriter

    from openrlhf_classmate.demo import models as M
    from openrlhf_classmate.demo import world as W

    root = tmp_path_factory.mktemp("sweep")
    _, held_out = W.make_splits(0, num_train=10, num_eval=6)
    data = W.write_prompts(str(root / "heldout.jsonl"), held_out)
    size = M.ModelSize(16, 1)
    model, tok = M.new_model(W.WORDS, size, seed=0)
    start = M.save_model(model, tok, str(root / "start"))
    run = root / "run"
    for step in (5, 10):
        M.save_model(_perturbed(model, step, 0.05), tok, str(run / "ckpt" / f"global_step{step}_hf"))
    M.save_model(_perturbed(model, 11, 0.05), tok, str(run / "final"))
    writer = SummaryWriter(str(run / "tensorboard" / "demo"))
    for step in range(1, 11):
        writer.add_scalar("train/reward", 0.1 * step, step)
    writer.close()
    classmate = M.save_model(*M.new_model(W.WORDS, size, seed=1), str(root / "classmate"))
    reader = M.save_model(*M.new_model(W.WORDS, M.ModelSize(8, 1), seed=2), str(root / "reader_small"))
    return SimpleNamespace(root=root, data=data, start=start, run=str(run), classmate=classmate, reader=reader)


def _sweep_argv(world, out, *extra):
    return ["--run-dir", world.run, "--data", world.data, "--output-dir", str(out), "--start-model", world.start,
            "--classmate", world.classmate, "--reader", world.reader, "--truncate-cot", "0.5,0,0.25,0.75",
            "--backend", "hf", "--samples", "4", "--temperature", "1.0", "--max-new-tokens", "10",
            "--classmate-temperature", "1.0", "--classmate-max-new-tokens", "2", "--batch-size", "64", "--quiet",
            *extra]


def test_sweep_over_a_demo_run_writes_every_checkpoint_and_resumes(demo_run, tmp_path, capsys):
    out = tmp_path / "sweep"
    assert ev.main(_sweep_argv(demo_run, out)) == 0
    err = capsys.readouterr().err
    assert "4 checkpoints (start (step 0), global_step5, global_step10, final (step 10))" in err
    sweep = json.load(open(out / "sweep.json"))
    names = [c["name"] for c in sweep["checkpoints"]]
    assert names == ["start", "global_step5", "global_step10", "final"]
    assert [c["step"] for c in sweep["checkpoints"]] == [0, 5, 10, 10]  # final: the last logged step
    assert sweep["truncate_cot"] == [0.0, 0.25, 0.5, 0.75, 1.0]  # sorted, 1 added
    assert sweep["readers"] == {"classmate": demo_run.classmate, "reader_small": demo_run.reader}
    assert sweep["plots"] == ["sweep_metrics.png", "transfer.png"]
    for name in sweep["plots"]:
        assert open(out / name, "rb").read(8) == b"\x89PNG\r\n\x1a\n"

    csv_rows = list(csv.DictReader(open(out / "sweep.csv")))
    for entry in sweep["checkpoints"]:
        records = _rows(out / entry["name"] / "samples.jsonl")
        assert len(records) == 24  # 6 problems x 4 samples
        m = entry["metrics"]["arithmetic"]
        assert m["accuracy"] == pytest.approx(sum(r["score"] for r in records if r["valid"]) / 24)
        for reader in ("classmate", "reader_small"):
            assert list(m["transfer"][reader]) == FRACTIONS
            for fraction in FRACTIONS:
                scores = [r["transfer"][reader][fraction] for r in records]
                valid = [s for s in scores if s is not None]
                assert m["transfer"][reader][fraction]["accuracy"] == pytest.approx(sum(valid) / len(valid))
                row = next(r for r in csv_rows if r["checkpoint"] == entry["name"] and r["reader"] == reader
                           and r["fraction"] == fraction and r["metric"] == "transfer/accuracy")
                assert float(row["value"]) == pytest.approx(sum(valid) / len(valid))
        # the whole CoT is the classmate's protocol of evaluate: the same number
        assert m["transfer"]["classmate"]["1"]["accuracy"] == pytest.approx(m["classmate_accuracy"])
        assert [r["classmate_score"] if r["classmate_valid"] else None for r in records] == [
            r["transfer"]["classmate"]["1"] for r in records]
        row = next(r for r in csv_rows if r["checkpoint"] == entry["name"] and r["metric"] == "accuracy")
        assert (row["step"], float(row["value"])) == (str(entry["step"]), pytest.approx(m["accuracy"]))
    assert {r["checkpoint"] for r in csv_rows} == set(names)

    # resume: nothing is evaluated again; a removed entry is evaluated again, alone
    stamps = {n: os.stat(out / n / "sweep_entry.json").st_mtime_ns for n in names}
    assert ev.main(_sweep_argv(demo_run, out, "--no-plot")) == 0  # --no-plot: not a setting the numbers depend on
    assert "4 already evaluated, skipped; 0 to evaluate" in capsys.readouterr().err
    os.remove(out / "global_step10" / "sweep_entry.json")
    assert ev.main(_sweep_argv(demo_run, out, "--no-plot")) == 0
    assert "3 already evaluated, skipped; 1 to evaluate" in capsys.readouterr().err
    assert {n: os.stat(out / n / "sweep_entry.json").st_mtime_ns for n in names if n != "global_step10"} == {
        n: t for n, t in stamps.items() if n != "global_step10"}
    again = json.load(open(out / "sweep.json"))["checkpoints"]
    assert [c["metrics"] for c in again if c["name"] != "global_step10"] == [
        c["metrics"] for c in sweep["checkpoints"] if c["name"] != "global_step10"]
    # other settings than the entries': refused, naming the flag
    assert ev.main(_sweep_argv(demo_run, out, "--seed", "7")) == 1
    assert re.search(r"start was evaluated with other settings \(seed 42 -> 7\)", capsys.readouterr().err)


# ── the vLLM API with a scripted engine ──


class ScriptedLLM:
    """vLLM 0.29's offline ``LLM``, scripted by ``script.json`` in the model folder. A policy answers ``a + b = ?``
    with ``<think> a + b = S </think> S`` (``"result": false``: ``<think> a + b </think> S``); a reader answers the
    last number of the CoT it was given (nothing when there is none)."""

    events: list = []

    def __init__(self, **kwargs):
        from transformers import AutoTokenizer

        self.name = os.path.basename(kwargs["model"])
        self.script = json.load(open(os.path.join(kwargs["model"], "script.json")))
        self.tok = AutoTokenizer.from_pretrained(kwargs["model"])
        ScriptedLLM.events.append(("open", self.name))
        self.llm_engine = SimpleNamespace(engine_core=SimpleNamespace(
            shutdown=lambda: ScriptedLLM.events.append(("close", self.name))))

    def respond(self, prompt: str) -> str:
        if self.script["role"] == "reader":
            cot = prompt.rsplit("<think>", 1)[1].split("</think>")[0].split()
            numbers = [w for w in cot if w.isdigit()]
            return numbers[-1] if numbers else ""
        a, b = map(int, re.search(r"(\d) \+ (\d) = \?", prompt).groups())
        cot = f"{a} + {b} = {a + b}" if self.script["result"] else f"{a} + {b}"
        return f"<think> {cot} </think> {a + b}"

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        outputs = []
        for p in prompts:
            text = self.tok.decode(p["prompt_token_ids"])
            ids = self.tok.encode(self.respond(text), add_special_tokens=False) + [self.tok.eos_token_id]
            outputs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, finish_reason="stop")]))
        return outputs


@pytest.fixture
def scripted_run(tmp_path, monkeypatch):
    import vllm

    world = build_world(str(tmp_path / "world"), num_prompts=8)
    run = tmp_path / "run"

    def copy(src, dest, **script):
        shutil.copytree(src, dest)
        json.dump(script, open(os.path.join(dest, "script.json"), "w"))
        return str(dest)

    copy(world["policy"], run / "ckpt" / "global_step1_hf", role="policy", result=False)
    copy(world["policy"], run / "ckpt" / "global_step2_hf", role="policy", result=True)
    copy(world["policy"], run / "final", role="policy", result=True)
    classmate = copy(world["classmate"], tmp_path / "classmate", role="reader")
    reader = copy(world["classmate"], tmp_path / "reader_b", role="reader")
    ScriptedLLM.events = []
    monkeypatch.setattr(vllm, "LLM", ScriptedLLM)
    monkeypatch.setattr(generation, "resolve_backend", lambda backend: "vllm")
    monkeypatch.setattr(ev, "resolve_backend", lambda backend: "vllm")
    return SimpleNamespace(run=str(run), data=world["data"], classmate=classmate, reader=reader)


def _expected(rows, fraction: float, result: bool) -> float:
    """Accuracy of a reader that answers the last number of the first ``floor(fraction * tokens)`` CoT tokens."""
    correct = 0
    for row in rows:
        a, b = int(row["prompt"][0]["content"][0]), int(row["prompt"][0]["content"][4])
        cot = [str(a), "+", str(b)] + (["=", str(a + b)] if result else [])
        numbers = [w for w in cot[: int(fraction * len(cot))] if w.isdigit()]
        correct += bool(numbers) and int(numbers[-1]) == a + b
    return correct / len(rows)


def test_vllm_sweep_transfer_accuracies_are_exact_and_engines_never_overlap(scripted_run, tmp_path):
    out = tmp_path / "sweep"
    assert ev.main(["--run-dir", scripted_run.run, "--data", scripted_run.data, "--output-dir", str(out),
                    "--final-step", "2", "--classmate", scripted_run.classmate, "--reader", scripted_run.reader,
                    "--truncate-cot", ",".join(FRACTIONS), "--max-new-tokens", "20", "--classmate-max-new-tokens", "8",
                    "--quiet", "--no-plot"]) == 0
    sweep = json.load(open(out / "sweep.json"))
    assert [(c["name"], c["step"]) for c in sweep["checkpoints"]] == [("global_step1", 1), ("global_step2", 2),
                                                                     ("final", 2)]
    rows = _rows(scripted_run.data)
    for entry in sweep["checkpoints"]:
        m = entry["metrics"]["arithmetic"]
        assert m["accuracy"] == 1.0
        for reader in ("classmate", "reader_b"):
            got = {f: m["transfer"][reader][f]["accuracy"] for f in FRACTIONS}
            assert got == {f: pytest.approx(_expected(rows, float(f), entry["name"] != "global_step1"))
                           for f in FRACTIONS}, entry["name"]
    step1 = sweep["checkpoints"][0]["metrics"]["arithmetic"]["transfer"]["classmate"]
    step2 = sweep["checkpoints"][1]["metrics"]["arithmetic"]["transfer"]["classmate"]
    assert step1["1"]["accuracy"] < step2["1"]["accuracy"] == 1.0  # the written result is what the reader reads
    # one engine per model and checkpoint, each shut down before the next starts
    per_checkpoint = [("open", "policy"), ("close", "policy"), ("open", "classmate"), ("close", "classmate"),
                      ("open", "reader_b"), ("close", "reader_b")]
    names = [e[1] for e in ScriptedLLM.events]
    assert [e[0] for e in ScriptedLLM.events] == [e[0] for e in per_checkpoint] * 3
    assert names[1::6] == ["global_step1_hf", "global_step2_hf", "final"]
    assert names[2::6] == ["classmate"] * 3 and names[4::6] == ["reader_b"] * 3


# ── input errors ──


def _reader_without_think_tags(src: str, dest) -> str:
    """A copy of ``src`` whose tokenizer calls its tags <reason> / </reason>: it has no <think> token."""
    shutil.copytree(src, dest)
    path = os.path.join(dest, "tokenizer.json")
    text = open(path).read().replace("<think>", "<reason>").replace("</think>", "</reason>")
    open(path, "w").write(text)
    return str(dest)


def test_bad_sweep_inputs_get_one_line_before_any_model_loads(demo_run, tmp_path, capsys):
    base = ["--data", demo_run.data, "--backend", "hf", "--quiet"]
    empty = tmp_path / "empty_run"
    empty.mkdir()
    broken = tmp_path / "broken_run" / "ckpt" / "global_step3_hf"
    broken.mkdir(parents=True)
    no_tags = _reader_without_think_tags(demo_run.classmate, tmp_path / "no_tags")
    run = ["--run-dir", demo_run.run, "--output-dir", str(tmp_path / "o")]
    cases = [
        (["--run-dir", str(empty)], r"--run-dir .*empty_run has no checkpoints: expected .*global_stepN_hf folders "
                                    r"\(train with --ckpt.save_hf\)"),
        (["--run-dir", str(tmp_path / "missing")], r"--run-dir .*missing is not a folder"),
        (["--run-dir", str(broken.parent.parent)], r"global_step3_hf has no config.json"),
        (run + ["--classmate", demo_run.classmate, "--truncate-cot", "0,1.5"],
         r"--truncate-cot '0,1.5': 1.5 is not a fraction in \[0, 1\]"),
        (run + ["--classmate", demo_run.classmate, "--truncate-cot", "0,half"], r"'half' is not a number"),
        (run + ["--truncate-cot", "0,1"], r"--truncate-cot needs a reader of the CoT: --classmate"),
        (run + ["--reader", no_tags], r"--reader .*no_tags: its tokenizer lacks the think tags"),
        (run + ["--model", demo_run.start], r"--model evaluates one model; a sweep takes --run-dir"),
        (["--checkpoints", demo_run.start, "--output-dir", str(tmp_path / "o")],
         r"--checkpoints .*start: the training step cannot be read from the folder name; give it as STEP="),
        (["--checkpoints", f"3={demo_run.start}"], r"--checkpoints needs --output-dir"),
        ([], r"give --model MODEL and --output-dir DIR \(one model\), or --run-dir RUN"),
    ]
    for extra, message in cases:
        assert ev.main(base + extra) == 1, extra
        err = capsys.readouterr().err.strip()
        assert re.search(message, err) and len(err.splitlines()) == 1, (extra, err)
    assert not (tmp_path / "o").exists()  # nothing evaluated, nothing written


def test_listed_checkpoints_take_their_step_from_name_or_prefix(demo_run, tmp_path):
    from openrlhf_classmate.eval.sweep import discover

    args = ev.build_parser().parse_args(["--data", demo_run.data, "--checkpoints",
                                         os.path.join(demo_run.run, "final"), f"7={demo_run.start}",
                                         os.path.join(demo_run.run, "ckpt", "global_step10_hf"),
                                         "--final-step", "12"])
    assert [(c.name, c.step) for c in discover(args)] == [("step7", 7), ("global_step10", 10), ("final", 12)]
