"""Weights & Biases logging (rlver_jax.train.tracking), in offline mode: the offline run's own files
are read back record by record, independently of the logger."""

import json
import math
import pathlib
import sys

import pytest

from configs.grpo_think import get_config
from rlver_jax.train import tracking

_BLOCK = 32768  # the record-log block size of W&B's transaction log (the LevelDB log format)
_HEADER = 7  # ":W&B", 2 bytes of magic, 1 byte of version; then every record has a 7-byte header too


def _log_records(path: pathlib.Path) -> list[bytes]:
    """The records of a run-ID.wandb transaction log: chunks of (crc32, length, type) + data,
    type 1 a whole record, 2/3/4 its first, middle and last pieces; block tails under 7 bytes are padding."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, out, partial = _HEADER, [], b""
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:
            pos += _BLOCK - pos % _BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            partial = chunk
        elif kind == 3:
            partial += chunk
        elif kind == 4:
            out.append(partial + chunk)
    return out


def _offline_run(run_dir: pathlib.Path):
    """(history rows by step, config) of every offline run under run_dir/wandb, oldest first."""
    from wandb.proto import wandb_internal_pb2 as pb
    history, config = {}, {}
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        for data in _log_records(path):
            r = pb.Record()
            r.ParseFromString(data)
            kind = r.WhichOneof("record_type")
            if kind == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                history.setdefault(row["_step"], {}).update(row)
            elif kind in ("run", "config"):
                items = r.run.config.update if kind == "run" else r.config.update
                config.update({i.key: json.loads(i.value_json) for i in items})
    return history, config


def _records():
    return [{"profile_id": "p1", "group": 0, "language": "en", "end_reason": "turn_limit", "final_emotion": 55,
             "emotions": [40, 48, 55], "turns": [{}, {}], "reward": 0.55,
             "messages": [{"role": "system", "content": "be kind"}, {"role": "user", "content": "hi there"},
                          {"role": "assistant", "content": "<script>hello</script>"}]},
            {"profile_id": "p2", "group": 0, "language": "zh", "end_reason": "failure", "final_emotion": 5,
             "emotions": [40, 5], "turns": [{}], "reward": 0.05, "messages": []}]


def test_off_unless_a_project_is_given_and_the_config_has_the_fields():
    settings = tracking.TrackingSettings.from_config(get_config("tiny"))
    assert settings == tracking.TrackingSettings(project="", mode="online", run_dir="runs/grpo_think_tiny")
    assert tracking.WandbLogger.create(settings) is None


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="config.train.wandb_mode='cloud'"):
        tracking.TrackingSettings(project="p", mode="cloud", run_dir="x")


def test_absent_wandb_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    settings = tracking.TrackingSettings(project="rlver", run_dir=str(tmp_path))
    with pytest.raises(ImportError, match=r"config.train.wandb_project='rlver'.*pip install -e '\.\[wandb\]'"):
        tracking.WandbLogger.create(settings)


def test_dialogue_text_and_rows():
    rows = tracking.transcript_rows(3, _records())
    assert rows[0] == [3, "p1", 0, "en", "turn_limit", 55, 0.55, 2, "40 48 55",
                       "user: hi there\n\npolicy: <script>hello</script>"]
    assert rows[1][-1] == "" and len(rows[1]) == len(tracking.TRANSCRIPT_COLUMNS)


@pytest.mark.slow  # wandb's service process
def test_offline_run_holds_metrics_config_and_transcripts(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="wandb is an optional extra: pip install -e '.[wandb]'")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    settings = tracking.TrackingSettings(project="rlver-test", mode="offline", run_dir=str(run_dir))
    logger = tracking.WandbLogger.create(settings, {"rl": {"algo": "grpo"}})
    logger.log(0, {"reward_mean": 0.25, "emotion_mean": 31.5, "bad": math.nan, "note": "text"})
    logger.log_config({"train": {"steps": 2}})
    logger.log(1, {"reward_mean": 0.5, "eval_score": 42.0})
    logger.log_transcripts(1, _records())
    logger.close()
    wandb.teardown()  # waits until the service has written the run's files (as at interpreter exit)
    run_id = (run_dir / tracking.RUN_ID_FILE).read_text().strip()
    history, config = _offline_run(run_dir)
    assert {k: history[0][k] for k in ("reward_mean", "emotion_mean")} == {"reward_mean": 0.25, "emotion_mean": 31.5}
    assert "bad" not in history[0] and "note" not in history[0]
    assert history[1]["reward_mean"] == 0.5 and history[1]["eval_score"] == 42.0
    assert history[1]["transcripts/nrows"] == 2 and history[1]["transcripts/ncols"] == len(tracking.TRANSCRIPT_COLUMNS)
    assert config["rl"] == {"algo": "grpo"} and config["train"] == {"steps": 2}
    [table] = run_dir.glob(f"wandb/offline-run-*-{run_id}/files/" + history[1]["transcripts/path"])
    saved = json.loads(table.read_text())
    assert saved["columns"] == list(tracking.TRANSCRIPT_COLUMNS)
    assert saved["data"] == json.loads(json.dumps(tracking.transcript_rows(1, _records())))
    # A resumed training run continues the same W&B run.
    again = tracking.WandbLogger.create(settings)
    again.log(2, {"reward_mean": 0.75})
    again.close()
    wandb.teardown()
    assert (run_dir / tracking.RUN_ID_FILE).read_text().strip() == run_id
    assert len(list(run_dir.glob(f"wandb/offline-run-*-{run_id}"))) >= 1
    assert _offline_run(run_dir)[0][2]["reward_mean"] == 0.75
