"""The evaluation driver (rollout/evaluation.play_profiles) on one process: every profile's
dialogue keeps its index whatever the grouping, in the order of the profiles, and its transcripts
are written both ways (appended as the dialogues end, the benchmark's; one file at the end, the
training run's)."""

import json

from configs.simulator import get_simulator_config
from rlver_jax.engines.seam import PolicyTurn
from rlver_jax.rollout.episodes import RolloutSettings
from rlver_jax.rollout.evaluation import play_profiles
from rlver_jax.simulator import SimulatorSettings
from rlver_jax.simulator.profiles import load_profiles


class IndexPolicy:
    """A text policy whose reply names the dialogue's sampling index; records each call's size."""

    def __init__(self):
        self.calls = []

    async def act(self, requests):
        self.calls.append(len(requests))
        return [PolicyTurn(text=f"Dialogue {r.dialogue}, turn {r.turn}: tell me more.") for r in requests]

    def release(self, session):
        pass


def _play(tmp_path, name, **kwargs):
    cfg = get_simulator_config()
    cfg.backend, cfg.max_turns = "embedded", 2
    profiles = [p for p in load_profiles() if p.language == "en"][:5]
    pairs = [(i + 3, p) for i, p in enumerate(profiles)]  # indices as after a resume
    policy = IndexPolicy()
    seqs = play_profiles(policy, None, SimulatorSettings.from_config(cfg), RolloutSettings(think=False), pairs,
                         version=7, append_to=tmp_path / f"{name}.jsonl", transcripts_dir=tmp_path / name, **kwargs)
    return pairs, policy, seqs


def test_every_profile_keeps_its_index_under_any_grouping(tmp_path):
    pairs, together, seqs = _play(tmp_path, "together")
    _, grouped, grouped_seqs = _play(tmp_path, "grouped", group_size=2, max_dialogues=2)
    assert together.calls[0] == 5 and max(grouped.calls) == 2  # one batch; two dialogues per call
    assert [s.profile_id for s in seqs] == [p.id for _, p in pairs]
    assert [s.group for s in seqs] == [i for i, _ in pairs]
    assert all(s.turns[0]["raw"].startswith(f"Dialogue {i},") for s, (i, _) in zip(seqs, pairs))
    assert all(s.policy_version == 7 and s.tokens == [] for s in seqs)
    assert [s.to_record() for s in grouped_seqs] == [s.to_record() for s in seqs]


def test_transcripts_are_appended_as_they_end_and_written_at_the_end(tmp_path):
    _, _, seqs = _play(tmp_path, "run", group_size=1, max_dialogues=1, progress="sentient")
    appended = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert sorted(appended, key=lambda r: r["group"]) == [_json(s.to_record()) for s in seqs]
    written = [json.loads(line) for line in (tmp_path / "run" / "eval_000007.jsonl").read_text().splitlines()]
    assert written == [_json({**s.to_record(), "step": 7}) for s in seqs]


def _json(record):
    return json.loads(json.dumps(record))  # tuples become lists, as in the files
