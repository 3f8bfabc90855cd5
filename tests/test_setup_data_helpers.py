"""The shared helpers of the dataset setup scripts (openrlhf_classmate.data), tested in-process."""

from __future__ import annotations

import json
import random
import runpy
import sys
import types
from pathlib import Path

import pytest

from openrlhf_classmate.data import story_prompts as sp
from openrlhf_classmate.data.cli import Summary, assign_inputs
from openrlhf_classmate.data.errors import DataError
from openrlhf_classmate.data.io import atomic_outputs, load_rows
from openrlhf_classmate.data.math_answers import gsm8k_final_answer, last_boxed_content
from openrlhf_classmate.data.mc_sycophancy import draw_wrong_letter, fraction_floor
from openrlhf_classmate.data.rows import Example, make_row, require

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so $\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{ 2 }", "2"),
        ("\\fbox{7}", "7"),
        ("\\boxed {x^{2}}", "x^{2}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed{a} and \\boxed{unclosed", None),
        ("no box here", None),
        ("\\boxed{}", ""),
    ],
)
def test_last_boxed_content(text, expected):
    assert last_boxed_content(text) == expected


def test_gsm8k_final_answer():
    assert gsm8k_final_answer("a\n#### 1,234,567") == "1234567"
    assert gsm8k_final_answer("#### 1\n#### -3.5 ") == "-3.5"
    assert gsm8k_final_answer("no marker") is None


def test_data_error_message_names_location_and_field():
    err = DataError("missing", location="in.jsonl:3", field="question")
    assert str(err) == "in.jsonl:3: field 'question': missing"
    assert isinstance(err, ValueError)
    with pytest.raises(DataError, match=r"^x.jsonl:2: field 'n': must be an integer, got bool$"):
        require({"n": True}, "n", "x.jsonl:2", int)
    with pytest.raises(DataError, match="field 's': is empty"):
        require({"s": "  "}, "s", "x.jsonl:2", non_empty=True)


def test_make_row_label_is_a_json_string_with_messages():
    messages = [{"role": "user", "content": "q"}]
    row = make_row(Example(messages, "A", {"extra": 1}), data_source="mmlu_sycophancy", split="dev", index=4)
    assert row["prompt"] == messages and row["datasource"] == "mmlu_sycophancy"
    assert json.loads(row["label"]) == {
        "data_source": "mmlu_sycophancy",
        "ground_truth": "A",
        "extra": 1,
        "split": "dev",
        "index": 4,
        "messages": messages,
    }


def test_json_file_in_json_lines_layout_is_read(tmp_path):
    # datasets.Dataset.to_json writes JSON Lines under a .json name.
    path = tmp_path / "rows.json"
    path.write_text('{"a": 1}\n{"a": 2}\n', encoding="utf-8")
    assert [(loc, row) for loc, row in load_rows(str(path), None, None, "train")] == [
        (f"{path}:1", {"a": 1}),
        (f"{path}:2", {"a": 2}),
    ]
    path.write_text('[{"a": 1},\n 3]', encoding="utf-8")
    with pytest.raises(DataError, match=r"rows.json:row 2: expected a list of JSON objects, got int"):
        list(load_rows(str(path), None, None, "train"))


def test_corrupt_parquet_is_a_located_error(tmp_path):
    path = tmp_path / "train.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="train.parquet: cannot read parquet file"):
        list(load_rows(str(path), None, None, "train"))


def test_atomic_outputs_keep_old_files_when_writing_fails(tmp_path):
    out = tmp_path / "out"
    with atomic_outputs(str(out)) as w:
        w.write_jsonl("train.jsonl", [{"a": 1}])
        w.write_jsonl("test.jsonl", [{"b": 2}])
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def rows():
        yield {"a": 10}
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        with atomic_outputs(str(out)) as w:
            w.write_jsonl("test.jsonl", [{"b": 20}])  # fully written, but never committed
            w.write_jsonl("train.jsonl", rows())
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    fresh = tmp_path / "fresh"
    with pytest.raises(RuntimeError):
        with atomic_outputs(str(fresh)) as w:
            w.write_jsonl("train.jsonl", rows())
    assert not fresh.exists()  # the directory this run created is gone again


