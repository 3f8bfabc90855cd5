"""No non-finite value reaches the policy's optimizer.

DeepSpeed skips an update on its own only in some set-ups (fp16 loss scaling; ZeRO-1/2 bf16 with its grad-overflow
check), never under ZeRO-3 bf16 or fp32, and says nothing. Here, for every optimizer update of the policy:

* each micro-batch's rewards and advantages (main and classmate, over the action tokens) are checked when upstream's
  ``training_step`` starts (:meth:`NonfiniteGuard.check_experience`), its loss before the backward
  (:meth:`check_loss`, called by our strategy's ``backward``); the checks are counted on the device, nothing is read
  back to the host per micro-batch (the counts are read once, at the boundary);
* at the gradient-accumulation boundary the ranks agree (one all-reduce) whether any micro-batch of the window was
  non-finite; DeepSpeed's optimizer wrapper then computes the global gradient norm as always, and the inner
  optimizer's ``step`` (wrapped once, :meth:`install`) runs only when the window is clean and that norm is finite.
  A skipped update leaves the weights and the optimizer state (Adam moments, step count) untouched: the wrapper
  copies its unchanged fp32 master weights back and clears the gradients as after any step, and the learning-rate
  schedule is put back where it was (it does not advance on a skipped update, as with DeepSpeed's own overflow skip);
  where DeepSpeed's bf16 overflow check skips the step first (ZeRO-1/2), that skip is counted the same way;
* a skipped update prints one warning line (rank 0) and counts in ``train/nonfinite_skipped`` (the run's total); the
  controller stops the run with one line after ``--classmate.stop_after_nonfinite_skips`` consecutive skipped updates.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from openrlhf.utils.logging_utils import init_logger

logger = init_logger(__name__)

POINTS = ("rewards", "advantages", "loss", "gradient norm")


def nonfinite_flags(experience) -> dict[str, torch.Tensor | bool]:
    """Whether a micro-batch's ``rewards`` (episode rewards / logged reward) and ``advantages`` (main or classmate,
    on the action tokens) hold a non-finite value: a bool where the inputs are in host memory, else a 0-dim bool
    tensor on their device, computed without reading anything back (a read would wait for the GPU: one host sync
    per check and micro-batch)."""
    rewards = [_tensor(t) for t in (getattr(experience, "rewards", None), experience.info.get("reward"))
               if t is not None]
    mask = experience.action_mask
    advantages = []
    for name in ("advantages", "classmate_advantages"):
        value = getattr(experience, name, None)
        if value is None:
            continue
        finite = torch.isfinite(value.float())
        if mask is not None and value.shape == mask.shape:
            finite = finite | ~mask.bool()  # only the action tokens count
        advantages.append(finite)
    return {"rewards": _any_nonfinite([torch.isfinite(t) for t in rewards]),
            "advantages": _any_nonfinite(advantages)}


def _any_nonfinite(finite: list[torch.Tensor]) -> torch.Tensor | bool:
    """Any False in the ``isfinite`` masks: a bool for host tensors, a device tensor as soon as one is on a device."""
    in_host, on_device = False, None
    for t in finite:
        bad = ~t.all()
        if t.device.type == "cpu":
            in_host = in_host or bool(bad)
        else:
            on_device = bad if on_device is None else on_device | bad
    return on_device if on_device is not None and not in_host else in_host


def _tensor(value) -> torch.Tensor:
    """A float tensor of a tensor or of the per-sample list the replay buffer's collate makes of ``info`` values."""
    if isinstance(value, torch.Tensor):
        return value.detach().float()
    if not isinstance(value, (list, tuple)):
        return torch.tensor([float(value)])
    return torch.cat([_tensor(v).reshape(-1) for v in value]) if len(value) else torch.zeros(0)


