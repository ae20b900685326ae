"""A small resumable training loop shared by the teachers and the student.

Deterministic with a seed: the example order of every epoch is a seeded permutation, so a
resumed run replays exactly the batches it would have seen. Checkpoints (model,
optimizer, scheduler, step) are written to a temporary name and renamed; a run stops at
``steps`` or after ``minutes`` of wall time, whichever comes first, and a later call with
the same folder resumes where it stopped.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import numpy as np
import torch
from tqdm import tqdm


@dataclass
class LoopSettings:
    steps: int = 1000
    batch_size: int = 8            # training examples (queries) per step
    lr: float = 3e-5
    warmup: float = 0.1            # share of steps with a linear warm-up
    weight_decay: float = 0.01
    seed: int = 0
    checkpoint_every: int = 50
    minutes: Optional[float] = None  # stop (resumably) after this much wall time
    #: at the time budget, also write the final model (a device call has no later session to resume in)
    final_at_deadline: bool = False
    log_every: int = 10
    #: A device call's schedule (issue 61): the wall-clock time (``time.time()``) by which the final model
    #: must be written. Training runs until ``save_seconds`` before it, the learning rate's warm-up and decay
    #: are laid on the *time* between the first step and that end (``steps`` only caps the count), and the
    #: final model is saved inside it: a step count fixed in advance left 193 s of a 505 s call unused.
    deadline: Optional[float] = None
    save_seconds: float = 0.0


def schedule_factor(progress: float, warmup: float) -> float:
    """The learning rate's share at ``progress`` ∈ [0, 1] of a run: linear warm-up over the first
    ``warmup`` of it, then linear decay to 0 at the end (the step schedule's shape, on a time axis)."""
    if progress < warmup:
        return max(progress, 1e-3) / warmup
    return max(0.0, (1.0 - progress) / max(1e-9, 1.0 - warmup))


def seeded(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def batches(n_examples: int, batch_size: int, seed: int, start_step: int, steps: int):
    """Yield (step, indices) from ``start_step``: epochs of seeded permutations, last partial batch dropped."""
    per_epoch = max(1, n_examples // batch_size)
    step = start_step
    while step < steps:
        epoch, offset = divmod(step, per_epoch)
        order = np.random.RandomState(seed + epoch).permutation(n_examples)
        yield step, order[offset * batch_size:(offset + 1) * batch_size].tolist()
        step += 1


def logger_for(folder: Path) -> logging.Logger:
    log = logging.getLogger(f"agrame.train.{folder}")
    if not log.handlers:
        folder.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(folder / "train.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    return log


def adamw(params: List, settings: LoopSettings):
    """``(every parameter, AdamW)`` for ``params``: a list of parameters or of groups ``{"params": [...],
    "lr_scale": s}`` (layer-wise learning rates); biases, norms and tensors flagged ``_no_decay`` (an
    embedding whose other rows are frozen) skip weight decay."""
    scaled = params if params and isinstance(params[0], dict) else [{"params": params, "lr_scale": 1.0}]
    groups = []
    for g in scaled:
        decay = [p for p in g["params"] if p.ndim >= 2 and not getattr(p, "_no_decay", False)]
        no_decay = [p for p in g["params"] if p.ndim < 2 or getattr(p, "_no_decay", False)]
        lr = settings.lr * g.get("lr_scale", 1.0)
        groups += [{"params": decay, "weight_decay": settings.weight_decay, "lr": lr},
                   {"params": no_decay, "weight_decay": 0.0, "lr": lr}]
    return [p for g in scaled for p in g["params"]], torch.optim.AdamW(groups, lr=settings.lr)


def resume(ckpt: Path, model: torch.nn.Module, optimizer, scheduler) -> int:
    """The step a run's checkpoint left off at, its model, optimizer and scheduler restored (0: none)."""
    if not ckpt.exists():
        return 0
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"], strict=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return state["step"]


def train(model: torch.nn.Module, examples: Sequence, loss_fn: Callable[[List], torch.Tensor],
          settings: LoopSettings, folder: str | Path, params: Optional[List] = None,
          save: Optional[Callable[[Path], None]] = None) -> dict:
    """Optimise ``loss_fn(batch_of_examples)``; returns {"step", "done", "loss"}.

    ``save(path)`` writes the final model (default: ``torch.save`` of the state dict).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    log = logger_for(folder)
    seeded(settings.seed)
    params, optimizer = adamw(params if params is not None else [p for p in model.parameters() if p.requires_grad],
                              settings)
    warm = max(1, int(settings.warmup * settings.steps))
    clock = {"began": None, "end": None}

    def schedule(step: int) -> float:  # linear warm-up, then linear decay to 0
        if clock["end"] is not None:  # on the time axis: the share of the span before the deadline gone by
            span = max(1e-9, clock["end"] - clock["began"])
            progress = max((time.time() - clock["began"]) / span, step / settings.steps)
            return schedule_factor(min(1.0, progress), settings.warmup)
        if step < warm:
            return (step + 1) / warm
        return max(0.0, (settings.steps - step) / max(1, settings.steps - warm))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    ckpt = folder / "checkpoint.pt"
    start = resume(ckpt, model, optimizer, scheduler)
    if start:
        log.info("resumed at step %d", start)
    (folder / "settings.json").write_text(json.dumps(asdict(settings), indent=2))

    def checkpoint(step: int) -> None:
        tmp = folder / f".checkpoint.tmp-{os.getpid()}"
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "step": step}, tmp)
        tmp.replace(ckpt)

    began = time.time()
    if settings.deadline is not None:
        clock.update(began=began, end=settings.deadline - settings.save_seconds)
        if clock["end"] <= began:
            raise ValueError(f"the deadline leaves no time to train ({clock['end'] - began:.1f} s before saving)")
        for group, lr in zip(optimizer.param_groups, scheduler.base_lrs):  # the first step's warm-up share
            group["lr"] = lr * schedule(start)
    model.train()
    running, seen = None, 0
    bar = tqdm(total=settings.steps, initial=start, desc=f"train {folder.name}", disable=None)
    step = start
    cuda = next((p.device for p in params if p.device.type == "cuda"), None)
    last = time.time()
    for step, idx in batches(len(examples), settings.batch_size, settings.seed, start, settings.steps):
        torch.manual_seed(settings.seed * 1_000_003 + step)  # dropout replays exactly after a resume
        loss = loss_fn([examples[i] for i in idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        # the loss stays on its device until it is logged: reading it every step waits for the device
        running = loss.detach() if running is None else running + loss.detach()
        seen += 1
        bar.update(1)
        if (step + 1) % settings.log_every == 0:
            value = float(running) / seen
            if not math.isfinite(value):
                raise FloatingPointError(f"loss is {value} in the {seen} steps to step {step + 1}")
            memory = f" gpu_peak_gb {torch.cuda.max_memory_allocated(cuda) / 2 ** 30:.1f}" if cuda is not None else ""
            log.info("step %d loss %.4f lr %.2e%s", step + 1, value, scheduler.get_last_lr()[0], memory)
            bar.set_postfix(loss=f"{value:.4f}")
            running, seen = None, 0
        if settings.checkpoint_every and (step + 1) % settings.checkpoint_every == 0:
            checkpoint(step + 1)
        now = time.time()
        if clock["end"] is not None and now + (now - last) >= clock["end"]:  # another step would pass the end
            break
        last = now
        if settings.minutes is not None and time.time() - began > 60 * settings.minutes:
            checkpoint(step + 1)
            if settings.final_at_deadline and save is not None:
                model.eval()
                save(folder / "final")
            log.info("time budget reached at step %d", step + 1)
            bar.close()
            return {"step": step + 1, "done": False}
    bar.close()
    if running is not None and not math.isfinite(float(running)):
        raise FloatingPointError(f"loss is {float(running) / seen} in the last {seen} steps to step {step + 1}")
    done_step = max(start, step + 1 if settings.steps > start else start)
    if settings.checkpoint_every:
        checkpoint(done_step)
    model.eval()
    if save is not None:
        save(folder / "final")
    log.info("done at step %d%s", done_step,
             f" ({time.time() - began:.1f} s of training, the deadline's)" if clock["end"] is not None else "")
    return {"step": done_step, "done": True}