def test_assign_inputs_by_name_prefix_and_directory(tmp_path):
    sources = {"train": "train", "test": "test", "val": "validation"}
    for name in ("story_train.jsonl", "story-val.jsonl", "x.jsonl", "test-00000-of-00001.parquet"):
        (tmp_path / name).write_text("{}\n")
    by_split, skipped = assign_inputs(
        [str(tmp_path / "story_train.jsonl"), str(tmp_path / "story-val.jsonl"), f"test={tmp_path / 'x.jsonl'}"],
        sources,
    )
    assert by_split == {
        "train": [str(tmp_path / "story_train.jsonl")],
        "test": [str(tmp_path / "x.jsonl")],
        "val": [str(tmp_path / "story-val.jsonl")],
    }
    with pytest.raises(DataError, match="cannot tell which source split"):
        assign_inputs([str(tmp_path / "x.jsonl")], sources)
    with pytest.raises(DataError, match="reads no split 'dev'"):
        assign_inputs([f"dev={tmp_path / 'x.jsonl'}"], sources)
    (tmp_path / "train_test.jsonl").write_text("{}\n")
    with pytest.raises(DataError, match="several source splits"):
        assign_inputs([str(tmp_path / "train_test.jsonl")], sources)

    # Single-source script: an explicit file is always that source; in a directory, other splits are skipped.
    by_split, skipped = assign_inputs([str(tmp_path / "story_train.jsonl")], {"test": "test"})
    assert by_split == {"test": [str(tmp_path / "story_train.jsonl")]}
    sub = tmp_path / "snap"
    sub.mkdir()
    (sub / "dev-0.parquet").write_text("")
    (sub / "test-0.parquet").write_text("")
    (sub / "notes.txt").write_text("")
    by_split, skipped = assign_inputs([str(sub)], {"test": "test"})
    assert by_split == {"test": [str(sub / "test-0.parquet")]} and skipped == [str(sub / "dev-0.parquet")]


def test_summary_line():
    s = Summary("demo", read=10, unused=2, written={"train": 5, "test": 1})
    s.filter("b_reason")
    s.filter("a_reason")
    s.filter("a_reason")
    assert s.line() == "demo: read 10 rows, wrote train=5 test=1, filtered 3 (a_reason: 2, b_reason: 1), unused 2"
    assert Summary("demo").line() == "demo: read 0 rows, wrote nothing, filtered 0"


def test_wrong_letter_stays_within_options():
    rng = random.Random(0)
    assert {draw_wrong_letter(rng, 3, 1) for _ in range(200)} == {"A", "C"}
    assert {draw_wrong_letter(rng, 2, 0) for _ in range(20)} == {"B"}
    assert fraction_floor(70, 0.1) == 7 and fraction_floor(10, 0.7) == 7 and fraction_floor(9, 0.8) == 7


def fields(**over) -> sp.StoryFields:
    base = dict(
        story_text="Story.",
        next_chapter_header="Chapter 2",
        next_chapter_synopsis="Syn.",
        prior_plot_summary=None,
        high_level_plot_summary=None,
        character_sheets=None,
        last_n_chapters=3,
    )
    base.update(over)
    return sp.StoryFields(**base)


def test_story_preamble_variants():
    text = sp.policy_messages(fields())[1]["content"]
    assert text.startswith(
        "Instructions: You will be given the last 3 chapters of the story and a brief synopsis of what should happen "
        "in the next chapter. You will also be given a chapter header"
    )
    assert "\n### Previous 3 Chapters: ###\nStory.\n" in text
    text = sp.policy_messages(fields(last_n_chapters=-1, next_chapter_synopsis=None))[1]["content"]
    assert text.startswith("Instructions: You will be given the entire story. You will also be given")
    assert "### Prior Story: ###\nStory." in text and "Synopsis" not in text
    text = sp.policy_messages(fields(last_n_chapters=None, next_chapter_synopsis=None))[1]["content"]
    assert text.startswith(sp.PREAMBLE_NOTHING_GIVEN + "\n\n\n\n\n\n### Next Chapter Header: ###\nChapter 2\n")
    assert "Story." not in text