class NonfiniteGuard:
    """The policy engine's update guard; the strategy's ``backward`` / ``optimizer_step`` call into it."""

    def __init__(self, engine, max_consecutive: int):
        self.engine = engine
        self.max_consecutive = max_consecutive
        self._window: torch.Tensor | None = None  # see `window`
        self.skip_window = False  # decided at the boundary, for all ranks
        self.skipped_now: list[str] = []
        self.total = 0  # skipped updates in this run
        self.consecutive = 0
        self.updates = 0
        self.install()

    # ── the inner optimizer: the only place parameters and optimizer state change ──

    def install(self) -> None:
        wrapper = self.engine.optimizer
        inner = getattr(wrapper, "optimizer", wrapper)
        self.inner = inner
        for o in {id(o): o for o in (inner, getattr(wrapper, "backup_optimizer", None)) if o is not None}.values():
            def guarded_step(*args, _real=o.step, **kwargs):
                return _real(*args, **kwargs) if self._update_allowed() else None

            o.step = guarded_step
        # DeepSpeed's ZeRO wrappers replace a non-finite gradient norm by -1 before clipping and stepping (ZeRO-3
        # bf16 then applies a NaN update with a logged norm of 1): the norm is read where they compute it
        # Without those (no wrapper, or ZeRO-0's FP16_Optimizer, which in bf16 sees an overflow and steps anyway:
        # it skips only under loss scaling) the inner optimizer's parameters hold the full gradients it would apply
        self.norm_hooked = False
        for name in ("get_grad_norm_direct", "complete_grad_norm_calculation_for_cpu_offload"):
            if hasattr(wrapper, name):
                self.norm_hooked = True
                def recorded(*args, _real=getattr(wrapper, name), **kwargs):
                    norm = _real(*args, **kwargs)
                    value = float(norm)
                    if not (math.isfinite(value) and value >= 0):  # -1: DeepSpeed's mark of inf / NaN
                        self.norm_nonfinite = True
                    return norm

                setattr(wrapper, name, recorded)
        self.norm_nonfinite = False

    def _update_allowed(self) -> bool:
        if self.skip_window:
            return False
        if self.norm_nonfinite or (not self.norm_hooked and not math.isfinite(self._plain_grad_norm())):
            self.skip_window = True
            self.skipped_now = ["gradient norm"]
            return False
        return True

    def _plain_grad_norm(self) -> float:
        """The norm of the gradients the inner optimizer is about to apply (no ZeRO partitioning: they are full and
        reduced; under ZeRO-0's FP16_Optimizer, its fp32 masters' gradients)."""
        grads = [p.grad for g in self.inner.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return 0.0
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))

    # ── hooks ──

    @property
    def window(self) -> torch.Tensor:
        """Non-finite micro-batches of this optimizer window on this rank, per point (rewards, advantages, loss): a
        float64 tensor on the device, added to without a host read and read once, at the boundary."""
        if self._window is None:
            self._window = torch.zeros(3, dtype=torch.float64, device=torch.cuda.current_device())
        return self._window

    def _count(self, index: int, bad: torch.Tensor | bool) -> None:
        if isinstance(bad, torch.Tensor):
            self.window[index] += bad.to(self.window.device)
        elif bad:
            self.window[index] += 1

    def check_experience(self, experience) -> None:
        flags = nonfinite_flags(experience)
        self._count(0, flags["rewards"])
        self._count(1, flags["advantages"])

    def check_loss(self, loss: torch.Tensor) -> None:
        self._count(2, _any_nonfinite([torch.isfinite(loss.detach())]))

    def before_step(self) -> bool:
        """Before ``engine.step()``; True at a gradient-accumulation boundary (the ranks agree on the window)."""
        if not self.engine.is_gradient_accumulation_boundary():
            return False
        counts = self.window.clone()
        if dist.is_initialized():
            dist.all_reduce(counts)
        self.skipped_now = [p for p, n in zip(POINTS, counts.tolist()) if n > 0]
        self.skip_window = bool(self.skipped_now)
        self.norm_nonfinite = False
        self.window.zero_()
        scheduler = self.engine.lr_scheduler
        self._saved = (scheduler.state_dict() if scheduler is not None else None,
                       [g["lr"] for g in self.engine.optimizer.param_groups])
        return True

    def after_step(self) -> None:
        """After ``engine.step()`` at a boundary: undo the schedule's advance of a skipped update, count, warn."""
        self.updates += 1
        if not self.skip_window and not self.engine.fp16_enabled() and not self.engine.was_step_applied():
            # DeepSpeed's own overflow check (ZeRO-1/2 bf16) found inf / NaN gradients and skipped the step before
            # the inner optimizer: the same skip, counted the same way (fp16 loss-scale skips are DeepSpeed's
            # ordinary scale search, not counted)
            self.skip_window = True
            self.skipped_now = ["gradient norm"]
        if not self.skip_window:
            self.consecutive = 0
            return
        state, lrs = self._saved
        if state is not None:
            self.engine.lr_scheduler.load_state_dict(state)
        for group, lr in zip(self.engine.optimizer.param_groups, lrs):
            group["lr"] = lr
        self.total += 1
        self.consecutive += 1
        self.skip_window = False
        if not dist.is_initialized() or dist.get_rank() == 0:
            logger.warning(f"policy update {self.updates} skipped: non-finite {' and '.join(self.skipped_now)} "
                           f"(weights and optimizer state unchanged; {self.total} skipped in this run, "
                           f"{self.consecutive} in a row; --classmate.stop_after_nonfinite_skips "
                           f"{self.max_consecutive})")

    def status(self) -> dict[str, float]:
        return {"nonfinite_skipped": float(self.total), "nonfinite_consecutive": float(self.consecutive)}
