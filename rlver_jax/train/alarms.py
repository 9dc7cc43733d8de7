"""The training loop's alarms: checks of a step's results that warn, or stop the run before the
step is saved: a diverged update (parameter norms), a rise in degenerate replies, replies that
share one template across users, a step with no dialogue to train on.
"""

from __future__ import annotations

import logging
import pathlib

import jax

from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.rollout.transcripts import transcript_path, write_transcripts
from rlver_jax.text import degeneration
from rlver_jax.train import checkpoint
from rlver_jax.train.spec import LoopSettings

log = logging.getLogger(__name__)


class DivergedError(FloatingPointError):
    """A step's update grew a parameter norm beyond config.train.max_param_norm_growth."""


def check_growth(step: int, before: dict[str, float], metrics: dict[str, float], s: LoopSettings,
                 manager) -> dict[str, float]:
    """The parameter norms after step `step` (from its metrics); DivergedError, before anything of
    the step is written, when one grew by more than `s.max_param_norm_growth` from `before`."""
    after = {name: metrics[f"{name}_param_norm"] for name in ("actor", "critic") if f"{name}_param_norm" in metrics}
    growth = s.max_param_norm_growth
    over = {k: (before[k], v) for k, v in after.items()
            if growth and before.get(k, 0.0) > 0 and v > growth * before[k]}
    if over:
        saved = checkpoint.latest_step(manager)
        kept = f"the checkpoint of step {saved} in {manager.directory}" if saved is not None else "no checkpoint"
        shown = ", ".join(f"the {k}'s from {a:.4g} to {b:.4g} (x{b / a:.3g})" for k, (a, b) in over.items())
        names = ",".join(f"optim.{k}.lr" for k in over)
        raise DivergedError(
            f"step {step}: the update diverged: it grew the parameter norm {shown}, more than "
            f"config.train.max_param_norm_growth={growth:g} allows; the step is not saved (kept: {kept}). Lower the "
            f"learning rate and rerun with --config.checkpoint.allow_changes={names}")
    return {**before, **after}


class DegenerateRepliesError(RuntimeError):
    """A step's share of degenerate replies rose beyond config.train.degenerate_alarm (action "stop")."""


def check_degeneration(step: int, lowest: float | None, metrics: dict[str, float], s: LoopSettings) -> float:
    """The lowest degenerate_rate of the run up to step `step`; a warning, or with action "stop" a
    DegenerateRepliesError before the step is saved, when this step's rate rose more than
    `s.degenerate_alarm` above the lowest before it."""
    rate = metrics["degenerate_rate"]
    if s.degenerate_alarm and lowest is not None and rate - lowest > s.degenerate_alarm:
        message = (f"step {step}: {degeneration.describe(metrics)} of the policy's replies are degenerate, up from "
                   f"{lowest:.0%} earlier in the run: more than config.train.degenerate_alarm={s.degenerate_alarm:g}; "
                   f"read {s.workdir}/transcripts")
        if s.degenerate_alarm_action == "stop":
            raise DegenerateRepliesError(f"{message}. The step is not saved; lower the learning rate or fix the "
                                         "prompts, then resume")
        log.warning("%s", message)
    return rate if lowest is None else min(lowest, rate)


class TemplateRepliesError(RuntimeError):
    """A step's template_rate reached config.train.template_alarm (action "stop")."""


def check_templates(step: int, metrics: dict[str, float], s: LoopSettings) -> None:
    """A warning, or with action "stop" a TemplateRepliesError before the step is saved, when
    `s.template_alarm` of this step's replies share a skeleton with another user's (template_rate)."""
    rate = metrics["template_rate"]
    if not s.template_alarm or rate < s.template_alarm:
        return
    message = (f"step {step}: {rate:.0%} of the policy's replies share a skeleton with another user's once the "
               f"user's words are masked (template_rate), at least config.train.template_alarm={s.template_alarm:g}: "
               f"the policy may have learnt one template for everyone; read {s.workdir}/transcripts")
    if s.template_alarm_action == "stop":
        raise TemplateRepliesError(f"{message}. The step is not saved")
    log.warning("%s", message)


class AllDialoguesFailedError(RuntimeError):
    """No dialogue of a step can be trained on (every one ended as simulator_error, or had no
    policy turn); the step's transcripts are written first."""


def check_trainable(step: int, dialogues: list[DialogueSequence], transcripts: pathlib.Path) -> None:
    """Raise AllDialoguesFailedError, after writing them to `transcripts`, when no dialogue of step
    `step` can be trained on."""
    if any(s.trainable for s in dialogues):
        return
    path = transcript_path(transcripts, step)
    if jax.process_index() == 0:
        write_transcripts(path.parent, step, dialogues)
    failed = [s for s in dialogues if s.simulator_error]
    errors = [s.simulator_state.get("error") for s in failed if s.simulator_state.get("error")]
    stale = sum(s.stale for s in dialogues)
    cause = (f"{len(failed)} of {len(dialogues)} ended as simulator_error"
             + (f" (last: {errors[-1]})" if errors else "")) if failed else (
        f"{stale} beyond the staleness bound, the rest without a policy turn" if stale else "none had a policy turn")
    raise AllDialoguesFailedError(f"step {step}: no dialogue can be trained on: {cause}. The dialogues "
                                  f"are in {path}")
