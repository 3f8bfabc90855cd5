"""``python -m openrlhf_classmate.cli.convert_checkpoint``: a DeepSpeed ZeRO checkpoint of a run -> a Hugging Face
model directory.

    python -m openrlhf_classmate.cli.convert_checkpoint CKPT_DIR OUT_DIR [--tag TAG] [--base-model PATH]
        [--dtype bf16|fp16|fp32] [--no-verify] [--overwrite] [--push-to-hub REPO [--hub-branch B] [--hub-main]]

Steps:

1. ``CKPT_DIR`` is the run's ``--ckpt.path`` (holding ``_actor/``) or the ``_actor`` folder itself; ``TAG`` defaults
   to the checkpoint's ``latest`` file (e.g. ``global_step20``).
2. DeepSpeed's ``zero_to_fp32`` (``get_fp32_state_dict_from_zero_checkpoint``, ZeRO-1/2/3) rebuilds the fp32 master
   weights; a wrapper prefix (``module.``) is removed when the keys carry one.
3. The model is built from the base model's config, loaded with those weights, cast to ``--dtype`` (default bf16,
   as OpenRLHF's own HF saves) and written with ``save_pretrained`` (safetensors); the generation config, the
   tokenizer files and the chat template are copied from the base model.
4. Verification (unless ``--no-verify``): the written directory is loaded with ``AutoModelForCausalLM`` /
   ``AutoTokenizer``; every weight must equal the checkpoint's weight cast to ``--dtype``, and the logits of a short
   forward pass must match those of a model built from the checkpoint state dict (with the same rounding). The
   logit difference to the unrounded fp32 weights is reported too.
5. Everything is written to a temporary sibling of ``OUT_DIR`` and renamed into place only after verification, so
   ``OUT_DIR`` never holds a half-written model. An existing ``OUT_DIR`` is an error unless ``--overwrite``, which
   replaces only an earlier conversion's folder (flat, with ``config.json``) or an empty one; an
   ``OUT_DIR`` that is, contains or lies inside the checkpoint folder (``--ckpt.path`` or its ``_actor``) or the
   base model folder is always an error (replacing it would delete the input).
6. ``--push-to-hub REPO``: ``HfApi.create_repo`` (exist_ok), ``create_branch`` (one branch per checkpoint, named
   after the tag unless ``--hub-branch``) and ``upload_folder`` to that branch; ``--hub-main`` also uploads to
   ``main``. The token comes from the usual huggingface_hub sources (``HF_TOKEN``, ``hf auth login``).

Base model (config, generation config, tokenizer, chat template), first found of: ``--base-model`` (a local
directory or a hub id); ``<ckpt.path>/<TAG>_hf`` (written by ``--ckpt.save_hf`` at the same step);
the newest ``<ckpt.path>/global_step*_hf``; ``<ckpt.path>/../final`` (the train_scripts layout, ``--ckpt.output_dir``).
The base model's *weights* are never read.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import sys
from dataclasses import asdict, dataclass, field

import openrlhf_classmate  # noqa: F401  (CPU shims before deepspeed / openrlhf imports)
from openrlhf_classmate.writable import replace_folder, write_problem

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# files of the base model copied next to the weights (tokenizer, chat template, generation config)
COPY_PATTERNS = (
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
)
WRAPPER_PREFIXES = ("module.", "model.", "module.model.", "_orig_mod.")
VERIFY_TEXT = "Verify the converted model: 1 + 2 = ? Think step by step."


class ConversionError(RuntimeError):
    """A clear, user-facing conversion failure (missing checkpoint, tag or base model; failed verification)."""


@dataclass
class ConversionReport:
    checkpoint: str
    tag: str
    base_model: str
    output_dir: str
    dtype: str
    num_tensors: int = 0
    num_parameters: int = 0
    verified: bool = False
    max_weight_diff: float | None = None
    max_logit_diff: float | None = None
    max_logit_diff_vs_fp32: float | None = None
    pushed: list[str] = field(default_factory=list)


# ── locating things ──────────────────────────────────────────────────────────────────────────────────────────────


def _tags(root: str) -> list[str]:
    tags = [os.path.basename(p) for p in glob.glob(os.path.join(root, "*")) if os.path.isdir(p)
            and glob.glob(os.path.join(p, "*model_states.pt"))]
    return sorted(tags, key=_step_key)


def _step_key(name: str) -> tuple[int, str]:
    m = re.search(r"(\d+)$", name.removesuffix("_hf"))
    return (int(m.group(1)) if m else -1, name)


def find_checkpoint_root(ckpt_dir: str) -> str:
    """The DeepSpeed checkpoint folder (holding ``latest`` / ``global_stepN/``): ``ckpt_dir`` or ``ckpt_dir/_actor``."""
    if not os.path.isdir(ckpt_dir):
        raise ConversionError(f"checkpoint directory {ckpt_dir} does not exist")
    for candidate in (ckpt_dir, os.path.join(ckpt_dir, "_actor")):
        if os.path.isfile(os.path.join(candidate, "latest")) or _tags(candidate):
            return os.path.abspath(candidate)
    raise ConversionError(
        f"{ckpt_dir} holds no DeepSpeed checkpoint: expected a 'latest' file or global_stepN/ folders with "
        "*model_states.pt, in it or in its _actor/ folder (pass the run's --ckpt.path or its _actor folder)"
    )


def _is_tag_name(tag: str) -> bool:
    """``tag`` (from ``latest`` or ``--tag``) can name a tag folder of the checkpoint: one printable path component
    (no NUL byte, no separator, not ``.`` / ``..``, not empty)."""
    return bool(tag) and tag not in (".", "..") and "/" not in tag and os.sep not in tag and tag.isprintable()


def resolve_tag(root: str, tag: str | None) -> str:
    available = _tags(root)
    listing = ", ".join(available) if available else "none"
    if tag is None:
        latest = os.path.join(root, "latest")
        if not os.path.isfile(latest):
            raise ConversionError(f"{root} has no 'latest' file; pass --tag (available tags: {listing})")
        try:
            with open(latest, encoding="utf-8") as f:
                tag = f.read().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConversionError(f"the 'latest' file of {root} cannot be read as a tag name ({type(e).__name__}: "
                                  f"{e}; DeepSpeed writes UTF-8 text): pass --tag (available tags: {listing})") from None
        if not _is_tag_name(tag):
            raise ConversionError(f"the 'latest' file of {root} names {tag!r}, not a checkpoint tag (the name of one "
                                  f"folder in it, such as global_step20): pass --tag (available tags: {listing})")
    elif not _is_tag_name(tag):
        raise ConversionError(f"--tag {tag!r} is not a checkpoint tag (the name of one folder of the checkpoint, such "
                              f"as global_step20); available tags: {listing}")
    if not glob.glob(os.path.join(glob.escape(root), glob.escape(tag), "*model_states.pt")):
        raise ConversionError(f"checkpoint tag {tag!r} not found in {root} (available tags: {listing})")
    from openrlhf_classmate.integration.training.checkpoints import inspect_tag

    problem = inspect_tag(os.path.join(root, tag))
    if problem:
        others = [t for t in available if t != tag and inspect_tag(os.path.join(root, t)) is None]
        hint = f"; complete tags: {', '.join(others)} (--tag)" if others else ""
        raise ConversionError(f"checkpoint tag {tag!r} is incomplete: {problem}{hint}")
    return tag


def find_base_model(root: str, tag: str, base_model: str | None) -> str:
    """The model whose config / tokenizer / chat template the output gets (see the module docstring)."""
    if base_model:
        if os.path.isdir(base_model):
            if not os.path.isfile(os.path.join(base_model, "config.json")):
                raise ConversionError(f"base model {base_model} has no config.json")
            return os.path.abspath(base_model)
        if os.path.exists(base_model) or base_model.startswith((".", "/", "~")) or base_model.count("/") != 1:
            raise ConversionError(f"base model {base_model} does not exist (neither a local directory nor a hub id)")
        return base_model  # a hub id: transformers downloads config and tokenizer
    ckpt_path = os.path.dirname(root) if os.path.basename(root) == "_actor" else root
    candidates = [os.path.join(ckpt_path, f"{tag}_hf")]
    candidates += sorted(glob.glob(os.path.join(ckpt_path, "*_hf")), key=lambda p: _step_key(os.path.basename(p)),
                         reverse=True)
    candidates.append(os.path.join(os.path.dirname(ckpt_path), "final"))
    for candidate in candidates:
        if os.path.isfile(os.path.join(candidate, "config.json")):
            return os.path.abspath(candidate)
    raise ConversionError(
        "no base model found for the config and tokenizer (looked for " + ", ".join(candidates[:1] + candidates[-1:])
        + "): pass --base-model, e.g. the run's --actor.model_name_or_path"
    )


def check_output_outside_inputs(out_dir: str, root: str, base: str) -> None:
    """ConversionError when ``out_dir`` is, contains or lies inside the checkpoint folder (``root`` and, for an
    ``_actor`` folder, the run's ``--ckpt.path`` above it) or the local base model folder: installing the output
    replaces ``out_dir`` as a whole, so it would delete the input (paths compared after resolving symlinks)."""
    inputs = [("checkpoint folder", root)]
    if os.path.basename(os.path.normpath(root)) == "_actor":
        inputs.append(("checkpoint folder", os.path.dirname(os.path.normpath(root))))
    if os.path.isdir(base):
        inputs.append(("base model folder", base))
    out = os.path.realpath(out_dir)
    overlaps = []
    for what, path in inputs:
        real = os.path.realpath(path)
        common = os.path.commonpath([out, real])
        if common in (out, real):
            overlaps.append(("is" if out == real else "lies inside" if common == real else "contains", what, path))
    if overlaps:
        relation, what, path = min(overlaps, key=lambda o: o[0] != "is")  # the exact match names the folder best
        raise ConversionError(f"OUT_DIR {out_dir} {relation} the {what} {path} this conversion reads; writing it "
                              "would delete that input: choose an OUT_DIR outside it")


# ── conversion ───────────────────────────────────────────────────────────────────────────────────────────────────


def load_fp32_state_dict(root: str, tag: str) -> dict:
    """DeepSpeed's zero_to_fp32 reconstruction of the fp32 weights (any ZeRO stage)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    try:
        return get_fp32_state_dict_from_zero_checkpoint(root, tag=tag)
    except Exception as e:  # noqa: BLE001  (torch.load / pickle / DeepSpeed raise many types on bad files)
        raise ConversionError(f"cannot rebuild the weights of {os.path.join(root, tag)} with DeepSpeed's zero_to_fp32 "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''})") from None


