"""Evaluation outputs written by two processes at once (real processes): no mixed files, no silent replacement."""

import json
import os
import subprocess
import sys
import time

import pytest

from openrlhf_classmate.eval.common import EvaluationError, hold_output_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRITER = """
import sys
from openrlhf_classmate.eval.common import write_jsonl
write_jsonl(sys.argv[1], ({"writer": sys.argv[2], "i": i} for i in range(100_000)))
"""


def test_two_writers_of_one_file_leave_one_writers_whole_file(tmp_path):
    # both wrote through path + ".tmp": the file that remained held rows of both (and one writer crashed)
    path = tmp_path / "samples.jsonl"
    env = {**os.environ, "PYTHONPATH": REPO}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), name], env=env, stderr=subprocess.PIPE,
                              text=True) for name in ("a", "b")]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 100_000 and len({r["writer"] for r in rows}) == 1
    assert [r["i"] for r in rows] == list(range(100_000))
    assert sorted(os.listdir(tmp_path)) == ["samples.jsonl"]  # no temporary file left behind


HOLDER = """
import sys, time
from openrlhf_classmate.eval.common import hold_output_dir
lock = hold_output_dir(sys.argv[1])
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_evaluation_into_a_held_folder_is_refused_in_one_line(tmp_path):
    out = tmp_path / "eval_sweep"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], env={**os.environ, "PYTHONPATH": REPO},
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(EvaluationError, match=rf"^--output-dir {out}: another evaluation \(pid {holder.pid}\) "
                                                  r"is writing there; wait for it to finish or give another"):
            hold_output_dir(str(out))
    finally:
        holder.kill()
        holder.wait()
    deadline = time.time() + 10
    while True:  # the lock goes with its process
        try:
            hold_output_dir(str(out)).close()
            break
        except EvaluationError:
            assert time.time() < deadline
            time.sleep(0.1)
