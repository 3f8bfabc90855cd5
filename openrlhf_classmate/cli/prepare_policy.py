"""``python -m openrlhf_classmate.cli.prepare_policy``: make any Hugging Face causal LM a policy the trainer accepts.

    python -m openrlhf_classmate.cli.prepare_policy MODEL OUT_DIR [--think-open '<think>'] [--think-close '</think>']
        [--overwrite] [--no-verify]
    python -m openrlhf_classmate.cli.prepare_policy MODEL --tag-rate PROMPTS.jsonl [--limit 8] [--samples 4]
        [--temperature 0.7] [--max-new-tokens 512] [--system TEXT] [--responses-out FILE.jsonl]

The trainer splits every response into CoT and answer on the think tags' token ids, so each tag must be one token of
the policy tokenizer (the launcher refuses the model otherwise). Qwen3 has them; Qwen2.5, Llama-3.x and OLMo-2 write
``<think>`` as several pieces. Preparing a model:

1. ``MODEL`` is a local folder (or a hub id where the hub is reachable). Its tokenizer gets each tag that is not one
   token yet as an added token (``special=False``, as Qwen3's: ``decode(..., skip_special_tokens=True)`` keeps the
   tags, so decoded responses and classmate prompts still show them, and the text re-encodes to the same ids).
2. The embeddings grow to the new tokenizer size (``resize_token_embeddings``) unless the model already has spare
   rows past its tokenizer (Qwen2.5 and OLMo-2 pad their tables): the new ids then take spare rows. Each new row
   (the input row, and the output row when the head is not tied to the input embedding) is the mean of the rows of
   the pieces the tag was written in before, so the model starts out reading the tag as it read the pieces. No other
   row and no other weight changes: every other token's logits stay as they were.
3. Model, tokenizer (with its chat template), generation config and ``prepare_policy.json`` (the source, the tags'
   new ids and their pieces, the table sizes) are written to a temporary folder beside ``OUT_DIR``, verified (loaded
   again: the tags are one token each, every weight equals the prepared one) and only then renamed to ``OUT_DIR``.
   An existing ``OUT_DIR`` is refused unless ``--overwrite``, which replaces only an earlier preparation (a folder
   holding ``prepare_policy.json``) or an empty folder; an ``OUT_DIR`` that is, holds or lies inside ``MODEL`` is
   always refused.

A model whose tags are one token each already needs nothing: one line says so, nothing is written, exit 0 (train
``MODEL`` itself).

``--tag-rate PROMPTS.jsonl``: generate ``--samples`` responses for the first ``--limit`` prompts (rows as setup_data
writes them: chat messages or a string under ``--input-key``) and report how many wrote the close tag at all (as
text, in any tokens) and how many closed the think block with its one token, the only responses whose answer the
reward reads (the trainer's own split on token ids; the rest score 0). Run it on the start model and on the
prepared one: a model that never writes the format needs a warm-up first (README "Your own models").
``--system TEXT`` adds a system message for the generation (to try a format instruction); ``--responses-out``
writes every response as an SFT row (the row's own messages, without ``--system``) with its tag flags.

Errors are one line ``error: ...`` on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import openrlhf_classmate  # noqa: F401  (CPU shims before transformers / vllm imports)
from openrlhf_classmate.writable import replace_folder

DEFAULT_OPEN, DEFAULT_CLOSE = "<think>", "</think>"
NOTE = "prepare_policy.json"
# files of a local source folder that save_pretrained does not write but a model folder should keep (its license)
KEPT_FILES = ("LICENSE", "LICENSE.txt", "LICENSE.md", "NOTICE", "NOTICE.txt", "USE_POLICY.md", "README.md")


class PrepareError(ValueError):
    """One line for the user (the CLI prints ``error: <message>``)."""


def command_line(model: str, out: str = "OUT", think_open: str = DEFAULT_OPEN, think_close: str = DEFAULT_CLOSE
                 ) -> str:
    """The command that prepares ``model`` (named by the launcher's refusal); tag flags only where not the default."""
    words = ["python", "-m", "openrlhf_classmate.cli.prepare_policy", model, out]
    if think_open != DEFAULT_OPEN:
        words += ["--think-open", think_open]
    if think_close != DEFAULT_CLOSE:
        words += ["--think-close", think_close]
    return " ".join(w if w == out else shlex.quote(w) for w in words)


def single_token_id(tokenizer, tag: str) -> int | None:
    """The id ``tag`` encodes to when it is one token (not the unknown token), as the launcher checks; else None."""
    ids = tokenizer.encode(tag, add_special_tokens=False)
    if len(ids) == 1 and ids[0] != getattr(tokenizer, "unk_token_id", None):
        return int(ids[0])
    return None


@dataclass
class TagNote:
    text: str
    id: int
    added: bool
    """True: a new token; False: it was one token already (its row untouched)."""
    pieces: list[int] = field(default_factory=list)
    """The ids the tag encoded to before (the new row is their mean); empty where not added."""
    piece_texts: list[str] = field(default_factory=list)


@dataclass
class PrepareReport:
    source: str
    output_dir: str | None
    """None: nothing written (the tags were one token each already)."""
    think_open: TagNote
    think_close: TagNote
    tied_embeddings: bool | None = None
    tokens_before: int = 0
    tokens_after: int = 0
    rows_before: int = 0
    rows_after: int = 0
    verified: bool = False

    @property
    def already_prepared(self) -> bool:
        return self.output_dir is None


# ── checks ───────────────────────────────────────────────────────────────────────────────────────────────────────


def _check_tags(think_open: str, think_close: str) -> None:
    from openrlhf_classmate.algo.spans import think_tags_problem

    for flag, tag in (("--think-open", think_open), ("--think-close", think_close)):
        if not tag.strip():
            raise PrepareError(f"{flag} {tag!r} is empty: a tag needs visible text, e.g. {flag} "
                               f"'{DEFAULT_OPEN if flag.endswith('open') else DEFAULT_CLOSE}'")
        if tag != tag.strip():
            # an added token with a space around it would swallow the space of the text it is written in
            raise PrepareError(f"{flag} {tag!r} has white space around it; give the tag alone")
    problem = think_tags_problem(think_open, think_close)
    if problem:
        raise PrepareError(f"--think-open / --think-close: {problem}")


def _looks_like_path(name: str) -> bool:
    """A name that cannot be a hub id (``owner/name`` or ``name``): the user meant a local folder."""
    return (os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1
            or (os.sep != "/" and os.sep in name))


def _check_source(model: str) -> str | None:
    """The local folder of ``model``, or None for a hub id; PrepareError for a path that is no model folder."""
    local = os.path.abspath(os.path.expanduser(model))
    if os.path.exists(local):
        if not os.path.isdir(local):
            raise PrepareError(f"MODEL {model} is a file; give the model's folder (holding config.json)")
        if not os.path.isfile(os.path.join(local, "config.json")):
            raise PrepareError(f"MODEL {model} holds no config.json: not a Hugging Face model folder")
        return local
    if _looks_like_path(model):
        raise PrepareError(f"MODEL {model}: no such folder")
    return None


def _inside(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def _check_output(out_dir: str, source_dir: str | None, overwrite: bool) -> str:
    from openrlhf_classmate.writable import write_problem

    out = os.path.abspath(os.path.expanduser(out_dir))
    if source_dir is not None and (_inside(out, source_dir) or _inside(source_dir, out)):
        where = "is" if out == source_dir else "lies inside" if _inside(out, source_dir) else "holds"
        raise PrepareError(f"OUT_DIR {out_dir} {where} the model folder {source_dir}: write the prepared model to a "
                           "folder of its own (the source stays as it is)")
    if os.path.lexists(out):
        if not os.path.isdir(out):
            raise PrepareError(f"OUT_DIR {out_dir} is a file")
        if not overwrite:
            raise PrepareError(f"OUT_DIR {out_dir} exists; --overwrite replaces an earlier preparation")
        names = os.listdir(out)
        if names and NOTE not in names:
            raise PrepareError(f"OUT_DIR {out_dir} holds files but no {NOTE}: --overwrite replaces an earlier "
                               "preparation or an empty folder, nothing else; name a new folder")
    problem = write_problem(os.path.dirname(out))  # the temporary folder goes beside OUT_DIR
    if problem:
        raise PrepareError(f"OUT_DIR {out_dir}: its folder {os.path.dirname(out)} {problem}")
    return out


def _log(message: str) -> None:
    print(f"[prepare_policy] {message}", file=sys.stderr, flush=True)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def _load_tokenizer(model: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model, trust_remote_code=True)
    except Exception as e:  # noqa: BLE001  (transformers raises OSError, ValueError, ... for unusable folders and ids)
        raise PrepareError(f"MODEL {model}: cannot load its tokenizer ({_one_line(e)})") from None


def _load_model(model: str):
    from transformers import AutoModelForCausalLM

    try:
        # the stored dtype: the prepared folder keeps the source's precision, its weights bit for bit
        return AutoModelForCausalLM.from_pretrained(model, dtype="auto", trust_remote_code=True)
    except ValueError as e:
        if "Unrecognized configuration class" in str(e):
            raise PrepareError(f"MODEL {model} is not a causal LM (AutoModelForCausalLM has no class for its "
                               "config); the policy must generate text") from None
        raise PrepareError(f"MODEL {model}: cannot load the model ({_one_line(e)})") from None
    except Exception as e:  # noqa: BLE001
        raise PrepareError(f"MODEL {model}: cannot load the model ({_one_line(e)})") from None


# ── preparation ──────────────────────────────────────────────────────────────────────────────────────────────────


def _is_tied(model) -> bool:
    head = model.get_output_embeddings()
    return head is None or head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def _mean_rows(weight, ids: Sequence[int], fallback_rows: int):
    """Mean of ``weight``'s rows ``ids`` in fp32, cast back; a tag that encoded to nothing gets the mean of the
    tokenizer's rows instead (nothing to inherit from)."""
    rows = weight[list(ids)] if ids else weight[:fallback_rows]
    return rows.float().mean(dim=0).to(weight.dtype)


def add_think_tokens(model, tokenizer, think_open: str, think_close: str) -> tuple[TagNote, TagNote, dict[str, Any]]:
    """Add the tags that are not one token yet to ``tokenizer`` and give ``model`` their rows (module docstring,
    steps 1-2). Returns the two tags' notes and the table sizes before and after."""
    import torch
    from tokenizers import AddedToken

    tokens_before = len(tokenizer)
    rows_before = int(model.get_input_embeddings().weight.shape[0])
    if tokens_before > rows_before:
        raise PrepareError(f"the tokenizer has {tokens_before} tokens but the model's embedding only {rows_before} "
                           "rows: the source model is inconsistent")
    tied = _is_tied(model)
    notes: list[TagNote] = []
    missing: list[tuple[str, list[int]]] = []
    for tag in (think_open, think_close):
        tag_id = single_token_id(tokenizer, tag)
        if tag_id is not None:
            notes.append(TagNote(tag, tag_id, added=False))
        else:
            missing.append((tag, list(tokenizer.encode(tag, add_special_tokens=False))))
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False, lstrip=False, rstrip=False,
                                     single_word=False) for tag, _ in missing])
    for tag, pieces in missing:
        tag_id = single_token_id(tokenizer, tag)
        if tag_id is None:
            raise PrepareError(f"the tokenizer still splits {tag!r} after adding it as a token "
                               f"({tokenizer.encode(tag, add_special_tokens=False)}); choose other tags")
        notes.append(TagNote(tag, tag_id, added=True, pieces=pieces,
                             piece_texts=tokenizer.convert_ids_to_tokens(pieces)))
    notes.sort(key=lambda n: n.text != think_open)
    if len(tokenizer) > rows_before:
        # no mean_resizing: those rows are overwritten below (and transformers' sampled rows are not reproducible)
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if tied and not _is_tied(model):
        raise PrepareError("resizing untied the input and output embeddings; this model needs a manual resize")
    with torch.no_grad():
        for note in notes:
            if not note.added or note.id < tokens_before:
                # an entry of the vocabulary that the tokenizer's merges never produced: its own (trained) row
                continue
            embed.weight[note.id] = _mean_rows(embed.weight, note.pieces, tokens_before)
            if not tied:
                head.weight[note.id] = _mean_rows(head.weight, note.pieces, tokens_before)
                if getattr(head, "bias", None) is not None:
                    head.bias[note.id] = head.bias[list(note.pieces) or slice(0, tokens_before)].float().mean()
    sizes = dict(tied_embeddings=tied, tokens_before=tokens_before, tokens_after=len(tokenizer),
                 rows_before=rows_before, rows_after=int(model.get_input_embeddings().weight.shape[0]))
    return notes[0], notes[1], sizes


