"""The emotion state machine, driven through the real openai client and a scripted server."""

import asyncio
import dataclasses
import json
import re

import pytest

from configs.simulator import get_config, get_simulator_config
from rlver_jax import simulator
from rlver_jax.simulator import EmotionRules
from rlver_jax.testing.scripted_server import ScriptedServer, route, system_prompt

EN = next(p for p in simulator.load_profiles() if p.language == "en")
ZH = next(p for p in simulator.load_profiles() if p.language == "zh")


def _config(server, *, eval_mode=False, **overrides):
    cfg = get_simulator_config(eval_mode=eval_mode)
    cfg.base_url = server.base_url
    cfg.backoff_initial_s = 0.001
    cfg.update(overrides)
    return simulator.SimulatorSettings.from_config(cfg)


def _changes(*values):
    """An emotion-step script answering the given changes in order."""
    it = iter(values)
    return lambda request: f"Intent: comfort\nFit: some\nFeeling: hm\nChange: {next(it):+d}"


def _say(text="Response: Hmm, maybe."):
    return lambda request: f"Plan: answer\n{text}"


def _play(cfg, profile, replies, rules=None):
    async def run():
        async with simulator.build_simulator(cfg) as sim:
            state = await sim.start(profile, rules)
            for reply in replies:
                if state.done:
                    break
                state = await sim.respond(state, reply)
            return state
    return asyncio.run(run())


def test_rules_defaults_and_eval_mode():
    train = EmotionRules.from_config(get_simulator_config())
    sage = EmotionRules.from_config(get_config("eval"))
    assert (train.initial_emotion, train.floor, train.floor_inclusive, train.max_turns,
            train.score_final_turn) == (30, 0, True, 8, True)
    assert (sage.initial_emotion, sage.floor, sage.floor_inclusive, sage.max_turns,
            sage.score_final_turn) == (40, 10, False, 10, False)
    assert train == EmotionRules()
    assert [train.band(e) for e in (100, 99, 70, 69, 40, 39, 10, 9, 0, -5)] == list("SAABBCCFFF")
    assert (train.clip(15), train.clip(-25), train.clip(3)) == (10, -10, 3)
    assert train.at_floor(0) and not train.at_floor(1)
    assert sage.at_floor(9) and not sage.at_floor(10)
    with pytest.raises(ValueError, match="band_a"):
        EmotionRules(band_a=30)


@pytest.mark.parametrize("text,goodbye", [
    ("好吧，再见。", True), ("拜拜！", True), ("Okay. Bye.", True), ("Goodbye, and thanks.", True),
    ("Good-bye then", True), ("bye-bye", True), ("See you later.", True),
    ("By the way, it hurt.", False), ("Goodness, I don't know.", False), ("再说吧", False),
    ("I saw you at the shop", False),
])
def test_goodbye_detection(text, goodbye):
    assert simulator.is_goodbye(text) is goodbye


def test_change_is_clipped_and_bands_move_at_thresholds():
    script = route(emotion=_changes(15, -1, 1, 10, 9, 1), reply=_say())
    with ScriptedServer(script) as server:
        state = _play(_config(server), EN, ["r1", "r2", "r3", "r4", "r5", "r6"])
        reply_prompts = [system_prompt(r) for r in server.requests if "Change:" not in
                         system_prompt(r)]
    # 30 +15->+10 = 40 (B), 39 (C), 40 (B), 50, 59, 60: bands follow the thresholds.
    assert state.emotions == (30, 40, 39, 40, 50, 59, 60)
    first = state.records[1]
    assert (first.change_proposed, first.change, first.emotion, first.band) == (15, 10, 40, "B")
    assert [r.band for r in state.records[1:]] == ["B", "C", "B", "B", "B", "B"]
    # The reply step sees the band, not the number.
    assert [re.search(r"mood band is (\w)", p)[1] for p in reply_prompts] == [
        "B", "C", "B", "B", "B", "B"]
    assert not state.done and state.turns == 6
    assert [m["role"] for m in state.history] == ["user", "assistant"] * 6 + ["user"]


def test_band_a_and_negative_clip():
    script = route(emotion=_changes(10, 10, 10, 10, -30), reply=_say())
    with ScriptedServer(script) as server:
        state = _play(_config(server), EN, ["a", "b", "c", "d", "e"])
    assert state.emotions == (30, 40, 50, 60, 70, 60)
    assert [r.band for r in state.records[1:]] == ["B", "B", "B", "A", "B"]
    assert state.records[-1].change == -10


