"""Start-up checks of issue 44 that need no model: a profile whose opening leaves the policy no turn
is refused naming it and the budget (rollout.openings); the tiny tokenizer is written whole or not at
all (model_loading.tiny_tokenizer); optimizer settings are range-checked (rl.settings.OptimSettings)."""

import math

import pytest

from rlver_jax.rl.settings import OptimSettings
from rlver_jax.rollout.episodes import RolloutSettings
from rlver_jax.rollout.openings import check_openings, openings_over_budget
from rlver_jax.simulator.profiles import load_profiles
from rlver_jax.text import chat
from rlver_jax.train import model_loading


@pytest.fixture(scope="module")
def chat_tokens(tiny_tokenizer_dir):
    return chat.ChatTokens.from_tokenizer(chat.load_tokenizer(tiny_tokenizer_dir))


def test_a_profile_whose_opening_fills_the_budget_is_refused_naming_it(chat_tokens):
    profiles = load_profiles()[:3]
    long = profiles[1].__class__(**{**profiles[1].__dict__, "id": "long-opening", "first_talk": "I feel lost. " * 370})
    settings = RolloutSettings(think=True, max_new_tokens=32, max_total_tokens=1024, where="config.policy.")
    assert openings_over_budget(chat_tokens, settings, profiles) == []
    over = openings_over_budget(chat_tokens, settings, [*profiles, long])
    assert [pid for pid, _ in over] == ["long-opening"] and over[0][1] > 1024
    with pytest.raises(ValueError) as error:
        check_openings(chat_tokens, settings, [*profiles, long], "config.eval.profiles")
    message = str(error.value)
    assert "\n" not in message and message.startswith(
        "1 profile(s) of config.eval.profiles open with more than the policy's token budget leaves for a turn "
        "(config.policy.max_total_tokens=1024")
    assert f"long-opening ({over[0][1]} tokens)" in message and "raise config.policy.max_total_tokens" in message
    no_opening = long.__class__(**{**long.__dict__, "first_talk": None})  # the simulator's: not known before
    assert openings_over_budget(chat_tokens, settings, [no_opening]) == []


def test_the_tiny_tokenizer_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    directory = tmp_path / "tokenizer"
    built = model_loading.build_tiny_tokenizer

    def killed(out_dir, **kw):  # a kill (here an error) after the first file
        (out_dir / "tokenizer.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(model_loading, "build_tiny_tokenizer", killed)
    with pytest.raises(KeyboardInterrupt):
        model_loading.tiny_tokenizer(directory)
    assert not directory.exists() and list(tmp_path.iterdir()) == []  # no half directory, no staging left
    monkeypatch.setattr(model_loading, "build_tiny_tokenizer", built)
    directory.mkdir()
    (directory / "tokenizer.json").write_text("{}")  # what an older version's kill left
    tokens = model_loading.tiny_tokenizer(directory)  # rebuilt, not "fails every rerun"
    assert len(tokens.tokenizer) == 512
    assert sorted(p.name for p in directory.iterdir()) >= sorted(model_loading.TINY_TOKENIZER_FILES)


def test_optimizer_settings_are_range_checked():
    OptimSettings(lr=0.0)  # a frozen model is allowed
    with pytest.raises(ValueError) as error:
        OptimSettings(lr=-1e-6, warmup_ratio=1.5, weight_decay=math.nan, grad_clip=0.0, b1=1.0, b2=-0.1,
                      eps=math.inf)
    assert str(error.value) == ("lr=-1e-06 must be a finite number >= 0; warmup_ratio=1.5 must be in [0, 1]; "
                                "weight_decay=nan must be a finite number >= 0; grad_clip=0.0 must be a finite "
                                "number > 0; b1=1.0 must be in [0, 1); b2=-0.1 must be in [0, 1); eps=inf must be "
                                "a finite number > 0")
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match="lr="):
            OptimSettings(lr=bad)
