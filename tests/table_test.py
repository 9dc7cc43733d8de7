"""The one table form (rlver_jax.table.Table) on toy rows, and the package's tables: each bound to
config fields that exist, their names on --print_config and in the docs' list."""

import pathlib
import re

import pytest

from configs import eval as eval_config
from configs import grpo_think
from rlver_jax.checks import InputError
from rlver_jax.cli import config_doc, tables
from rlver_jax.table import Table, UnknownNameError, first_clause

REPO = pathlib.Path(__file__).resolve().parents[1]


def _colours():
    return Table("config.paint.colour", {"red": 1, "green": 2}, also=("config.paint.trim",),
                 renamed={"rouge": "red"}, summary=lambda n: "warm" if n == 1 else "")


def test_a_lookup_gives_the_row_or_one_error_naming_the_field_and_the_names():
    t = _colours()
    assert t.row("green") == t["green"] == 2 and t.check("red") == "red"
    assert list(t) == ["red", "green"] and len(t) == 2 and dict(t.items()) == {"red": 1, "green": 2}
    assert "red" in t and "blue" not in t and t.get("blue") is None and t.get("red") == 1
    with pytest.raises(UnknownNameError, match=r"^config\.paint\.colour='blue': use one of red \| green$") as e:
        t.row("blue")
    assert isinstance(e.value, InputError)  # exit 2 in the launch/ scripts
    with pytest.raises(UnknownNameError, match=r"^config\.paint\.trim='blue': use one of red \| green$"):
        t.row("blue", "config.paint.trim")
    with pytest.raises(UnknownNameError, match=r"^config\.paint\.colour='blue'"):
        t["blue"]


def test_an_old_name_is_refused_with_the_new_one():
    with pytest.raises(UnknownNameError, match=r"^config\.paint\.colour='rouge' is now called 'red': "
                                               r"use --config\.paint\.colour=red$"):
        _colours().row("rouge")
    with pytest.raises(ValueError, match="renamed names"):
        Table("config.x", {"a": 1}, renamed={"b": "c"})  # no row c
    with pytest.raises(ValueError, match="renamed names"):
        Table("config.x", {"a": 1, "b": 2}, renamed={"b": "a"})  # b is still a row


def test_words_describe_where_and_fields():
    t = _colours()
    assert t.words() == "red | green"
    assert t.describe() == ["red: warm", "green"]
    assert Table("config.x", {"a": 1}).describe() == ["a"]
    assert t.where(lambda n: n > 1) == ("green",)
    assert t.fields == ("config.paint.colour", "config.paint.trim")
    assert repr(t) == "Table(config.paint.colour: red | green)"
    assert first_clause("The paper's reward. Turn credit from the changes.") == "The paper's reward"
    assert first_clause("Each change / 100 on its turn; the dialogue's reward stays the paper's.") == \
        "Each change / 100 on its turn"
    assert first_clause(None) == ""


def test_a_row_added_for_a_block_is_seen_by_every_reader_then_gone():
    t = _colours()
    with t.added("blue", 3) as row:
        assert row == 3 and t.row("blue") == 3 and t.words() == "red | green | blue"
    assert "blue" not in t
    with pytest.raises(ValueError, match="'red' is a row already"):
        with t.added("red", 9):
            pass
    with pytest.raises(RuntimeError):
        with t.added("blue", 3):
            raise RuntimeError("a failing test")
    assert "blue" not in t  # gone after an error too


def _config_fields(config) -> set[str]:
    return {path for path, _ in config_doc.leaves(config)}


def test_every_table_is_bound_to_fields_of_the_configs():
    """Each table's fields are fields of the training or the evaluation config, and no two tables
    claim one field."""
    known = _config_fields(grpo_think.get_config("tiny")) | _config_fields(eval_config.get_config("tiny"))
    bound = [field.removeprefix("config.") for t in tables.tables() for field in t.fields]
    assert set(bound) <= known, set(bound) - known
    assert len(bound) == len(set(bound))
    assert {"rl.algo", "rl.estimator", "rl.policy_loss", "rl.loss_agg_mode", "rl.value_loss_agg_mode",
            "rl.kl_estimator", "rl.off_policy_correction", "rl.reward_mode", "train.offload", "simulator.backend",
            "policy.backend", "eval.probes"} <= set(bound)


def test_print_config_ends_a_table_field_with_its_names():
    config = grpo_think.get_config("tiny")
    lines = config_doc.describe(config, REPO / "configs" / "grpo_think.py").splitlines()
    algo = next(line for line in lines if line.startswith("rl.algo = "))
    assert algo.endswith("(one of: ppo | grpo | rloo | reinforce_pp | reinforce_pp_baseline | drgrpo | dapo | gspo | "
                         "cispo)")
    assert next(line for line in lines if line.startswith("rl.value_loss_agg_mode = ")).endswith(
        "(one of: token_mean | seq_mean_token_mean | seq_mean_token_sum_norm)")
    assert not any("one of:" in line for line in lines if line.startswith("rl.lam = "))


def test_the_docs_list_the_tables_as_the_tables_do():
    """docs/architecture.md shows `python -m rlver_jax.cli.tables`; rerun it there when a table changes."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    shown = re.search(r"\$ \.venv/bin/python -m rlver_jax\.cli\.tables\n(.*?)\n```", text, re.S)
    assert shown, "docs/architecture.md lacks the tables' list"
    assert shown.group(1) == tables.listing()