def test_success_at_the_ceiling_skips_the_reply_step():
    script = route(emotion=_changes(10, 15), reply=_say())
    with ScriptedServer(script) as server:
        rules = dataclasses.replace(EmotionRules(), initial_emotion=85)
        state = _play(_config(server), EN, ["x", "y", "z"], rules)
        assert len(server.requests) == 3  # judge, speak, judge
    assert state.emotions == (85, 95, 100)  # capped, not 105
    assert (state.done, state.end_reason, state.records[-1].utterance) == (True, "success", None)
    assert state.history[-1] == {"role": "assistant", "content": "y"}


def test_failure_at_the_floor_training_and_sage():
    script = route(emotion=_changes(-10, -10, -10), reply=_say())
    with ScriptedServer(script) as server:
        state = _play(_config(server), EN, ["a", "b", "c", "d"])
    assert state.emotions == (30, 20, 10, 0) and state.end_reason == "failure"

    script = route(emotion=_changes(-10, -10, -10, -1), reply=_say())
    with ScriptedServer(script) as server:
        state = _play(_config(server, eval_mode=True), EN, ["a", "b", "c", "d", "e"])
    # SAGE: 10 is not the floor (< 10 is); 9 is.
    assert state.emotions == (40, 30, 20, 10, 9) and state.end_reason == "failure"


def test_goodbye_ends_the_dialogue():
    replies = iter(["Response: 嗯。", "Response: 算了，再见。"])
    script = route(emotion=_changes(-2, -3), reply=lambda r: next(replies))
    with ScriptedServer(script) as server:
        state = _play(_config(server), ZH, ["a", "b", "c"])
    assert (state.done, state.end_reason, state.turns) == (True, "goodbye", 2)
    assert state.history[-1] == {"role": "user", "content": "算了，再见。"}


def test_turn_limit_training_judges_every_turn():
    script = route(emotion=_changes(*[1] * 8), reply=_say())
    with ScriptedServer(script) as server:
        state = _play(_config(server), EN, [f"r{i}" for i in range(12)])
        assert len(server.requests) == 8 + 7  # no reply step after the last judgement
    assert (state.end_reason, state.turns, state.emotion) == ("turn_limit", 8, 38)
    assert len(state.emotions) == 9


def test_turn_limit_sage_never_judges_the_tenth_reply():
    script = route(emotion=_changes(*[2] * 9), reply=_say())
    with ScriptedServer(script) as server:
        state = _play(_config(server, eval_mode=True), EN, [f"r{i}" for i in range(12)])
        assert len(server.requests) == 9 + 9
    assert (state.end_reason, state.turns, state.emotion) == ("turn_limit", 10, 58)
    assert len(state.emotions) == 10  # initial + 9 updates
    assert not state.records[-1].scored and state.history[-1]["content"] == "r9"


def test_opening_from_the_simulator_and_json_round_trip():
    no_first_talk = dataclasses.replace(EN, first_talk=None)
    openings = iter(["Plan: start softly\nResponse: \"Hey... got a minute?\""])
    script = route(emotion=_changes(4), reply=lambda r: next(openings, "Response: Thanks."))
    with ScriptedServer(script) as server:
        state = _play(_config(server), no_first_talk, ["Of course, what's up?"])
    assert state.history[0] == {"role": "user", "content": "Hey... got a minute?"}
    opening = state.records[0]
    assert (opening.turn, opening.reply_thoughts, opening.attempts) == (0, "Plan: start softly", 1)
    restored = simulator.DialogueState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state


def test_respond_after_the_end_is_an_error():
    script = route(emotion=_changes(-10, -10, -10), reply=_say())
    with ScriptedServer(script) as server:
        cfg = _config(server)

        async def run():
            async with simulator.build_simulator(cfg) as sim:
                state = await sim.start(EN)
                for _ in range(3):
                    state = await sim.respond(state, "meh")
                await sim.respond(state, "one more")

        with pytest.raises(ValueError, match="already ended"):
            asyncio.run(run())


def test_bad_config_values_are_named():
    cfg = get_simulator_config()
    cfg.difficulty = "hard"
    with pytest.raises(ValueError, match="config.simulator.difficulty"):
        simulator.build_simulator(simulator.SimulatorSettings.from_config(cfg))
    cfg = get_simulator_config()
    cfg.backend = "vllm"
    with pytest.raises(ValueError, match="config.simulator.backend"):
        simulator.build_simulator(simulator.SimulatorSettings.from_config(cfg))


def test_clipped_changes_count_the_judgements_beyond_the_clip_range():
    script = route(emotion=_changes(15, -3, -40, 10), reply=_say())
    with ScriptedServer(script) as server:
        state = _play(_config(server), EN, ["a", "b", "c", "d"])
    # +15 -> +10 and -40 -> -10 were clipped; -3 and +10 were not; the opening is not judged.
    assert [r.change for r in state.records[1:]] == [10, -3, -10, 10]
    assert simulator.agent.clipped_changes([state.to_dict(), {}]) == 2
