"""PNG figures: the training curves (reward.png) draw each quantity on its own axis, every line
in its panel's legend."""

import numpy as np
import pytest

from rlver_jax import plots
from rlver_jax.files import append_jsonl


def _rows(n=25, eval_every=10):
    rows = []
    for step in range(n):
        row = {"step": step, "reward_mean": step / 100, "emotion_mean": 30 + step, "format_failure_rate": 1 - step / n,
               "failure_rate_reward": 1 - step / (2 * n)}
        if (step + 1) % eval_every == 0:
            row["eval_score"] = 40.0 + step
        rows.append(row)
    return rows


def _lines(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def test_every_line_has_a_legend_entry_and_the_held_out_score_its_own_axis():
    rows = _rows()
    fig = plots.training_figure(rows, title="run")
    reward_ax, emotion_ax, format_ax = fig.axes
    for ax in fig.axes:
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [line.get_label() for line in ax.get_lines()]
    assert set(_lines(reward_ax)) == {"reward (batch mean)", "reward (10-step mean)"}
    assert not any("held-out" in label for label in _lines(reward_ax))
    held_out = _lines(emotion_ax)["held-out score (in-loop evaluation)"]
    np.testing.assert_array_equal(held_out.get_xdata(), [9, 19])
    np.testing.assert_array_equal(held_out.get_ydata(), [49.0, 59.0])  # the score itself, not / 100
    np.testing.assert_allclose(_lines(reward_ax)["reward (10-step mean)"].get_ydata(),
                               [np.mean([s / 100 for s in range(k, k + 10)]) for k in range(16)])
    np.testing.assert_array_equal(_lines(emotion_ax)["training (batch mean)"].get_ydata(), [30 + s for s in range(25)])
    assert list(_lines(format_ax)) == ["dialogues rewarded < 0.1 (training batch)", "format failures (training batch)"]
    np.testing.assert_allclose(_lines(format_ax)["dialogues rewarded < 0.1 (training batch)"].get_ydata()[[0, 5]],
                               [1.0, 0.9])  # 1 - 5 / 50
    assert "0 if a format failure ended it" in reward_ax.get_ylabel()  # the reward says what it is


def test_a_ten_step_run_lists_no_ten_step_mean():
    """Ten steps give one point of a 10-step mean: nothing drawn, so nothing in the legend."""
    reward_ax = plots.training_figure(_rows(n=10)).axes[0]
    assert list(_lines(reward_ax)) == ["reward (batch mean)"]
    assert set(_lines(plots.training_figure(_rows(n=11)).axes[0])) == {"reward (batch mean)", "reward (10-step mean)"}


def test_a_run_without_evaluations_or_format_failures_draws_the_reward_alone(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    for step in range(5):
        append_jsonl(metrics, {"step": step, "reward_mean": 0.1 * step})
    fig = plots.training_figure([{"step": s, "reward_mean": 0.1 * s} for s in range(5)])
    [ax] = fig.axes
    assert list(_lines(ax)) == ["reward (batch mean)"]  # fewer than 10 steps: no moving mean
    out = plots.training_curves(metrics, tmp_path / "reward.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="no metrics"):
        plots.training_curves(tmp_path / "empty.jsonl", tmp_path / "x.png")


def test_the_evaluation_figures_name_how_dialogues_ended_in_words(tmp_path, monkeypatch):
    """trajectories.png and final_emotions.png: the legend says "user left (floor)", not `failure`."""
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or path)
    transcripts = [{"simulator_error": False, "emotions": e, "end_reason": r, "final_emotion": e[-1]}
                   for e, r in (([40, 70, 100], "success"), ([40, 5], "failure"), ([40, 40], "format_failure"))]
    plots.emotion_trajectories(transcripts, tmp_path / "t.png", title="t", levels=(10,))
    plots.final_emotion_histogram(transcripts, tmp_path / "f.png", title="f")
    for fig in figures:
        legend = {t.get_text() for t in fig.axes[0].get_legend().get_texts()}
        assert {"success (reached 100)", "user left (floor)", "format failure"} <= legend, legend
        assert not {"success", "failure", "format_failure"} & legend, legend
