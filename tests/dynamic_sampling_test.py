"""DAPO's dynamic sampling on the rollout side (rlver_jax.rl.dynamic_sampling): groups without signal
are sampled again with fresh profiles and keys, a bounded number of times, in their own slots."""

import asyncio
import dataclasses

from rlver_jax.rl import dynamic_sampling, settings
from rlver_jax.rollout.sequence import DialogueSequence
from tests.rl_helpers import score


@dataclasses.dataclass(frozen=True)
class _Request:  # the fields of rollout.episodes.EpisodeRequest that refill reads
    profile: str
    group: int
    index: int


def _seq(request, final, error=False):
    return score(DialogueSequence(profile_id=request.profile, group=request.group, tokens=[1, 2], policy_mask=[0, 1],
                                  logprobs=[0.0, 0.0], turn_ends=[1], emotions=[30.0, final], end_reason="turn_limit",
                                  simulator_error=error, simulator_state={"index": request.index}), "final")


# A profile's dialogues: "split" ones end apart, "flat" ones alike.
def _play(request):
    return _seq(request, 30.0 + 20 * (request.index % 2) if request.profile.startswith("split") else 50.0)


def test_groups_without_signal():
    reqs = [_Request("p", g, i) for i, g in enumerate([0, 0, 1, 1, 2, 2, 3])]
    seqs = [_seq(reqs[0], 40), _seq(reqs[1], 60), _seq(reqs[2], 40), _seq(reqs[3], 40), _seq(reqs[4], 40),
            _seq(reqs[5], 90, error=True), _seq(reqs[6], 70)]
    # group 1: equal rewards; group 2: one trainable dialogue; group 3: a group of one
    assert dynamic_sampling.groups_without_signal(seqs) == {1, 2, 3}


def test_refill_replaces_groups_without_signal_in_their_slots():
    """Three groups of two: group 0 has signal; group 1 draws a "split" profile on its second retry
    and is replaced by it (fresh sampling indices, its slots and id kept); group 2 draws "flat" ones
    only and keeps its first sample after the two retries (the update's filter drops it)."""
    requests = [_Request(f"first{g}" if g else "split0", g, d) for d, g in enumerate([0, 0, 1, 1, 2, 2])]
    first = [_play(r) for r in requests]
    calls = []

    async def run(again):
        calls.append([(r.profile, r.group, r.index) for r in again])
        return [_play(r) for r in again]

    def profile(retry, group):
        return "split1" if (group, retry) == (1, 2) else f"flat{group}.{retry}"

    out, stats = asyncio.run(dynamic_sampling.refill(run, requests, first, retries=2, stride=6,
                                                     profile=profile))
    assert calls == [[("flat1.1", 1, 8), ("flat1.1", 1, 9), ("flat2.1", 2, 10), ("flat2.1", 2, 11)],
                     [("split1", 1, 14), ("split1", 1, 15), ("flat2.2", 2, 16), ("flat2.2", 2, 17)]]
    assert [s.profile_id for s in out] == ["split0", "split0", "split1", "split1", "first2", "first2"]
    assert [s.group for s in out] == [0, 0, 1, 1, 2, 2]
    assert stats == {"resampled": 2, "refilled": 1, "retries": 2}
    assert dynamic_sampling.groups_without_signal(out) == {2}


def test_refill_step_is_off_unless_the_settings_ask_and_draws_are_pure():
    requests = [_Request("flat", 0, 0), _Request("flat", 0, 1)]
    first = [_play(r) for r in requests]

    async def run(again):
        return [_play(dataclasses.replace(r, profile="split")) for r in again]

    for rl, changed in ((settings.RLSettings(algo="grpo"), False), (settings.RLSettings(algo="dapo"), True),
                        (settings.RLSettings(algo="dapo", dynamic_sampling_retries=0), False)):
        out = asyncio.run(dynamic_sampling.refill_step(rl, run, requests, first, ["a", "b", "c"], 0, 3, 2))
        assert (out != first) == changed
    profiles = list("abcdefgh")
    draws = [dynamic_sampling.refill_profile(profiles, 0, 5, retry, g) for retry in (1, 2) for g in range(4)]
    assert draws == [dynamic_sampling.refill_profile(profiles, 0, 5, retry, g) for retry in (1, 2) for g in range(4)]
    assert len(set(draws)) > 1