def _dtype(name: str):
    import torch

    return getattr(torch, DTYPES[name])


def _strip_prefix(state_dict: dict, expected: set[str]) -> dict:
    """Drop a wrapper prefix (``module.``, ...) when that makes the keys match the model's."""
    best, best_hits = "", len(expected & set(state_dict))
    for prefix in WRAPPER_PREFIXES:
        stripped = {k[len(prefix):] for k in state_dict if k.startswith(prefix)}
        hits = len(expected & stripped)
        if hits > best_hits:
            best, best_hits = prefix, hits
    if not best:
        return state_dict
    return {k[len(best):] if k.startswith(best) else k: v for k, v in state_dict.items()}


def _check_base_config(base_model: str) -> None:
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(base_model, trust_remote_code=True)
    except Exception as e:  # noqa: BLE001  (a broken config.json, an unknown architecture, a hub id offline)
        raise ConversionError(f"base model {base_model}: cannot build a model from its config ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:300] if str(e) else ''})") from None


def build_model(base_model: str, state_dict: dict):
    """A float32 model with the base model's architecture and the checkpoint's weights (strict, ties allowed)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(base_model, trust_remote_code=True)
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=True, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001  (a broken config.json, an unknown architecture, a hub id offline)
        raise ConversionError(f"base model {base_model}: cannot build a model from its config ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:300] if str(e) else ''})") from None
    expected = set(model.state_dict())
    state_dict = _strip_prefix(state_dict, expected)
    unexpected = sorted(set(state_dict) - expected)
    if unexpected:
        raise ConversionError(
            f"the checkpoint has {len(unexpected)} weight(s) the base model's architecture lacks (e.g. {unexpected[:3]}); "
            f"is --base-model {base_model} the model this run trained?"
        )
    shapes = [(k, tuple(v.shape), tuple(model.state_dict()[k].shape)) for k, v in state_dict.items()
              if tuple(v.shape) != tuple(model.state_dict()[k].shape)]
    if shapes:
        raise ConversionError(f"shape mismatch between checkpoint and base model config, e.g. {shapes[:3]}")
    missing = set(model.load_state_dict(state_dict, strict=False).missing_keys)
    model.tie_weights()
    loaded_ptrs = {p.data_ptr() for k, p in model.state_dict().items() if k in state_dict}
    untied = sorted(k for k in missing if model.state_dict()[k].data_ptr() not in loaded_ptrs)
    if untied:
        raise ConversionError(f"the checkpoint lacks {len(untied)} weight(s) of the model, e.g. {untied[:3]}")
    model.eval()
    return model


def _copy_base_files(base_model: str, out: str) -> None:
    if os.path.isdir(base_model):
        for pattern in COPY_PATTERNS:
            for path in glob.glob(os.path.join(base_model, pattern)):
                if os.path.isfile(path):
                    shutil.copy2(path, os.path.join(out, os.path.basename(path)))
        return
    from transformers import AutoTokenizer, GenerationConfig

    AutoTokenizer.from_pretrained(base_model, trust_remote_code=True).save_pretrained(out)
    try:
        GenerationConfig.from_pretrained(base_model).save_pretrained(out)
    except OSError:
        pass  # no generation_config.json on the hub: keep the one save_pretrained derived from the config


def _verify_ids(out: str) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    ids: list[int] = []
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": VERIFY_TEXT}], add_generation_prompt=True,
                                             tokenize=False)
        ids = list(tokenizer.encode(text, add_special_tokens=False))
    if not ids:
        ids = list(tokenizer.encode(VERIFY_TEXT))
    return (ids or [0, 1, 2])[:64]


def _logits(model, ids: list[int]):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits.float()


def convert(
    ckpt_dir: str,
    out_dir: str,
    tag: str | None = None,
    base_model: str | None = None,
    dtype: str = "bf16",
    verify: bool = True,
    overwrite: bool = False,
    max_shard_size: str = "5GB",
    log=print,
) -> ConversionReport:
    """Convert (and verify) one checkpoint; see the module docstring."""
    if dtype not in DTYPES:
        raise ConversionError(f"--dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    out_dir = os.path.abspath(out_dir)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ConversionError(f"OUT_DIR {out_dir} is a file, not a model directory")
    problem = write_problem(os.path.dirname(out_dir))  # where the output is assembled and renamed into place
    if problem:
        raise ConversionError(f"OUT_DIR {out_dir} cannot be created: {os.path.dirname(out_dir)} {problem}")
    root = find_checkpoint_root(ckpt_dir)
    tag = resolve_tag(root, tag)
    base = find_base_model(root, tag, base_model)
    check_output_outside_inputs(out_dir, root, base)  # before the --overwrite check: never suggest replacing an input
    if os.path.exists(out_dir) and not overwrite:
        raise ConversionError(f"{out_dir} exists; pass --overwrite to replace it")
    if os.path.isdir(out_dir):
        check_replaceable(out_dir)
    _check_base_config(base)  # before the (long) weight reconstruction
    report = ConversionReport(checkpoint=root, tag=tag, base_model=base, output_dir=out_dir, dtype=dtype)
    log(f"converting {root} tag {tag} (base model {base}) -> {out_dir} [{dtype}]")

    state_dict = load_fp32_state_dict(root, tag)
    report.num_tensors = len(state_dict)
    model = build_model(base, state_dict)
    del state_dict
    report.num_parameters = sum(p.numel() for p in model.parameters())
    ids = logits_fp32 = None
    if verify:
        try:
            ids = _verify_ids(base)
        except Exception as e:  # noqa: BLE001  (no tokenizer files, a broken tokenizer.json, ...)
            raise ConversionError(f"base model {base}: cannot load its tokenizer ({type(e).__name__}: "
                                  f"{str(e).splitlines()[0][:300] if str(e) else ''})") from None
        logits_fp32 = _logits(model, ids)  # the checkpoint's fp32 master weights, before any rounding

    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(out_dir)}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.to(_dtype(dtype))
        model.save_pretrained(tmp, safe_serialization=True, max_shard_size=max_shard_size)
        _copy_base_files(base, tmp)  # after save_pretrained, which writes its own generation_config.json
        if verify:
            _verify(model, tmp, ids, logits_fp32, report, log)
        replace_folder(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"wrote {out_dir}")
    return report


def _verify(model, out: str, ids: list[int], logits_fp32, report: ConversionReport, log) -> None:
    """Load the written directory and compare it with the checkpoint (see the module docstring). ``model`` holds the
    checkpoint's weights cast to the output dtype."""
    import torch
    from transformers import AutoModelForCausalLM

    if _verify_ids(out) != ids:
        raise ConversionError("verification: the written tokenizer encodes the test prompt differently from the base "
                              "model's tokenizer")
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, trust_remote_code=True).eval()
    loaded_sd, expected = loaded.state_dict(), model.state_dict()
    missing = sorted(set(expected) - set(loaded_sd))
    if missing:
        raise ConversionError(f"verification: the written model lacks {missing[:3]}")
    weight_diff = max(float((loaded_sd[k] - v.float()).abs().max()) for k, v in expected.items())
    reference = model.float()  # exact up-cast: the rounded checkpoint weights, computed in fp32 like `loaded`
    ref_logits, out_logits = _logits(reference, ids), _logits(loaded, ids)
    logit_diff = float((ref_logits - out_logits).abs().max())
    report.max_weight_diff, report.max_logit_diff = weight_diff, logit_diff
    report.max_logit_diff_vs_fp32 = float((logits_fp32 - out_logits).abs().max())
    if weight_diff > 0 or logit_diff > 1e-4 * max(1.0, float(ref_logits.abs().max())):
        raise ConversionError(
            f"verification failed: max |weight diff| {weight_diff:.3g}, max |logit diff| {logit_diff:.3g} "
            f"(over {len(ids)} tokens) between the written model and the checkpoint"
        )
    report.verified = True
    log(f"verified: {len(expected)} tensors equal the checkpoint's ({report.dtype}); logits of a {len(ids)}-token "
        f"forward pass match (max |diff| {logit_diff:.2e}; {report.max_logit_diff_vs_fp32:.2e} vs the unrounded "
        "fp32 weights)")