def test_generator_prompts_share_the_policy_prefix():
    f = fields(character_sheets={"A": "a"}, prior_plot_summary="p")
    policy = sp.policy_messages(f)
    for plan in ("  The plan.  ", None, "   "):
        rebuilt = sp.generator_messages_from_policy_messages(policy, plan, "GOLD")
        assert rebuilt == sp.generator_messages(f, plan, "GOLD")
    with_plan = sp.generator_messages(f, " The plan. ", "GOLD")
    assert with_plan[1]["content"].endswith(
        "\n### Next Chapter Header: ###\nChapter 2\n\n"
        "\n### Detailed Plan for the Next Chapter ###\nThe plan.\n\n"
        "### Instructions: ###\n" + sp.GENERATOR_WITH_PLAN_INSTRUCTION
    )
    assert with_plan[2] == {"role": "assistant", "content": "GOLD"}
    baseline = sp.generator_messages(f, None, "GOLD")[1]["content"]
    assert baseline.endswith("Chapter 2\n\n### Instructions: ###\n" + sp.BASELINE_INSTRUCTION)
    empty_plan = sp.generator_messages(f, "  ", "GOLD")[1]["content"]  # no plan section, the with-plan instruction
    assert empty_plan.endswith("Chapter 2\n\n### Instructions: ###\n" + sp.GENERATOR_WITH_PLAN_INSTRUCTION)


# ---------------------------------------------------------------------------------------------------------------
# the hub path, with a stand-in `datasets` module (no network in tests)


class FakeDatasets(types.ModuleType):
    def __init__(self, tables: dict[tuple[str, str | None, str], list[dict]]) -> None:
        super().__init__("datasets")
        self.tables = tables
        self.calls: list[tuple[str, str | None, str]] = []

    def load_dataset(self, name, config=None, split=None):
        self.calls.append((name, config, split))
        if (name, config, split) not in self.tables:
            raise FileNotFoundError(f"no {name}/{config}/{split}")
        return self.tables[(name, config, split)]


def test_load_rows_from_the_hub(monkeypatch):
    fake = FakeDatasets({("org/set", "main", "train"): [{"q": 1}, {"q": 2}], ("org/set", "main", "test"): []})
    monkeypatch.setitem(sys.modules, "datasets", fake)
    assert list(load_rows(None, "org/set", "main", "train")) == [
        ("hf://org/set/main/train:row 1", {"q": 1}),
        ("hf://org/set/main/train:row 2", {"q": 2}),
    ]
    with pytest.raises(DataError, match=r"hf://org/set/main/test: empty hub split"):
        list(load_rows(None, "org/set", "main", "test"))
    with pytest.raises(DataError, match=r"cannot load from the Hugging Face hub .*pass --input FILE"):
        list(load_rows(None, "org/other", None, "train"))
    with pytest.raises(DataError, match="no hub copy"):
        list(load_rows(None, None, None, "train"))


def load_script(name: str, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script prepends the repo root; undo it after the test
    return runpy.run_path(str(REPO / "setup_data" / f"{name}.py"), run_name=f"setup_data_{name}")


def test_hendrycks_math_reads_every_hub_config(monkeypatch, tmp_path, capsys):
    script = load_script("hendrycks_math", monkeypatch)
    tables = {}
    for config in script["HUB_CONFIGS"]:
        category = config.replace("_", " ").title()
        rows = [
            {"problem": f"{config} {i}", "level": "Level 1", "type": category, "solution": f"\\boxed{{{i}}}"}
            for i in range(3)
        ]
        tables[("EleutherAI/hendrycks_math", config, "train")] = rows
    fake = FakeDatasets(tables)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    assert script["main"](["--output-dir", str(tmp_path / "out"), "--test-per-category", "1", "--quiet"]) == 0
    assert [c[1] for c in fake.calls] == list(script["HUB_CONFIGS"])
    assert capsys.readouterr().out == "hendrycks_math: read 21 rows, wrote train=14 test=7, filtered 0\n"


def test_mmlu_pro_reads_both_hub_splits(monkeypatch, tmp_path, capsys):
    script = load_script("mmlu_pro_sycophancy", monkeypatch)
    row = {"question": "q?", "options": ["a", "b", "c"], "answer_index": 2, "answer": "C", "category": "law"}
    fake = FakeDatasets(
        {
            ("TIGER-Lab/MMLU-Pro", None, "test"): [dict(row, question_id=i) for i in range(10)],
            ("TIGER-Lab/MMLU-Pro", None, "validation"): [dict(row, question_id=99)],
        }
    )
    monkeypatch.setitem(sys.modules, "datasets", fake)
    assert script["main"](["--output-dir", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out == "mmlu_pro_sycophancy: read 11 rows, wrote train=9 test=1 dev=1, filtered 0\n"
    labels = [
        json.loads(json.loads(line)["label"]) for line in (tmp_path / "out" / "dev.jsonl").read_text().splitlines()
    ]
    assert labels[0]["question_id"] == 99 and labels[0]["ground_truth"] in {"A", "B"}
