"""Experiment tracking on Weights & Biases, an optional dependency (`pip install -e '.[wandb]'`).

A training run with `config.train.wandb_project` set logs every step's metrics (the values of
metrics.jsonl), its config, and tables of dialogues, streamed to the W&B server (`online`, the
default: naming a project means uploading to it); `config.train.wandb_mode=offline` writes the run
under WORKDIR/wandb only (`wandb sync WORKDIR/wandb/offline-run-*` uploads it later). The W&B run
id is kept in WORKDIR/wandb_run_id, so a resumed training run continues the same W&B run.
Only one process of a multi-host run should log (process 0).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

WANDB_MODES = ("offline", "online")
INSTALL_HINT = "pip install -e '.[wandb]' (or pip install wandb)"
RUN_ID_FILE = "wandb_run_id"
TRANSCRIPT_COLUMNS = ("step", "profile", "group", "language", "end_reason", "final_emotion", "reward", "turns",
                      "emotions", "dialogue")


@dataclasses.dataclass(frozen=True)
class TrackingSettings:
    """The `config.train.wandb_*` fields and the run's work directory."""

    project: str = ""  # W&B project; empty: no tracking
    mode: str = "online"  # online: stream to the W&B server; offline: files under run_dir/wandb only
    run_dir: str = ""  # the run's work directory (W&B files, the kept run id)
    name: str = ""  # run name; empty: the work directory's name

    def __post_init__(self):
        if self.mode not in WANDB_MODES:
            raise ValueError(f"config.train.wandb_mode={self.mode!r}: use one of {WANDB_MODES}")
        if self.project and not self.run_dir:
            raise ValueError("config.workdir is empty: W&B tracking keeps its files in the work directory")

    @property
    def enabled(self) -> bool:
        return bool(self.project)

    @classmethod
    def from_config(cls, config: Any) -> TrackingSettings:
        """From a training ConfigDict: train.wandb_project, train.wandb_mode and workdir."""
        return cls(project=config.train.wandb_project, mode=config.train.wandb_mode, run_dir=config.workdir)


def _import_wandb(settings: TrackingSettings):
    try:
        import wandb
    except ImportError:
        raise ImportError(f"config.train.wandb_project={settings.project!r} logs to Weights & Biases, which is not "
                          f"installed: {INSTALL_HINT}; or leave config.train.wandb_project empty") from None
    return wandb


def dialogue_text(record: Mapping[str, Any]) -> str:
    """A transcript's conversation as plain text, one "role: content" paragraph per message."""
    names = {"user": "user", "assistant": "policy"}
    return "\n\n".join(f"{names.get(m['role'], m['role'])}: {m['content']}"
                       for m in record.get("messages", ()) if m.get("role") != "system")


def transcript_rows(step: int, records: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """One row of TRANSCRIPT_COLUMNS per transcript record."""
    return [[step, t.get("profile_id"), t.get("group"), t.get("language"), t.get("end_reason"),
             t.get("final_emotion"), t.get("reward"), len(t.get("turns", ())),
             " ".join(str(e) for e in t.get("emotions", ())), dialogue_text(t)] for t in records]


class WandbLogger:
    """One W&B run: `log(step, metrics)`, `log_config(config)`, `log_transcripts(step, records)`,
    `close()`. Build it with `create`, which gives None when tracking is off."""

    def __init__(self, settings: TrackingSettings, config: Mapping[str, Any] | None = None):
        self._wandb = wandb = _import_wandb(settings)
        run_dir = pathlib.Path(settings.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        id_file = run_dir / RUN_ID_FILE
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(6)  # W&B ids: [a-z0-9]
        id_file.write_text(run_id + "\n")
        self.run = wandb.init(
            project=settings.project, mode=settings.mode, dir=str(run_dir), id=run_id, resume="allow",
            name=settings.name or run_dir.resolve().name, config=dict(config or {}),
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True))

    @classmethod
    def create(cls, settings: TrackingSettings, config: Mapping[str, Any] | None = None) -> WandbLogger | None:
        return cls(settings, config) if settings.enabled else None

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """The finite numbers of `metrics` at `step` (a NaN or a string would break W&B's charts)."""
        values = {k: v for k, v in metrics.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        self.run.log(values, step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log_transcripts(self, step: int, records: Sequence[Mapping[str, Any]], key: str = "transcripts") -> None:
        """A table of dialogues (transcript records as written to WORKDIR/transcripts) at `step`."""
        table = self._wandb.Table(columns=list(TRANSCRIPT_COLUMNS), data=transcript_rows(step, records))
        self.run.log({key: table}, step=step)

    def close(self) -> None:
        """Finish the run. W&B's service writes the last records in the background; they are on
        disk once the process exits (or after `wandb.teardown()`)."""
        self.run.finish()
