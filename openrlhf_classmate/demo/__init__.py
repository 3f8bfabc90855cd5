"""Embedded CPU demo: a tiny chain-of-thought world where classmate training visibly works in minutes; with
``--gpu``, the same at GPU scale through the production layout.

``python -m openrlhf_classmate.demo --help`` (``bash scripts/run_demo.sh`` sets up ``.venv`` first). Modules:
``world`` (the arithmetic task and its imperfect traces), ``models`` (tiny Llama models, word-level tokenizer),
``warmstart`` (plain supervised loop), ``evaluate`` (held-out main and classmate accuracy), ``launch`` (the real
launcher as a subprocess), ``report`` (metrics.jsonl, curves.png, summary.md) and ``cli`` (the stages). The GPU demo:
``gpu`` (settings, flags), ``gpu_world`` (harder world, byte-level BPE, model shapes), ``gpu_stages`` (what each stage
does), ``stages`` (markers, budget), ``rl_stage`` (the launcher stopped at a checkpoint and resumed) and
``gpu_report``.
"""
