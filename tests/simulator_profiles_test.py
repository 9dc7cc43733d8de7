"""Profiles: the shipped set, the reference data, validation errors, language detection."""

import collections
import json

import pytest

from rlver_jax.simulator import profiles as P


def test_shipped_profiles_cover_types_goals_and_languages():
    shipped = P.load_profiles()
    assert len(shipped) >= 12
    assert len({p.id for p in shipped}) == len(shipped)
    assert all(p.first_talk for p in shipped)
    by_language = collections.Counter(p.language for p in shipped)
    assert by_language["zh"] >= 4 and by_language["en"] >= 4
    assert {p.personality for p in shipped} == {"negative", "passive", "avoidant"}
    assert {p.goal for p in shipped} == set(P.GOALS)
    for language in ("zh", "en"):  # every goal in each language
        assert {p.goal for p in shipped if p.language == language} == set(P.GOALS)


def test_english_profiles_are_english_and_extend_the_shipped_ones():
    """data/profiles_en.jsonl (the smol presets'): every profile English with a known goal and an
    opening, the shipped English ones first, line for line, then at least 32 of its own."""
    english = P.load_profiles(P.ENGLISH_PROFILES)
    assert len(english) >= 40
    assert len({p.id for p in english}) == len(english)
    assert all(p.language == "en" and p.goal is not None and p.first_talk for p in english)
    shipped = [p for p in P.load_profiles() if p.language == "en"]
    assert english[:len(shipped)] == shipped
    lines = P.ENGLISH_PROFILES.read_text(encoding="utf-8").splitlines()
    assert lines[:len(shipped)] == [row for row in P.DEFAULT_PROFILES.read_text(encoding="utf-8").splitlines()
                                    if json.loads(row)["id"] in {p.id for p in shipped}]
    assert {p.goal for p in english} == set(P.GOALS)
    counts = collections.Counter(p.personality for p in english)
    assert set(counts) == {"negative", "passive", "avoidant"} and min(counts.values()) >= 8


def test_every_reference_profile_loads(shared_profiles_dir):
    files = sorted(shared_profiles_dir.glob("*.jsonl"))
    assert files
    for path in files:
        loaded = P.load_profiles(path)
        lines = [row for row in path.read_text(encoding="utf-8").splitlines() if row.strip()]
        assert len(loaded) == len(lines)
        assert all(p.language == "zh" for p in loaded)
        assert all(p.goal is not None for p in loaded), "a reference task is not a known goal"
        if path.name.startswith("test"):
            assert all(p.first_talk for p in loaded)


def _good(**changes):
    record = dict(id="a", player="* Name: Ann", scene="She lost her job.", main_cha="passive",
                  cha_group=["shy"], task="You want advice.", first_talk="Hi.")
    record.update(changes)
    return {k: v for k, v in record.items() if v is not DELETE}


DELETE = object()