def _copy_kept_files(source_dir: str | None, out: str) -> None:
    if source_dir is None:
        return
    for name in KEPT_FILES:
        src = os.path.join(source_dir, name)
        if os.path.isfile(src) and not os.path.exists(os.path.join(out, name)):
            shutil.copy2(src, os.path.join(out, name))


def _verify(folder: str, model, report: PrepareReport) -> None:
    """Load ``folder`` as the trainer will: the tags one token each with the noted ids, every weight as prepared."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    for note in (report.think_open, report.think_close):
        if single_token_id(tokenizer, note.text) != note.id:
            raise PrepareError(f"verification: the written tokenizer encodes {note.text!r} as "
                               f"{tokenizer.encode(note.text, add_special_tokens=False)}, not [{note.id}]")
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype="auto", trust_remote_code=True)
    if loaded.get_input_embeddings().weight.shape[0] < len(tokenizer):
        raise PrepareError("verification: the written model has fewer embedding rows than its tokenizer has tokens")
    if _is_tied(loaded) != report.tied_embeddings:
        raise PrepareError("verification: the written model's input and output embeddings are "
                           f"{'not ' if report.tied_embeddings else ''}tied, unlike the prepared one")
    expected, written = model.state_dict(), loaded.state_dict()
    for name, tensor in expected.items():
        if name not in written or not torch.equal(written[name], tensor):
            raise PrepareError(f"verification: weight {name} of the written model differs from the prepared one")
    report.verified = True


def prepare(model: str, out_dir: str, *, think_open: str = DEFAULT_OPEN, think_close: str = DEFAULT_CLOSE,
            overwrite: bool = False, verify: bool = True, log: Callable[[str], None] | None = None) -> PrepareReport:
    """Prepare ``model`` into ``out_dir`` (module docstring); PrepareError for anything the user must fix."""
    _check_tags(think_open, think_close)
    source_dir = _check_source(model)
    tokenizer = _load_tokenizer(model)
    ids = [single_token_id(tokenizer, tag) for tag in (think_open, think_close)]
    if None not in ids:
        return PrepareReport(source=source_dir or model, output_dir=None, think_open=TagNote(think_open, ids[0], False),
                             think_close=TagNote(think_close, ids[1], False))
    log = log or _log
    out = _check_output(out_dir, source_dir, overwrite)
    log(f"loading {model}")
    policy = _load_model(model)
    try:
        open_note, close_note, sizes = add_think_tokens(policy, tokenizer, think_open, think_close)
    except (NotImplementedError, AttributeError) as e:  # a remote-code model without get_input_embeddings, ...
        raise PrepareError(f"MODEL {model}: cannot reach its embedding table ({_one_line(e)})") from None
    report = PrepareReport(source=source_dir or model, output_dir=out, think_open=open_note, think_close=close_note,
                           **sizes)
    # beside OUT_DIR (one file system, so the final rename is atomic); made as any folder, with the user's umask
    tmp = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        log(f"writing {out}")
        policy.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _copy_kept_files(source_dir, tmp)
        with open(os.path.join(tmp, NOTE), "w", encoding="utf-8") as f:
            json.dump({k: v for k, v in asdict(report).items() if k not in ("output_dir", "verified")}, f, indent=2)
            f.write("\n")
        if verify:
            log("verifying: loading the written folder again")
            _verify(tmp, policy, report)
        replace_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report


def describe(report: PrepareReport, model: str) -> list[str]:
    """What ``prepare`` did, in lines for the terminal."""
    tags = (report.think_open, report.think_close)
    if report.already_prepared:
        return [f"{model} already has {tags[0].text!r} and {tags[1].text!r} as single tokens (ids {tags[0].id}, "
                f"{tags[1].id}): nothing to prepare, train {model} itself"]
    lines = []
    for note in tags:
        if note.added:
            lines.append(f"{note.text!r}: new token {note.id}, its row the mean of the {len(note.pieces)} pieces it "
                         f"was written in ({' '.join(note.piece_texts)})")
        else:
            lines.append(f"{note.text!r}: one token already ({note.id}), kept")
    head = "tied to the input embedding" if report.tied_embeddings else "untied output rows set alike"
    lines.append(f"tokenizer {report.tokens_before} -> {report.tokens_after} tokens; embedding {report.rows_before} -> "
                 f"{report.rows_after} rows ({head}); every other row and weight unchanged")
    lines.append(f"wrote {report.output_dir}" + (" (verified: it loads, the tags are one token each, the weights are "
                                                  "as prepared)" if report.verified else " (not verified)"))
    lines.append(f"train it: --actor.model_name_or_path {report.output_dir}; it writes the tags as pieces until it "
                 "learns the new tokens: check with --tag-rate, warm it up (README \"Your own models\")")
    return lines


# ── tag rate ─────────────────────────────────────────────────────────────────────────────────────────────────────


@dataclass
class TagRate:
    model: str
    responses: int
    prompts: int
    close_as_text: int
    """Responses whose text holds the close tag, however tokenised."""
    closed_by_token: int | None
    """Responses whose think block the trainer's split closes (the close tag's one token, after an open tag or a
    prompt that opened it): the only ones whose answer the reward reads. None: the tags are not single tokens."""
    prompt_opens_think: int
    """Prompts whose rendered text ends with the open tag (the chat template opens the think block)."""


def _read_prompts(path: str, input_key: str, limit: int) -> list[list[dict]]:
    from openrlhf_classmate.data.errors import DataError
    from openrlhf_classmate.data.io import iter_file_rows
    from openrlhf_classmate.data.messages import messages_problem

    if not os.path.isfile(path):
        raise PrepareError(f"--tag-rate {path}: no such file (give a .jsonl of prompts)")
    out: list[list[dict]] = []
    try:
        for location, row in iter_file_rows(path):
            if len(out) >= limit:
                break
            prompt = row.get(input_key) if isinstance(row, dict) else None
            if isinstance(prompt, str):
                out.append([{"role": "user", "content": prompt}])
                continue
            problem = messages_problem(prompt) if isinstance(prompt, list) else (
                f"must be chat messages or a string (--input-key {input_key})")
            if problem:
                raise PrepareError(f"{location}: field {input_key!r}: {problem}")
            out.append(prompt)
    except DataError as e:
        raise PrepareError(f"--tag-rate {e}") from None
    return out


def tag_rate(model: str, prompts: list[list[dict]], *, think_open: str = DEFAULT_OPEN,
             think_close: str = DEFAULT_CLOSE, samples: int = 4, max_new_tokens: int = 512, temperature: float = 0.7,
             system: str | None = None, backend: str = "auto", seed: int = 0, generator=None,
             responses_out: str | None = None) -> TagRate:
    """Generate ``samples`` responses per prompt with ``model`` and count the tags (see :class:`TagRate`).
    ``generator``: an object with ``generate(prompt_ids, GenParams)`` (evaluate's backends); default: one of
    ``backend`` for ``model``."""
    from openrlhf_classmate.algo.response_split import load_stop_token_ids
    from openrlhf_classmate.algo.spans import prompt_opens_think, split_response_ids
    from openrlhf_classmate.eval.generation import GenParams, make_generator

    tokenizer = _load_tokenizer(model)
    open_id, close_id = single_token_id(tokenizer, think_open), single_token_id(tokenizer, think_close)
    single = open_id is not None and close_id is not None
    stop_ids = load_stop_token_ids(model, tokenizer)
    texts, prompt_ids = [], []
    for messages in prompts:
        shown = ([{"role": "system", "content": system}] if system else []) + list(messages)
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(shown, add_generation_prompt=True, tokenize=False)
        else:  # a base model: the messages' text, as evaluate renders it without a template
            text = "\n".join(str(m.get("content", "")) for m in shown)
        texts.append(text)
        prompt_ids.append(list(tokenizer.encode(text, add_special_tokens=False)))
    own = generator is None
    if own:
        generator = make_generator(backend, model, seed=seed, progress=False)
    try:
        gens = generator.generate(prompt_ids, GenParams(max_new_tokens=max_new_tokens, temperature=temperature,
                                                        n=samples, seed=seed))
    finally:
        if own:
            generator.close()
    as_text = closed = opened_prompts = 0
    rows = []
    for messages, text, ids, per_prompt in zip(prompts, texts, prompt_ids, gens):
        opens = (prompt_opens_think(ids, think_open_id=open_id, think_close_id=close_id) if single
                 else text.rstrip().endswith(think_open))
        opened_prompts += int(opens)
        for gen in per_prompt:
            response = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
            has_text = think_close in response
            has_token = single and split_response_ids(gen.token_ids, think_open_id=open_id, think_close_id=close_id,
                                                      stop_ids=stop_ids, starts_in_think=opens).has_answer
            as_text += int(has_text)
            closed += int(has_token)
            rows.append({"prompt": messages, "response": [{"role": "assistant", "content": response}],
                         "close_as_text": has_text, "closed_by_token": has_token if single else None})
    if responses_out:
        with open(responses_out, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    return TagRate(model=model, responses=len(rows), prompts=len(prompts), close_as_text=as_text,
                   closed_by_token=closed if single else None, prompt_opens_think=opened_prompts)


def describe_rate(rate: TagRate, think_open: str, think_close: str) -> list[str]:
    def frac(k: int) -> str:
        return f"{k}/{rate.responses} ({k / rate.responses:.0%})" if rate.responses else "0/0"

    lines = [f"{rate.model}: {rate.prompts} prompts x {rate.responses // max(rate.prompts, 1)} samples; the chat "
             f"template opens {think_open!r} in {rate.prompt_opens_think} of {rate.prompts} prompts",
             f"  wrote {think_close!r} (as text, in any tokens): {frac(rate.close_as_text)}"]
    if rate.closed_by_token is None:
        lines.append(f"  closed the think block with the {think_close!r} token: n/a, the tags are not one token each "
                     "(the trainer refuses this model; prepare it: python -m openrlhf_classmate.cli.prepare_policy "
                     "MODEL OUT)")
    else:
        lines.append(f"  closed the think block with the {think_close!r} token (the reward reads these answers; "
                     f"every other response scores 0): {frac(rate.closed_by_token)}")
    return lines


# ── command line ─────────────────────────────────────────────────────────────────────────────────────────────────


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m openrlhf_classmate.cli.prepare_policy",
        description="Add the think tags as single tokens to a causal LM (new embedding rows from the tags' pieces) "
                    "and save it as a policy the trainer accepts; or, with --tag-rate, report how often a model "
                    "writes the think block.")
    p.add_argument("model", help="model folder (or hub id, where the hub is reachable)")
    p.add_argument("out_dir", nargs="?", default=None, help="folder for the prepared model (written atomically)")
    p.add_argument("--think-open", default=DEFAULT_OPEN, help="open tag (the launcher's --classmate.think_open)")
    p.add_argument("--think-close", default=DEFAULT_CLOSE, help="close tag (the launcher's --classmate.think_close)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier preparation in OUT_DIR")
    p.add_argument("--no-verify", action="store_true", help="skip loading the written folder again to compare")
    rate = p.add_argument_group("tag rate (instead of OUT_DIR)")
    rate.add_argument("--tag-rate", metavar="PROMPTS", default=None,
                      help="a .jsonl of prompts (setup_data rows): report how often MODEL writes and closes the "
                           "think block")
    rate.add_argument("--input-key", default="prompt", help="row key of the prompt (chat messages or a string)")
    rate.add_argument("--limit", type=int, default=8, help="prompts read from the file (default 8)")
    rate.add_argument("--samples", type=int, default=4, help="responses per prompt (default 4)")
    rate.add_argument("--max-new-tokens", type=int, default=512)
    rate.add_argument("--temperature", type=float, default=0.7, help="0 = greedy (default 0.7)")
    rate.add_argument("--system", default=None, help="a system message added for the generation only")
    rate.add_argument("--backend", default="auto", choices=("auto", "vllm", "hf"),
                      help="vLLM when installed (auto), else transformers")
    rate.add_argument("--seed", type=int, default=0)
    rate.add_argument("--responses-out", default=None,
                      help="write every response as an SFT row ({prompt, response, close_as_text, closed_by_token})")
    return p


def _run_tag_rate(args: argparse.Namespace) -> list[str]:
    import math

    if args.out_dir is not None:
        raise PrepareError("--tag-rate reports on MODEL and writes no model: drop OUT_DIR")
    for flag, value, low in (("--limit", args.limit, 1), ("--samples", args.samples, 1),
                             ("--max-new-tokens", args.max_new_tokens, 1)):
        if value < low:
            raise PrepareError(f"{flag} must be >= {low}, got {value}")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise PrepareError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    _check_tags(args.think_open, args.think_close)
    _check_source(args.model)
    prompts = _read_prompts(args.tag_rate, args.input_key, args.limit)
    rate = tag_rate(args.model, prompts, think_open=args.think_open, think_close=args.think_close,
                    samples=args.samples, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                    system=args.system, backend=args.backend, seed=args.seed, responses_out=args.responses_out)
    return describe_rate(rate, args.think_open, args.think_close)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.tag_rate is not None:
            lines = _run_tag_rate(args)
        elif args.out_dir is None:
            raise PrepareError("give OUT_DIR (the prepared model's folder), or --tag-rate PROMPTS.jsonl")
        else:
            report = prepare(args.model, args.out_dir, think_open=args.think_open, think_close=args.think_close,
                             overwrite=args.overwrite, verify=not args.no_verify)
            lines = describe(report, args.model)
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
