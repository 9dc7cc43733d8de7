"""Transcripts and run directories for the HTML pages' tests (tests/html_report_test.py,
tests/browser_test.py): real dialogues (EpisodeRunner with the embedded simulator and a scripted
text policy), so the pages are tested on records exactly as the rollout writes them."""

import asyncio
import json

import numpy as np

from configs.simulator import get_simulator_config
from rlver_jax.engines.seam import PolicyTurn
from rlver_jax.eval import report
from rlver_jax.eval.sentient import summarize
from rlver_jax.files import atomic_write_jsonl, atomic_write_text
from rlver_jax.rollout.episodes import EpisodeRequest, EpisodeRunner, RolloutSettings
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.simulator import SimulatorSettings, build_simulator
from rlver_jax.simulator.profiles import load_profiles
from rlver_jax.testing.transcripts import stretched

HOSTILE = ('<img src=x onerror="document.title=\'pwned\'"> <script>window.pwned=1</script> '
           '</script><script>window.pwned=2</script> <!-- " onclick="window.pwned=3" \u2028 \u2029 end')
WARM = "I hear how heavy this feels. That sounds really hard, and it makes sense you feel hurt."
COLD = "whatever."
GARBAGE = "!!!! #### %%%% ???? ////"
BROKEN_ID = 'broken"><script>window.pwned=4</script>'


class ScriptedTextPolicy:
    """A text policy: dialogue k (in request order) says scripts[k][turn] (its last line again
    once the script runs out)."""

    def __init__(self, scripts):
        self.scripts = scripts

    async def act(self, requests):
        out = []
        for r in requests:
            script = self.scripts[r.episode % len(self.scripts)]
            turn = sum(m["role"] == "assistant" for m in r.messages)
            out.append(PolicyTurn(text=script[min(turn, len(script) - 1)]))
        return out

    def release(self, session):
        pass


def summary_of(transcripts):
    return summarize([DialogueSequence.from_record(t) for t in transcripts])


def make_transcripts(scripts, profiles=None, n=1, think=False, eval_mode=True, max_turns=4, step=None):
    """Real transcript records: len(profiles) x n dialogues (GRPO groups of n), dialogue k
    following scripts[k]; with `step`, the step a training run adds."""
    cfg = get_simulator_config(eval_mode=eval_mode)
    cfg.backend, cfg.max_turns = "embedded", max_turns
    profiles = profiles if profiles is not None else load_profiles()[:len(scripts)]
    runner = EpisodeRunner(ScriptedTextPolicy(scripts), build_simulator(SimulatorSettings.from_config(cfg)), None,
                           RolloutSettings(think=think, format_failure="continue" if eval_mode else "end"))
    requests = [EpisodeRequest(p, g) for g, p in enumerate(profiles) for _ in range(n)]
    seqs = asyncio.run(runner.run(requests))
    if step is None:
        return [s.to_record() for s in seqs]
    return [{**s.to_record(), "step": step} for s in seqs]


def fixture_profiles():
    """Three Chinese and three English profiles of the shipped set."""
    return [p for p in load_profiles() if p.language == "zh"][:3] + \
        [p for p in load_profiles() if p.language == "en"][:3]


def eval_fixture():
    """Six dialogues with warm, cold, garbage and hostile replies."""
    scripts = [[WARM], [GARBAGE], [COLD], [WARM, HOSTILE, WARM], [GARBAGE], [COLD, WARM]]
    return make_transcripts(scripts, fixture_profiles(), max_turns=6)


def run_info():
    rules = dict(initial_emotion=40, max_change=10, ceiling=100, floor=10, floor_inclusive=False, max_turns=4,
                 score_final_turn=False)
    return {"policy": "scripted <b>policy</b>", "source": "tests", "backend": "openai", "think": False,
            "simulator": "embedded", "difficulty": "vanilla", "profiles": "shipped", "rules": rules}


# A protocol card's first fields (rlver_jax.eval.protocol.card writes them all).
PROTOCOL = {"simulator.backend": "embedded", "simulator.temperature": None, "rules.initial_emotion": 40,
            "profiles.sha256": "0" * 64, "profiles.count": 6}


def eval_dir(directory, transcripts):
    profiles = {p.id: p for p in load_profiles()}
    atomic_write_jsonl(directory / "transcripts.jsonl", transcripts)
    return report.write_outputs(directory, transcripts, profiles, run_info(), levels=(10, 40, 70, 100),
                                card=PROTOCOL)


ADVANTAGES = (0.25, -0.25, 0.0, 1.5)


def training_run(run_dir, steps=2):
    metrics, profiles = [], load_profiles()[:2]
    for step in range(steps):
        records = make_transcripts([[WARM], [GARBAGE], [COLD], [WARM, COLD]], profiles, n=2, eval_mode=False,
                                   max_turns=2, step=step)
        records = [dict(r, advantage=a) for r, a in zip(records, ADVANTAGES)]  # as the training loop writes them
        atomic_write_jsonl(run_dir / "transcripts" / f"train_{step:06d}.jsonl", records)
        metrics.append({"step": step, "reward_mean": float(np.mean([r["reward"] for r in records])),
                        "emotion_mean": 30.0 + step, "success_rate": 0.0, "user_left_rate": 0.0,
                        "format_failure_rate": 0.0, "simulator_errors": 0.0, "turns_mean": 2.0})
    evals = make_transcripts([[WARM]] * 2, profiles, step=steps - 1)
    atomic_write_jsonl(run_dir / "transcripts" / f"eval_{steps - 1:06d}.jsonl", evals)
    metrics[-1]["eval_score"] = summary_of(evals)["score"]
    atomic_write_jsonl(run_dir / "metrics.jsonl", metrics)
    atomic_write_text(run_dir / "config.json", json.dumps({"rl": {"algo": "grpo"}, "rollout": {"n": 2}}))
    return metrics


def long_dialogues(n=100, turns=10, chars=1500):
    return stretched(eval_fixture()[0], n, turns, chars)
