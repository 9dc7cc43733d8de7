"""metrics.jsonl after a kill: a run starting at step S keeps each earlier step's line once and
drops the lines of steps >= S and torn lines."""

import json

from rlver_jax.files import read_jsonl
from rlver_jax.metrics import keep_steps_before


def test_lines_of_steps_at_or_after_the_start_and_torn_lines_are_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 0, "r": 0.1}, {"step": 1, "r": 0.2}, {"step": 2, "r": 0.3}]
    path.write_text("".join(json.dumps(l) + "\n" for l in lines)
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
