"""The HTML pages (rlver_jax.eval.html_report, rlver_jax.eval.run_view): content, escaping, figures.

Transcripts come from real dialogues (tests/fixtures_report.py), so the pages are tested on
records exactly as the rollout writes them.
"""

import base64
import hashlib
import html.parser
import os
import time

import pytest

from rlver_jax.eval import compare, html_report, run_view
from rlver_jax.files import atomic_write_jsonl, read_jsonl
from rlver_jax.simulator.profiles import load_profiles
from tests.conftest import REPO
from tests.fixtures_cli import run_script
from tests.fixtures_report import (
    BROKEN_ID,
    COLD,
    GARBAGE,
    HOSTILE,
    WARM,
    eval_dir,
    eval_fixture,
    fixture_profiles,
    long_dialogues,
    make_transcripts,
    summary_of,
    training_run,
)


class _Page(html.parser.HTMLParser):
    """Text per element id (the text inside an element with that id), every start tag, the
    rows of the table with id `table`, and script contents."""

    def __init__(self, table="dialogues"):
        super().__init__(convert_charrefs=True)
        self.table, self.tags, self.scripts, self.rows, self.text = table, [], [], [], {}
        self._open, self._in_table, self._in_script = [], False, False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "table":
            self._in_table = a.get("id") == self.table
        if tag == "tr" and self._in_table and "data-open" in a:
            self.rows.append(a)
        if tag == "script":
            self._in_script = True
            self.scripts.append("")
        if "id" in a:
            self._open.append([a["id"], tag, 0])
            self.text.setdefault(a["id"], "")
        for item in self._open:
            if item[1] == tag:
                item[2] += 1

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False
        if tag == "table":
            self._in_table = False
        for item in list(self._open):
            if item[1] == tag:
                item[2] -= 1
                if item[2] == 0:
                    self._open.remove(item)

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data
        for ident, _, _ in self._open:
            self.text[ident] += data


def parse(page, table="dialogues"):
    p = _Page(table)
    p.feed(page)
    return p


def test_every_dialogue_and_turn_is_on_the_page():
    transcripts = eval_fixture()
    page = html_report.render_eval(summary_of(transcripts), transcripts)
    p = parse(page)
    assert len(p.rows) == len(transcripts)
    for i, t in enumerate(transcripts):
        row, text = p.rows[i], p.text[f"dlg-{i}"]
        assert row["data-open"] == f"dlg-{i}" and row["data-id"] == t["profile_id"]
        assert (row["data-end"], row["data-lang"], float(row["data-final"]), int(row["data-turns"])) == \
            (t["end_reason"], t["language"], t["final_emotion"], len(t["turns"]))
        assert row["data-cha"] == t["simulator_state"]["profile"]["main_cha"]
        assert t["simulator_state"]["profile"]["task"] in text
        assert t["messages"][1]["content"] in text  # the user's opening line
        for turn in t["turns"]:
            assert turn["reply"] in text
            if turn.get("user"):
                assert turn["user"] in text
            if turn.get("simulator_thoughts"):
                assert turn["simulator_thoughts"] in text
    assert len({t["end_reason"] for t in transcripts}) >= 2  # the filters have something to tell apart


