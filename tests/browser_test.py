"""The HTML pages in a real browser: headless Chromium driven by selenium.

Needs Debian's `chromium` and `chromium-driver` (apt-get install chromium chromium-driver) and
selenium (the test extra); skips, saying which is missing, without them.
"""

import pathlib
import shutil
import tempfile

import pytest

from rlver_jax.eval import compare, run_view
from tests.fixtures_report import (
    COLD,
    GARBAGE,
    HOSTILE,
    WARM,
    eval_dir,
    eval_fixture,
    fixture_profiles,
    make_transcripts,
    training_run,
)

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed: pip install -e '.[test]'")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
CHROMEDRIVER = shutil.which("chromedriver")
if not (CHROMIUM and CHROMEDRIVER):
    pytest.skip("no headless browser: install Debian's chromium and chromium-driver "
                "(apt-get install chromium chromium-driver) to run the browser tests", allow_module_level=True)


@pytest.fixture(scope="module")
def browser():
    profile = tempfile.mkdtemp(prefix="rlver_chromium_")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1000",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: selenium's driver manager would otherwise look on the network.
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    root = tmp_path_factory.mktemp("pages")
    a, b = eval_fixture(), make_transcripts([[WARM], [WARM], [WARM], [COLD], [WARM], [GARBAGE]], fixture_profiles(),
                                            max_turns=6)
    eval_dir(root / "a", a)
    eval_dir(root / "b", b)
    compare.compare_runs([root / "a", root / "b"], root / "cmp")
    training_run(root / "run")
    run_view.write_run_view(root / "run")
    return {"root": root, "a": a, "b": b}


def _open(browser, path: pathlib.Path):
    browser.get(path.as_uri())
    assert browser.execute_script("return document.readyState") == "complete"


