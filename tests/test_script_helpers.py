"""``openrlhf_classmate.script_helpers``, the programs train_scripts/lib.sh runs, against a real local HTTP server."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys

import pytest

from openrlhf_classmate.script_helpers import first_model_id, http_ok, main, ray_runtime_env
from openrlhf_classmate.testing.servers import QuietHandler, serve_in_thread

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Handler(QuietHandler):
    def do_GET(self):  # noqa: N802
        if self.path.startswith("/v1/keyed/") and self.headers.get("Authorization") != "Bearer s3cret":
            self.reply(401, {"error": "no key"})
        elif self.path in ("/v1/models", "/v1/keyed/models"):
            self.reply(200, {"object": "list", "data": [{"id": "judge-a"}, {"id": "judge-b"}]})
        elif self.path == "/v1/empty/models":
            self.reply(200, {"data": []})
        else:
            self.reply(404, b"nope")


@pytest.fixture
def server():
    with serve_in_thread(http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)) as httpd:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"


def test_http_ok_answers_200_and_refuses_404_and_a_closed_port(server):
    assert http_ok(server + "/v1/models")
    assert not http_ok(server + "/missing")
    port = server.rsplit(":", 1)[1]
    assert not http_ok(server.replace(port, "1") + "/v1/models", timeout_s=1)


def test_first_model_id_reads_the_first_served_model(server, capsys):
    assert first_model_id(server + "/v1/") == "judge-a"
    assert main(["first-model-id", server + "/v1/empty"]) == 1
    assert "cannot read the served model name from" in capsys.readouterr().err


def test_a_server_that_needs_a_key_gets_the_one_in_the_named_variable(server, monkeypatch, capsys):
    # a hosted judge answers 401 without its key: the helpers send the key of the variable named (never the key itself
    # as an argument); without it the server is not ready and its model name is not read
    monkeypatch.setenv("MY_JUDGE_KEY", "s3cret")
    keyed = server + "/v1/keyed"
    assert not http_ok(keyed + "/models") and http_ok(keyed + "/models", api_key_env="MY_JUDGE_KEY")
    assert not http_ok(keyed + "/models", api_key_env="UNSET_KEY_VARIABLE")
    assert main(["http-ok", keyed + "/models", "MY_JUDGE_KEY"]) == 0 and main(["http-ok", keyed + "/models"]) == 1
    assert main(["first-model-id", keyed, "MY_JUDGE_KEY"]) == 0 and capsys.readouterr().out == "judge-a\n"
    assert main(["first-model-id", keyed]) == 1 and "HTTP Error 401" in capsys.readouterr().err


def test_ray_runtime_env_keeps_the_listed_variables_once():
    env = ray_runtime_env("/repo", ["HF_HOME", "MISSING", "HF_HOME", "MY_VAR"], {"HF_HOME": "/hf", "MY_VAR": "x",
                                                                                 "PATH": "/bin"})
    assert env == {"working_dir": "/repo", "excludes": [".venv/", ".git/", "/runs/", "/outputs/", "/data/",
                                                        "*.safetensors", "*.pt"],
                   "env_vars": {"HF_HOME": "/hf", "MY_VAR": "x"}}


def test_the_ray_job_upload_keeps_the_package_and_drops_the_repositorys_data():
    # Ray's own reading of the excludes (gitignore lines): a bare "data/" dropped openrlhf_classmate/data/ too, and the
    # job's driver then found no openrlhf_classmate.data where the package is not installed
    from pathlib import Path

    from ray._private.runtime_env.packaging import _get_excludes

    excluded = _get_excludes(Path(REPO), ray_runtime_env(REPO, [])["excludes"])
    for kept in ("openrlhf_classmate/data/io.py", "openrlhf_classmate/cli/train_ppo_ray.py", "configs/warmup.yaml"):
        assert not excluded(Path(REPO, kept)), kept
    for dropped in ("data/gsm8k/train.jsonl", "runs/warmup/final/config.json", "outputs/x.json", ".venv/bin/python",
                    "openrlhf_classmate/model.safetensors"):
        assert excluded(Path(REPO, dropped)), dropped


def test_the_module_runs_as_lib_sh_calls_it(server):
    run = [sys.executable, "-m", "openrlhf_classmate.script_helpers"]
    env = dict(os.environ, PYTHONPATH=REPO, MY_VAR="x")
    out = subprocess.run(run + ["first-model-id", server + "/v1"], env=env, capture_output=True, text=True)
    assert (out.returncode, out.stdout) == (0, "judge-a\n")
    assert subprocess.run(run + ["http-ok", server + "/v1/models"], env=env).returncode == 0
    assert subprocess.run(run + ["http-ok", server + "/missing"], env=env).returncode == 1
    out = subprocess.run(run + ["ray-runtime-env", "/repo", "MY_VAR", "PATH_NOT_SET"], env=env, capture_output=True,
                         text=True)
    assert json.loads(out.stdout)["env_vars"] == {"MY_VAR": "x"}
    assert subprocess.run(run + ["bogus"], env=env, capture_output=True).returncode == 2
