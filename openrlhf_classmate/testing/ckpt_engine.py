"""A real DeepSpeed engine (ZeRO-2, bf16, CPU, world size 1, or more through :func:`on_ranks`) that trains a tiny
network and saves / resumes its checkpoints through the launcher's strategy, for the checkpoint rotation and crash
tests.

It runs as its own process (``python -m openrlhf_classmate.testing.ckpt_engine ...``) because it initialises
``torch.distributed`` and patches ``torch.cuda`` for the CPU, which must not leak into the test process; one JSON
object per line on stdout reports each save (weights, folder listing) and the resume.

    save    DIR --saves 1,2,3 [--max-num N] [--crash-in-save K] [--upstream]
    rotate  SCENARIOS_JSON
    resume  DIR

``save``: train to each step and save tag ``global_step<step>``. ``--crash-in-save K``: the K-th save is killed
(``os._exit``, nothing cleaned up) right after its first file (the model states) is on disk, before the optimizer
states and ``latest``. ``--upstream``: save with upstream's ``DeepspeedStrategy.save_ckpt`` instead of the subclass's
override. ``rotate``: one engine saves, for each scenario ``{"dir", "tags", "max_num", "max_mem", "metrics",
"upstream"}``, the listed tags into its folder and reports the folders left (many rotation cases in one process).

:func:`on_ranks` is the same on several gloo ranks, one process each (``gloo_ranks.run_ranks``): an optional resume,
then saves, as a data-parallel run writes them (one optimizer file per rank).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

CRASH_EXIT = 86


def make_engine(seed: int = 0, world_size: int = 1):
    """(strategy, engine) of a fresh 4-8-1 network, ZeRO-2 bf16 with AdamW, through upstream's ``prepare``; each of
    ``world_size`` ranks trains on a micro-batch of 2."""
    import openrlhf_classmate  # noqa: F401  (CPU shims before openrlhf)
    from openrlhf_classmate.integration.patches import install_cpu_runtime

    install_cpu_runtime()
    import torch

    from openrlhf_classmate.integration.launch.args import parse_args
    from openrlhf_classmate.integration.training.strategy import get_strategy
    from openrlhf_classmate.ports import free_port

    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(free_port()))):
        os.environ.setdefault(name, value)
    args = parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl",
                       "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--ds.zero_stage", "2",
                       "--ds.param_dtype", "bf16", "--train.batch_size", str(2 * world_size), "--train.micro_batch_size", "2",
                       "--rollout.batch_size", "2", "--rollout.micro_batch_size", "2"])
    strategy = get_strategy(args)
    if not torch.distributed.is_initialized():
        strategy.setup_distributed()
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    cfg = {"optim": "adam", "adam": {"lr": 0.05, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0},
           "lr_scheduler": "constant", "lr_warmup_ratio": 0.0, "scheduler_steps": 100, "max_norm": 1.0}
    engine, _, _ = strategy.prepare((net, cfg))
    import gc

    gc.freeze()  # the gc.collect() of every save (upstream's, kept) then skips the ~1 s scan of the imported modules
    return strategy, engine


def train_step(engine) -> None:
    import torch

    x = torch.linspace(-1, 1, 8, dtype=torch.bfloat16).reshape(2, 4)
    loss = (engine(x).float() - 1.0).pow(2).mean()
    engine.backward(loss)
    engine.step()


def weights(engine) -> list[float]:
    return [round(float(v), 6) for p in engine.module.parameters() for v in p.detach().float().flatten()]


def _listing(save_dir: str) -> list[str]:
    return sorted(os.listdir(save_dir)) if os.path.isdir(save_dir) else []


def _crash_after_first_file(engine) -> None:
    save = engine.checkpoint_engine.save

    def save_then_die(state_dict, path):
        save(state_dict, path)
        print(json.dumps({"killed_after": os.path.basename(path), "listing": _listing(os.path.dirname(path))}),
              flush=True)
        os._exit(CRASH_EXIT)

    engine.checkpoint_engine.save = save_then_die


def _save_fn(strategy, upstream: bool):
    from openrlhf.utils.deepspeed import DeepspeedStrategy

    return DeepspeedStrategy.save_ckpt if upstream else type(strategy).save_ckpt


def cmd_save(a) -> None:
    strategy, engine = make_engine()
    save = _save_fn(strategy, a.upstream)
    for k, step in enumerate(int(s) for s in a.saves.split(",")):
        while engine.global_steps < step:
            train_step(engine)
        if a.crash_in_save == k + 1:
            _crash_after_first_file(engine)
        save(strategy, engine, a.dir, f"global_step{step}", a.max_num, 1000, {"data_step": step})
        print(json.dumps({"saved": f"global_step{step}", "global_steps": engine.global_steps,
                          "weights": weights(engine), "listing": _listing(a.dir)}), flush=True)


def cmd_rotate(a) -> None:
    strategy, engine = make_engine()
    for k, sc in enumerate(json.loads(a.scenarios)):
        save = _save_fn(strategy, sc.get("upstream", False))
        metrics = sc.get("metrics") or [None] * len(sc["tags"])
        for tag, metric in zip(sc["tags"], metrics):
            train_step(engine)
            save(strategy, engine, sc["dir"], tag, sc.get("max_num", 3), sc.get("max_mem", 1000), {},
                 metric_value=metric, metric_key=None if metric is None else "score")
        print(json.dumps({"scenario": k, "listing": [d for d in _listing(sc["dir"])
                                                     if os.path.isdir(os.path.join(sc["dir"], d))]}), flush=True)


def cmd_resume(a) -> None:
    from openrlhf_classmate.integration.training.checkpoints import CheckpointError

    strategy, engine = make_engine(seed=1)  # other initial weights: the loaded ones must replace them
    try:
        load_path, states = strategy.load_ckpt(engine, a.dir)
    except CheckpointError as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return
    print(json.dumps({"loaded": load_path and os.path.basename(os.path.dirname(load_path)),
                      "global_steps": engine.global_steps, "data_step": states.get("data_step"),
                      "weights": weights(engine)}), flush=True)


def on_ranks(rank: int, world_size: int, *, save_dir: str, saves: list[int], max_num: int = 3,
             resume: bool = False) -> dict:
    """One rank's part: with ``resume``, load what ``strategy.load_ckpt`` chooses in ``save_dir`` (from other initial
    weights); then train to each step of ``saves`` and save tag ``global_step<step>`` with the subclass's
    ``save_ckpt``. Returns the tag loaded, the weights after the load and at the end, and the folder listing."""
    strategy, engine = make_engine(seed=1 if resume else 0, world_size=world_size)
    out: dict = {"rank": rank}
    if resume:
        load_path, states = strategy.load_ckpt(engine, save_dir)
        out.update(loaded=load_path and os.path.basename(os.path.dirname(load_path)),
                   global_steps=engine.global_steps, data_step=states.get("data_step"), loaded_weights=weights(engine))
    for step in saves:
        while engine.global_steps < step:
            train_step(engine)
        type(strategy).save_ckpt(strategy, engine, save_dir, f"global_step{step}", max_num, 1000, {"data_step": step})
    return {**out, "weights": weights(engine), "listing": _listing(save_dir)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m openrlhf_classmate.testing.ckpt_engine")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("dir")
    s.add_argument("--saves", required=True, help="comma-separated steps to save at, e.g. 1,2,3")
    s.add_argument("--max-num", type=int, default=3)
    s.add_argument("--crash-in-save", type=int, default=0, help="kill the process during this save (1-based)")
    s.add_argument("--upstream", action="store_true", help="upstream's save_ckpt instead of the override")
    sub.add_parser("rotate").add_argument("scenarios", help="JSON list of scenarios")
    sub.add_parser("resume").add_argument("dir")
    a = p.parse_args(argv)
    {"save": cmd_save, "rotate": cmd_rotate, "resume": cmd_resume}[a.cmd](a)


if __name__ == "__main__":
    main(sys.argv[1:])
