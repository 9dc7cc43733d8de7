"""Where a run's numbers go: TensorBoard tags grouped into train/, eval/ and speed/ sections."""

import struct

from tensorboardX.proto import event_pb2

from rlver_jax import metrics


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