def check_replaceable(out_dir: str) -> None:
    """``--overwrite`` replaces an earlier conversion's folder (flat, with its ``config.json``) or an empty one, never
    a folder of models or anything else a mistyped OUT_DIR may name."""
    names = os.listdir(out_dir)
    folders = sorted(n + "/" for n in names if os.path.isdir(os.path.join(out_dir, n)))
    if not folders and (not names or "config.json" in names):
        return
    what = (f"holds folders ({', '.join(folders[:3])}{', ...' if len(folders) > 3 else ''})" if folders
            else "holds files but")
    what += "" if "config.json" in names else (" and no config.json" if folders else " no config.json")
    raise ConversionError(f"OUT_DIR {out_dir} {what}: --overwrite replaces a converted model's folder, not a folder "
                          "of models or other files; name the model's own folder")


# ── hub ──────────────────────────────────────────────────────────────────────────────────────────────────────────


def push_to_hub(folder: str, repo_id: str, branch: str, *, private: bool = False, also_main: bool = False,
                token: str | None = None) -> list[str]:
    """Upload ``folder`` to branch ``branch`` of model repo ``repo_id`` (created if needed); returns the revisions."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True)
    revisions = [branch]
    if branch != "main":
        api.create_branch(repo_id=repo_id, branch=branch, repo_type="model", exist_ok=True)
    if also_main and branch != "main":
        revisions.append("main")
    for revision in revisions:
        api.upload_folder(repo_id=repo_id, folder_path=folder, repo_type="model", revision=revision,
                          commit_message=f"Upload {os.path.basename(folder.rstrip('/'))} ({branch})")
    return revisions


# ── command line ─────────────────────────────────────────────────────────────────────────────────────────────────


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m openrlhf_classmate.cli.convert_checkpoint",
        description="Convert a DeepSpeed ZeRO checkpoint of a run to a verified Hugging Face model directory.",
    )
    p.add_argument("ckpt_dir", help="the run's --ckpt.path (holding _actor/) or the _actor folder")
    p.add_argument("out_dir", help="output model directory (written atomically)")
    p.add_argument("--tag", default=None, help="checkpoint tag, e.g. global_step20 (default: the 'latest' file)")
    p.add_argument("--base-model", default=None,
                   help="model for config / tokenizer / chat template (default: <ckpt.path>/<TAG>_hf, the newest "
                        "<ckpt.path>/global_step*_hf, or <ckpt.path>/../final)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="weight dtype of the output (default bf16)")
    p.add_argument("--no-verify", action="store_true", help="skip the load-and-compare verification")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR")
    p.add_argument("--max-shard-size", default="5GB", help="safetensors shard size (default 5GB)")
    p.add_argument("--push-to-hub", metavar="REPO", default=None, help="upload the result to this model repo")
    p.add_argument("--hub-branch", default=None, help="branch to upload to (default: the tag, e.g. global_step20)")
    p.add_argument("--hub-main", action="store_true", help="also upload to the main branch")
    p.add_argument("--private", action="store_true", help="create the hub repo as private")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        report = convert(args.ckpt_dir, args.out_dir, tag=args.tag, base_model=args.base_model, dtype=args.dtype,
                         verify=not args.no_verify, overwrite=args.overwrite, max_shard_size=args.max_shard_size)
        if args.push_to_hub:
            report.pushed = push_to_hub(report.output_dir, args.push_to_hub, args.hub_branch or report.tag,
                                        private=args.private, also_main=args.hub_main)
            print(f"pushed to https://huggingface.co/{args.push_to_hub} ({', '.join(report.pushed)})")
    except ConversionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(report), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
