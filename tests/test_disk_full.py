"""A full disk during a save: one ``error: no space left on <path>`` line, and ``latest`` still on the last
complete tag. The disk is really full: a 1 MiB tmpfs mounted in a user namespace (``unshare -r -m``), the save is a
real ``torch.save`` and the launcher's real ``main`` reports it (its training replaced by that save)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from openrlhf_classmate.integration.training.disk_full import no_space_message
from openrlhf_classmate.testing.e2e import one_row_world, one_step_argv

REPO = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, os, sys
import torch
from openrlhf_classmate.cli import train_ppo_ray

ckpt, argv = sys.argv[1], json.loads(sys.argv[2])
actor = os.path.join(ckpt, "_actor")
os.makedirs(os.path.join(actor, "global_step1"))
torch.save({"w": torch.zeros(4)}, os.path.join(actor, "global_step1", "mp_rank_00_model_states.pt"))
with open(os.path.join(actor, "latest"), "w") as f:
    f.write("global_step1")

def save_step_2(args):  # the run's next checkpoint: 8 MB into the 1 MiB file system
    os.makedirs(os.path.join(actor, "global_step2"))
    torch.save({"w": torch.zeros(2_000_000)}, os.path.join(actor, "global_step2", "mp_rank_00_model_states.pt"))

train_ppo_ray.run = save_step_2
train_ppo_ray.main(argv)
"""


def _unshare_works() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-r", "-m", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="needs unprivileged user namespaces (unshare -r -m)")
def test_a_full_disk_during_a_save_is_one_line_and_latest_stays_on_the_complete_tag(tmp_path):
    policy, data = one_row_world(str(tmp_path))
    disk = tmp_path / "disk"
    disk.mkdir()
    ckpt = disk / "ckpt"
    argv = one_step_argv(policy, data, str(ckpt), str(disk / "final"))
    mount = f"mount -t tmpfs -o size=1m tmpfs {disk} && exec {sys.executable} -c \"$SCRIPT\" {ckpt} '{json.dumps(argv)}'"
    proc = subprocess.run(["unshare", "-r", "-m", "sh", "-c", mount], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "SCRIPT": SCRIPT})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith(f"error: no space left on {ckpt} (--ckpt.path; 0 MiB free)")
    assert f"{ckpt}/_actor/latest still names global_step1, the last complete checkpoint" in errors[0]


def test_a_failed_write_on_a_disk_with_room_is_not_called_a_full_disk(tmp_path):
    # /dev/full fails the same way (the torch writer drops the errno) while tmp_path has room: not our message
    target = tmp_path / "model.pt"
    target.symlink_to("/dev/full")
    with pytest.raises(RuntimeError) as failed:
        torch.save({"w": torch.zeros(100_000)}, str(target))
    assert no_space_message(failed.value, [("--ckpt.path", str(tmp_path))], str(tmp_path)) is None
    # an ENOSPC anywhere in the chain is a full disk whatever the free space says
    full = OSError(28, "No space left on device")
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = full
    message = no_space_message(wrapped, [("--ckpt.output_dir", str(tmp_path))], None)
    assert message is not None and message.startswith(f"error: no space left on {tmp_path} (--ckpt.output_dir;")
