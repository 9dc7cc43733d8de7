"""Where a run's numbers go: TensorBoard tags grouped into train/, eval/ and speed/ sections; and
metrics.jsonl after a kill: a run starting at step S keeps each earlier step's line once and drops
the lines of steps >= S and torn lines."""

import json
import struct

from tensorboardX.proto import event_pb2

from rlver_jax.files import read_jsonl
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.train import metrics
from rlver_jax.train.metrics import keep_steps_before


def _tags(events_dir):
    """The scalar tags of every event file under `events_dir` (TFRecord framing: length, crc, data, crc)."""
    tags = set()
    for path in events_dir.iterdir():
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
            tags |= {v.tag for v in event.summary.value}
            pos += 12 + length + 4
    return tags


def test_tensorboard_tags_are_grouped_by_section(tmp_path):
    assert metrics.tensorboard_tag("eval_score") == "eval/score"
    assert metrics.tensorboard_tag("eval_success_rate") == "eval/success_rate"
    assert metrics.tensorboard_tag("update_seconds") == "speed/update_seconds"
    assert metrics.tensorboard_tag("reward_mean") == "train/reward_mean"
    writers = metrics.Writers(tmp_path, start=0, total=1, progress=False)
    writers.write(0, {"reward_mean": 0.5, "policy_loss": 0.1, "eval_score": 40.0,
                      **metrics.throughput_metrics(100.0, 1.0, 1.0, 0.0)})
    writers.close()
    assert _tags(tmp_path / "tensorboard") == {
        "train/reward_mean", "train/policy_loss", "eval/score", "speed/tokens_per_second",
        "speed/update_tokens_per_second", "speed/rollout_seconds", "speed/update_seconds", "speed/wait_seconds"}


def test_lines_of_steps_at_or_after_the_start_and_torn_lines_are_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 0, "r": 0.1}, {"step": 1, "r": 0.2}, {"step": 2, "r": 0.3}]
    path.write_text("".join(json.dumps(row) + "\n" for row in lines)
                    + '{"step": 3, "r": 0.' + '{"step": 2, "r": 0.3}\n'  # an older version's append to a torn line
                    + '{"step": 2, "r')  # and a torn last line
    keep_steps_before(path, 2)
    assert read_jsonl(path) == lines[:2] and path.read_text().endswith("}\n")
    keep_steps_before(path, 0)  # a run from scratch in the same directory
    assert path.read_text() == ""


def test_nothing_is_rewritten_when_nothing_is_to_drop(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n')
    inode = path.stat().st_ino
    keep_steps_before(path, 2)
    assert path.stat().st_ino == inode and read_jsonl(path) == [{"step": 0}, {"step": 1}]
    keep_steps_before(tmp_path / "absent.jsonl", 3)
    assert not (tmp_path / "absent.jsonl").exists()


def test_the_in_loop_evaluation_shows_in_the_progress_bar(tmp_path, capsys):
    """While it runs the bar's label says so; afterwards a line gives its score, and its seconds join the metrics."""
    writers = metrics.Writers(tmp_path, start=0, total=2)
    try:
        with writers.evaluating(0, 4) as timing:
            assert writers.bar.desc == "step 0: in-loop evaluation of 4 held-out profiles"
        assert writers.bar.desc == "train" and timing["eval_seconds"] >= 0
        writers.write(0, {"reward_mean": 0.04, "failure_rate_reward": 0.9, "user_left_rate": 0.0, "eval_score": 22.5,
                          "eval_user_left_rate": 0.25, **timing})
        assert "reward<0.1=0.9" in str(writers.bar) and "user_left=0" in str(writers.bar)
    finally:
        writers.close()
    assert "step 0: in-loop evaluation: held-out score 22.5" in capsys.readouterr().out


def test_staleness_is_counted_over_policy_tokens():
    """Versions behind step 5 of each trainable dialogue's policy tokens, by hand: 3 tokens written
    by version 5 (0 behind), 1 by version 4 (1), 2 by version 2 (3, beyond a bound of 2); a
    dialogue the simulator failed on is left out, as in training."""
    def dialogue(version, mask, error=False):
        return DialogueSequence(profile_id="p", group=0, tokens=[1] * len(mask), policy_mask=mask,
                                logprobs=[0.0] * len(mask), turn_ends=[mask.index(1)], emotions=[30.0],
                                end_reason="simulator_error" if error else "turn_limit", simulator_error=error,
                                policy_version=version)

    dialogues = [dialogue(5, [0, 1, 1, 0, 1]), dialogue(4, [0, 1]), dialogue(2, [1, 1, 0]),
                 dialogue(0, [1, 1, 1], error=True)]
    got = metrics.staleness_metrics(5, 2, dialogues)
    assert got == {"staleness_mean": (0 * 3 + 1 * 1 + 3 * 2) / 6, "staleness_max": 3.0, "stale_token_frac": 2 / 6}
    assert metrics.staleness_metrics(5, 3, dialogues)["stale_token_frac"] == 0.0
    assert metrics.staleness_metrics(5, 0, []) == {"staleness_mean": 0.0, "staleness_max": 0.0,
                                                   "stale_token_frac": 0.0}


def test_staleness_is_counted_per_token_by_its_turn():
    """A dialogue whose turns were written by versions 3, 4 and 5 (partial rollouts), at step 5
    with a bound of 1: its 6 policy tokens are 2, 2, 1, 1, 1 and 0 versions behind, by hand."""
    turns = [{"turn": k + 1, "policy_version": v} for k, v in enumerate([3, 4, 5])]
    seq = DialogueSequence(profile_id="p", group=0, tokens=[1] * 10, policy_mask=[0, 1, 1, 0, 0, 1, 1, 1, 0, 1],
                           logprobs=[0.0] * 10, turn_ends=[2, 7, 9], emotions=[30.0], end_reason="turn_limit",
                           policy_version=3, turns=turns)
    assert metrics.staleness_metrics(5, 1, [seq]) == {"staleness_mean": 7 / 6, "staleness_max": 2.0,
                                                      "stale_token_frac": 2 / 6}