def test_hostile_text_shows_as_text_and_never_as_markup():
    transcripts = eval_fixture()
    page = html_report.render_eval(summary_of(transcripts), transcripts)
    for raw in ("<img src=x", "<script>window.pwned", "</script><script>", "<!-- \"", 'onclick="window'):
        assert raw not in page
    p = parse(page)
    assert [t for t, _ in p.tags].count("script") == 1 and "img" not in [t for t, _ in p.tags]
    assert not any(k.startswith("on") for _, a in p.tags for k in a)
    hostile = next(i for i, t in enumerate(transcripts) if any(x["reply"] == HOSTILE for x in t["turns"]))
    assert HOSTILE in p.text[f"dlg-{hostile}"]
    # The only script is the page's own, allowed by its hash and nothing else.
    csp = next(a["content"] for t, a in p.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy")
    digest = base64.b64encode(hashlib.sha256(p.scripts[0].encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp and "default-src 'none'" in csp


def test_thinking_is_folded_and_simulator_errors_are_prominent():
    think = make_transcripts([[f"<think>plan: {HOSTILE}</think>{WARM}"]], think=True)
    broken = dict(think[0], profile_id=BROKEN_ID, end_reason="simulator_error", simulator_error=True,
                  simulator_state={**think[0]["simulator_state"], "error": "malformed answer <b>x</b>"})
    transcripts = think + [broken]
    summary = summary_of(transcripts)
    page = html_report.render_eval(summary, transcripts)
    p = parse(page)
    details = [a for t, a in p.tags if t == "details" and a.get("class") == "thinking"]
    assert len(details) == 2 * len(think[0]["turns"]) and all("open" not in a for a in details)
    assert p.rows[1]["data-id"] == BROKEN_ID and "<script>window.pwned=4" not in page
    assert f"plan: {HOSTILE}" in p.text["dlg-0"]
    assert "malformed answer <b>x</b>" in p.text["dlg-1"]
    assert summary["simulator_errors"] == 1
    assert '<div class="card alert"><div class="label">simulator errors</div><div class="value">1</div>' in page
    assert '<p class="alert">1 dialogue ended in a simulator error' in page
    clean = html_report.render_eval(summary_of(think), think)
    assert 'class="card alert"' not in clean and '<p class="alert">' not in clean


def test_histogram_and_chart_geometry():
    h = html_report.histogram([0, 5, 10, 55, 100, 100, 99.9], bins=10, width=120, height=100, pad=10)
    assert [b["count"] for b in h["bars"]] == [2, 1, 0, 0, 0, 1, 0, 0, 0, 3]
    assert h["bars"][9]["h"] == 80 and h["bars"][0]["h"] == pytest.approx(80 * 2 / 3, abs=0.05)
    c = html_report.emotion_chart([[40, 100, 0]], width=120, height=100, pad=10)
    assert c["series"] == [[(10, 58.0, 40), (60, 10, 100), (110, 90, 0)]]
    line = html_report.line_chart([0, 10, 20], {"a": [0.0, None, 1.0]}, 0.0, 1.0, width=100, height=100, pad=10)
    assert line["lines"]["a"]["points"] == "10.0,90.0 90.0,10.0"


def test_step_groups_show_the_trainers_advantages():
    """Each dialogue shows the advantage its record carries (the training loop writes the
    trainer's); none for a dialogue left out of training, for a transcript written without
    advantages, or with PPO (per-token advantages)."""
    records = make_transcripts([[WARM], [GARBAGE], [COLD]], profiles=load_profiles()[:1], n=3, eval_mode=False,
                               step=0)
    records = [dict(r, advantage=a) for r, a in zip(records, [0.7, -0.7, 0.3])]
    records[2] = dict(records[2], simulator_error=True, end_reason="simulator_error")
    [group] = run_view.step_groups(records, run_view.AdvantageSettings())
    assert [a for _, a in group["dialogues"]] == [0.7, -0.7, None]
    unsaved = [{k: v for k, v in r.items() if k != "advantage"} for r in records]
    assert [a for _, a in run_view.step_groups(unsaved, run_view.AdvantageSettings())[0]["dialogues"]] == [None] * 3
    ppo = run_view.step_groups(records, run_view.AdvantageSettings(per_dialogue=False))
    assert all(a is None for _, a in ppo[0]["dialogues"])


def test_write_outputs_and_view_rewrite_report_html(tmp_path):
    transcripts = eval_fixture()
    summary = eval_dir(tmp_path, transcripts)
    first = (tmp_path / "report.html").read_text()
    assert "Sentient benchmark: scripted &lt;b&gt;policy&lt;/b&gt;" in first
    assert f"{summary['success']} / {summary['n']}" in first
    (tmp_path / "report.html").unlink()
    proc = run_script("view.py", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert str(tmp_path / "report.html") in proc.stdout
    assert (tmp_path / "report.html").read_text() == first


def test_compare_page_pairs_dialogues_by_profile(tmp_path):
    a = eval_fixture()
    b = make_transcripts([[WARM], [WARM], [WARM], [COLD], [WARM], [GARBAGE]], fixture_profiles(), max_turns=6)
    assert [t["profile_id"] for t in a] == [t["profile_id"] for t in b]
    eval_dir(tmp_path / "a", a)
    eval_dir(tmp_path / "b", b)
    result = compare.compare_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "cmp")
    page = (tmp_path / "cmp" / "compare.html").read_text()
    p = parse(page, table="pairs")
    assert len(p.rows) == len(a) == result["paired_profiles"]
    for i, (ta, tb) in enumerate(zip(a, b)):
        row = p.rows[i]
        assert row["data-open"] == f"pair-{i}" and row["data-id"] == ta["profile_id"]
        assert float(row["data-diff0"]) == tb["final_emotion"] - ta["final_emotion"]
        pair = [(tag, attrs) for tag, attrs in p.tags if attrs.get("data-profile") == ta["profile_id"]]
        assert len(pair) == 2  # both runs' dialogues of this profile
        text = p.text[f"pair-{i}"]
        assert all(x["reply"] in text for x in ta["turns"] + tb["turns"])


def test_training_run_view(tmp_path):
    metrics = training_run(tmp_path)
    index = run_view.write_run_view(tmp_path)
    assert index == tmp_path / "view" / "index.html"
    page = index.read_text()
    for m in metrics:
        assert f'data-step="{m["step"]}" data-href="train_{m["step"]:06d}.html"' in page
    assert 'href="eval_000001.html"' in page and "best eval score (step 1)" in page
    # Legends in words (the key in the line's tooltip), and the metrics glossary of this checkout linked.
    assert "</i>final emotion (training)</span>" in page and "</i>emotion_mean</span>" not in page
    assert run_view.GLOSSARY == (REPO / "docs" / "metrics.md").as_uri() and (REPO / "docs" / "metrics.md").is_file()
    step = (tmp_path / "view" / "train_000001.html").read_text()
    assert page.count(f'<a href="{run_view.GLOSSARY}">docs/metrics.md</a>') == 1
    assert step.count(f'<a href="{run_view.GLOSSARY}">docs/metrics.md</a>') == 1
    records = read_jsonl(tmp_path / "transcripts" / "train_000001.jsonl")
    p = parse(step)
    groups = run_view.step_groups(records, run_view.AdvantageSettings())
    assert len(groups) == 2 and all(len(g["dialogues"]) == 2 for g in groups)
    for g in groups:
        for d, adv in g["dialogues"]:
            assert f'dialogue {d["index"] % 2 + 1}: reward {d["reward"]:.3f}' in p.text[f"dlg-{d['index']}"]
    shown = ["+0.250", "-0.250", "0.000", "+1.500"]  # the records' advantages
    for i, text in enumerate(shown):
        assert f"advantage {text}" in p.text[f"dlg-{i}"]
    assert 'href="train_000000.html" rel="prev"' in step and 'rel="next"' not in step
    assert "in-loop evaluation" in (tmp_path / "view" / "eval_000001.html").read_text()
    # A rerun rewrites only the pages whose transcripts changed.
    pages = {f: (tmp_path / "view" / f).stat().st_mtime_ns for f in ("train_000000.html", "train_000001.html")}
    time.sleep(0.05)
    os.utime(tmp_path / "transcripts" / "train_000001.jsonl")
    run_view.write_run_view(tmp_path)
    assert (tmp_path / "view" / "train_000000.html").stat().st_mtime_ns == pages["train_000000.html"]
    assert (tmp_path / "view" / "train_000001.html").stat().st_mtime_ns > pages["train_000001.html"]


def test_view_refuses_a_directory_that_is_no_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither metrics.jsonl nor transcripts"):
        run_view.write_run_view(tmp_path)
    proc = run_script("view.py", str(tmp_path))
    assert proc.returncode != 0 and "neither metrics.jsonl nor transcripts" in proc.stderr


def test_large_pages_stay_small_and_fast(tmp_path):
    """100 dialogues x 10 turns on one page; a 1000-step run's index (the step pages apart). Render
    and load times are measured in docs/report.md, not here."""
    dialogues = long_dialogues()
    page = html_report.render_eval(summary_of(dialogues), dialogues)
    assert len(parse(page).rows) == 100 and len(page) < 2 * 100 * 10 * 2 * 1500
    metrics = [{"step": s, "reward_mean": s / 1000, "emotion_mean": 30 + s / 100, **({"eval_score": 40.0} if s % 25 == 0
               else {})} for s in range(1000)]
    atomic_write_jsonl(tmp_path / "metrics.jsonl", metrics)
    index = run_view.write_run_view(tmp_path).read_text()
    assert index.count("<tr data-step=") == 1000 and len(index) < 1_500_000