def _visible_rows(browser, table="dialogues"):
    return [r for r in browser.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr") if r.is_displayed()]


def _errors(browser):
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


@pytest.mark.slow
def test_filters_change_the_visible_rows(browser, pages):
    transcripts = pages["a"]
    _open(browser, pages["root"] / "a" / "report.html")
    assert len(_visible_rows(browser)) == len(transcripts)
    ends = sorted({t["end_reason"] for t in transcripts})
    select = Select(browser.find_element(By.CSS_SELECTOR, "select[data-attr=end]"))
    for end in ends:
        select.select_by_visible_text(end)
        ids = [r.get_attribute("data-id") for r in _visible_rows(browser)]
        assert ids == [t["profile_id"] for t in transcripts if t["end_reason"] == end]
    select.select_by_index(0)
    Select(browser.find_element(By.CSS_SELECTOR, "select[data-attr=lang]")).select_by_visible_text("en")
    assert len(_visible_rows(browser)) == sum(t["language"] == "en" for t in transcripts)
    browser.find_element(By.CSS_SELECTOR, "button[type=reset]").click()
    low = sorted(t["final_emotion"] for t in transcripts)[len(transcripts) // 2]
    browser.find_element(By.CSS_SELECTOR, "input[data-min=final]").send_keys(str(low))
    assert len(_visible_rows(browser)) == sum(t["final_emotion"] >= low for t in transcripts)
    browser.find_element(By.CSS_SELECTOR, "button[type=reset]").click()
    assert len(_visible_rows(browser)) == len(transcripts)
    search = browser.find_element(By.CSS_SELECTOR, "input[data-text]")
    search.send_keys("pwned")  # only in the hostile reply, inside a dialogue, not in its row
    assert [r.get_attribute("data-id") for r in _visible_rows(browser)] == \
        [t["profile_id"] for t in transcripts if any(x["reply"] == HOSTILE for x in t["turns"])]
    count = browser.find_element(By.CSS_SELECTOR, "form.filters .count").text
    assert count.startswith(f"1 of {len(transcripts)} shown")
    assert not _errors(browser)


@pytest.mark.slow
def test_sorting_orders_the_rows(browser, pages):
    _open(browser, pages["root"] / "a" / "report.html")
    header = browser.find_element(By.CSS_SELECTOR, "th[data-sort=final]")
    header.click()
    finals = [float(r.get_attribute("data-final")) for r in _visible_rows(browser)]
    assert finals == sorted(t["final_emotion"] for t in pages["a"])
    header.click()
    assert [float(r.get_attribute("data-final")) for r in _visible_rows(browser)] == sorted(finals, reverse=True)


@pytest.mark.slow
def test_a_row_opens_its_dialogue(browser, pages):
    transcripts = pages["a"]
    _open(browser, pages["root"] / "a" / "report.html")
    assert not any(a.is_displayed() for a in browser.find_elements(By.CSS_SELECTOR, "article.dialogue"))
    for i in (3, 0):
        browser.find_elements(By.CSS_SELECTOR, "#dialogues tbody tr")[i].click()
        shown = [a for a in browser.find_elements(By.CSS_SELECTOR, "article.dialogue") if a.is_displayed()]
        assert [a.get_attribute("id") for a in shown] == [f"dlg-{i}"]
        assert transcripts[i]["turns"][0]["reply"] in shown[0].text
        assert browser.current_url.endswith(f"#dlg-{i}")
    # The simulator's thoughts and the policy's thinking are folded until asked for.
    thoughts = shown[0].find_element(By.CSS_SELECTOR, "details.sim")
    assert thoughts.get_attribute("open") is None
    shown[0].find_element(By.CSS_SELECTOR, "button[data-details=sim]").click()
    assert thoughts.get_attribute("open") == "true"
    assert transcripts[0]["turns"][0]["simulator_thoughts"] in thoughts.text
    # A link with the dialogue's anchor opens it.
    _open(browser, pages["root"] / "a" / "report.html")
    browser.get((pages["root"] / "a" / "report.html").as_uri() + "#dlg-2")
    assert browser.find_element(By.ID, "dlg-2").is_displayed()


@pytest.mark.slow
def test_a_hostile_reply_does_not_execute(browser, pages):
    transcripts = pages["a"]
    hostile = next(i for i, t in enumerate(transcripts) if any(x["reply"] == HOSTILE for x in t["turns"]))
    _open(browser, pages["root"] / "a" / "report.html")
    title = browser.title
    browser.find_elements(By.CSS_SELECTOR, "#dialogues tbody tr")[hostile].click()
    article = browser.find_element(By.ID, f"dlg-{hostile}")
    assert article.is_displayed() and "<script>window.pwned=1</script>" in article.text
    assert browser.title == title == "Sentient benchmark: scripted <b>policy</b>"
    assert browser.execute_script("return typeof window.pwned") == "undefined"
    assert browser.find_elements(By.CSS_SELECTOR, "img") == []
    assert len(browser.find_elements(By.CSS_SELECTOR, "script")) == 1
    assert not _errors(browser)  # no blocked script either: nothing tried to run


@pytest.mark.slow
def test_the_compare_view_pairs_profiles(browser, pages):
    a, b = pages["a"], pages["b"]
    _open(browser, pages["root"] / "cmp" / "compare.html")
    rows = _visible_rows(browser, "pairs")
    assert [r.get_attribute("data-id") for r in rows] == [t["profile_id"] for t in a]
    browser.find_element(By.CSS_SELECTOR, "th[data-sort=diff0]").click()
    diffs = [float(r.get_attribute("data-diff0")) for r in _visible_rows(browser, "pairs")]
    assert diffs == sorted(tb["final_emotion"] - ta["final_emotion"] for ta, tb in zip(a, b))
    row = _visible_rows(browser, "pairs")[-1]  # the largest gain
    row.click()
    shown = [p for p in browser.find_elements(By.CSS_SELECTOR, "article.pair") if p.is_displayed()]
    assert len(shown) == 1
    sides = shown[0].find_elements(By.CSS_SELECTOR, "article.dialogue")
    assert [s.get_attribute("data-profile") for s in sides] == [row.get_attribute("data-id")] * 2
    ta, tb = next((x, y) for x, y in zip(a, b) if x["profile_id"] == row.get_attribute("data-id"))
    assert ta["turns"][0]["reply"] in sides[0].text and tb["turns"][0]["reply"] in sides[1].text
    left, right = sides[0].rect, sides[1].rect
    assert right["x"] > left["x"] + left["width"] - 1 and abs(right["y"] - left["y"]) < 2  # side by side


@pytest.mark.slow
def test_the_training_index_opens_a_step(browser, pages):
    _open(browser, pages["root"] / "run" / "view" / "index.html")
    rows = _visible_rows(browser, "steps")
    assert [r.get_attribute("data-step") for r in rows] == ["0", "1"]
    rows[1].find_elements(By.TAG_NAME, "td")[1].click()
    assert browser.current_url.endswith("train_000001.html")
    groups = browser.find_elements(By.CSS_SELECTOR, "section.group")
    assert len(groups) == 2
    cards = groups[0].find_elements(By.CSS_SELECTOR, "article.dialogue")
    assert len(cards) == 2 and cards[1].rect["x"] > cards[0].rect["x"]  # a group's dialogues side by side
    assert not _errors(browser)