def test_broken_lines_name_file_line_and_field(tmp_path):
    lines = [
        json.dumps(_good()),                                   # 1 fine
        "{not json",                                           # 2
        json.dumps(_good(id="b", scene=DELETE)),               # 3 missing field
        json.dumps(_good(id="c", cha_group="shy")),            # 4 wrong type
        json.dumps(_good(id="d", main_cha="grumpy")),          # 5 unknown personality
        json.dumps(_good(id="e", frist_talk="typo")),          # 6 unknown field
        "",                                                    # 7 blank: skipped
        json.dumps(_good(id="f", first_talk="  ")),            # 8 empty optional
        json.dumps(_good()),                                   # 9 duplicate id "a"
        json.dumps(["a", "list"]),                             # 10 not an object
        json.dumps(_good(id="g", player=3)),                   # 11 wrong type
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(P.ProfileError) as info:
        P.load_profiles(path)
    message = "\n".join(info.value.problems)  # every problem; the message shows the first few
    expected = [
        (2, "not valid JSON"),
        (3, "field 'scene': missing"),
        (4, "field 'cha_group'"),
        (5, "field 'main_cha': 'grumpy'"),
        (6, "field 'frist_talk': unknown field"),
        (8, "field 'first_talk'"),
        (9, "field 'id': duplicate id 'a' (first on line 1)"),
        (10, "expected a JSON object"),
        (11, "field 'player': expected a string"),
    ]
    for line, text in expected:
        assert any(entry.startswith(f"{path}:{line}: ") and text in entry for entry in message.splitlines()), (
            line, text, message)
    assert f"{path}:1:" not in message and f"{path}:7:" not in message
    shown = str(info.value).splitlines()
    assert shown[:P.SHOWN_PROBLEMS] == message.splitlines()[:P.SHOWN_PROBLEMS]
    more = len(expected) - P.SHOWN_PROBLEMS
    assert shown[-1] == f"{path}: ... and {more} more problems ({len(expected)} on 9 lines in all)"


def test_many_broken_lines_make_one_short_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("{not json\n" * 10_000, encoding="utf-8")
    with pytest.raises(P.ProfileError) as info:
        P.load_profiles(path)
    lines = str(info.value).splitlines()
    assert len(lines) == P.SHOWN_PROBLEMS + 1 == 6
    assert all(line.startswith(f"{path}:{n}: not valid JSON") for n, line in enumerate(lines[:-1], start=1))
    assert lines[-1] == f"{path}: ... and 9995 more problems (10000 on 10000 lines in all)"
    assert len(info.value.problems) == 10_000 and info.value.problems[-1].startswith(f"{path}:10000: ")


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(P.ProfileError, match="not found"):
        P.load_profiles(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(P.ProfileError, match="no profiles"):
        P.load_profiles(tmp_path / "empty.jsonl")


def test_unicode_line_separators_are_text_and_bad_bytes_are_named(tmp_path):
    texts = {"player": "* Name: Ann\u2028* Age: 30", "scene": "She lost\u0085her job.\u2029Again.",
             "first_talk": "Hi\u2028there \x00 你好"}
    path = tmp_path / "odd.jsonl"
    lines = [json.dumps(_good(**texts), ensure_ascii=False), json.dumps(_good(id="b"), ensure_ascii=False)]
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode("utf-8"))  # with a byte-order mark
    loaded = P.load_profiles(path)
    assert [p.id for p in loaded] == ["a", "b"]
    assert (loaded[0].player, loaded[0].scene, loaded[0].first_talk) == (
        texts["player"], texts["scene"], texts["first_talk"])

    path.write_bytes(lines[0].encode("utf-8") + b"\n" + lines[1].encode("utf-8").replace(b"Ann", b"\xe9ve"))
    with pytest.raises(P.ProfileError, match=rf"{path}:2: not UTF-8 text \(byte 0xe9 at byte \d+ of the line\)"):
        P.load_profiles(path)


def test_a_directory_is_named(tmp_path):
    with pytest.raises(P.ProfileError, match=f"{tmp_path}: is a directory"):
        P.load_profiles(tmp_path)


def test_profile_round_trip_and_optional_first_talk():
    profile = P.parse_profile(_good(first_talk=DELETE))
    assert profile.first_talk is None
    assert "first_talk" not in profile.to_dict()
    assert P.parse_profile(profile.to_dict()) == profile
    assert P.parse_profile(_good(main_cha="被动型")).personality == "passive"


@pytest.mark.parametrize("text,language", [
    ("最近有点烦，总感觉有人盯着我似的。", "zh"),
    ("I keep replaying the fight in my head.", "en"),
    ("我今天和 manager 吵了一架，真的很 annoying。", "zh"),
    ("My friend 小雨 stopped answering my messages weeks ago and I am worried.", "en"),
    ("", "en"),
])
def test_detect_language(text, language):
    assert P.detect_language(text) == language


def test_goal_kinds_recognise_both_languages_and_punctuation():
    assert P.goal_kind("你希望对方辩证地分析事件中的问题。") == "balanced_view"
    assert P.goal_kind(P.goal_text("praise", "en").upper()) == "praise"
    assert P.goal_kind("You want a pony.") is None


def test_sage_builder_fields_are_ignored_with_one_warning(tmp_path, caplog):
    """SAGE's profile builder adds `topic` and `3-question`: accepted, ignored, one warning for the
    file; a misspelt field is still an error."""
    lines = [json.dumps(_good(id=i, topic="work", **{"3-question": ["q1", "q2", "q3"]})) for i in ("a", "b")]
    path = tmp_path / "sage.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    with caplog.at_level("WARNING"):
        loaded = P.load_profiles(path)
    assert [p.id for p in loaded] == ["a", "b"] and loaded[0] == P.parse_profile(_good(id="a"))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "'3-question', 'topic'" in warnings[0]
    path.write_text(json.dumps(_good(topci="work")), encoding="utf-8")
    with pytest.raises(P.ProfileError, match="field 'topci': unknown field"):
        P.load_profiles(path)
