"""``ResilientDeepspeedStrategy``: upstream's ``DeepspeedStrategy`` with safer checkpoint handling.

* ``load_ckpt`` without an explicit tag resumes from :func:`checkpoints.choose_resume_tag`'s choice: ``latest`` when
  it is complete, else the newest complete older tag, with one line naming the broken file (a torn checkpoint used
  to end in a ``torch.load`` traceback). Every rank makes the same choice from the same files.
* ``save_model`` into ``<ckpt.path>/<tag>_hf`` (``--ckpt.save_hf``) rotates those folders with ``--ckpt.max_num``,
  as upstream rotates the DeepSpeed tags (the ``_hf`` folders used to pile up forever).

Upstream's ``train()`` builds its strategy with ``get_strategy(args)``; :func:`patches.install_launcher` rebinds
that name to :func:`get_strategy` below. The strategy object travels to the Ray actors by pickle, so the subclass
is what every actor uses.
"""

from __future__ import annotations

import os

from openrlhf.utils.deepspeed import DeepspeedStrategy

from openrlhf_classmate.integration.checkpoints import choose_resume_tag, rotate_hf_folders


class ResilientDeepspeedStrategy(DeepspeedStrategy):
    def load_ckpt(self, model, load_dir, tag=None, *args, **kwargs):
        if tag is None:
            choice = choose_resume_tag(load_dir, self.stage)  # CheckpointError when no tag is complete
            if choice is not None:
                for note in choice.notes(load_dir):
                    self.print(f"[openrlhf_classmate] warning: {note}")
                tag = choice.tag
        return super().load_ckpt(model, load_dir, tag, *args, **kwargs)

    def save_model(self, model, tokenizer, output_dir, **kwargs) -> None:
        super().save_model(model, tokenizer, output_dir, **kwargs)
        ckpt = self.args.ckpt
        folder = os.path.abspath(output_dir)
        if self.is_rank_0() and folder.endswith("_hf") and os.path.dirname(folder) == os.path.abspath(ckpt.path):
            for name in rotate_hf_folders(ckpt.path, ckpt.max_num):
                self.print(f"Deleted HF checkpoint {os.path.join(ckpt.path, name)} (--ckpt.max_num {ckpt.max_num})")


def get_strategy(args) -> ResilientDeepspeedStrategy:
    """Upstream ``openrlhf.utils.get_strategy(args)``, turned into the subclass (which adds no state)."""
    from openrlhf.utils import get_strategy as upstream_get_strategy

    strategy = upstream_get_strategy(args)
    if type(strategy) is not DeepspeedStrategy:
        raise TypeError(f"openrlhf.utils.get_strategy returned {type(strategy).__name__}, not DeepspeedStrategy")
    strategy.__class__ = ResilientDeepspeedStrategy
    return strategy
