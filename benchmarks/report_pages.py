"""How fast the HTML pages are with large runs: 100 dialogues x 10 turns on one evaluation page,
and a 1000-step training run's index; render time, size, and load/interaction times in headless
Chromium when it is installed (Debian's chromium + chromium-driver, selenium).

    .venv/bin/python benchmarks/report_pages.py

Numbers and the machine's load go to docs/report.md.
"""

import asyncio
import os
import pathlib
import shutil
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from configs.simulator import get_simulator_config  # noqa: E402
from rlver_jax.engines.seam import PolicyTurn  # noqa: E402
from rlver_jax.eval import html_report, run_view  # noqa: E402
from rlver_jax.eval.sentient import summarize  # noqa: E402
from rlver_jax.files import atomic_write_jsonl, atomic_write_text  # noqa: E402
from rlver_jax.rollout.episodes import EpisodeRequest, EpisodeRunner, RolloutSettings  # noqa: E402
from rlver_jax.rollout.sequence import DialogueSequence  # noqa: E402
from rlver_jax.simulator import SimulatorSettings, build_simulator  # noqa: E402
from rlver_jax.simulator.profiles import load_profiles  # noqa: E402
from rlver_jax.testing.transcripts import stretched  # noqa: E402

_WARM = "I hear how heavy this feels. That sounds really hard, and it makes sense you feel hurt."


class _WarmPolicy:
    """A text policy that always says _WARM."""

    async def act(self, requests):
        return [PolicyTurn(text=_WARM) for _ in requests]

    def release(self, session):
        pass


def _long_dialogues(n=100, turns=10, chars=1500):
    """n transcript records of `turns` long turns each, made from one real record (a dialogue of the
    embedded simulator, under SAGE's rules, with the first shipped profile)."""
    cfg = get_simulator_config(eval_mode=True)
    cfg.backend = "embedded"
    runner = EpisodeRunner(_WarmPolicy(), build_simulator(SimulatorSettings.from_config(cfg)), None,
                           RolloutSettings(think=False, format_failure="continue"))
    [base] = [s.to_record() for s in asyncio.run(runner.run([EpisodeRequest(load_profiles()[0], 0)]))]
    return stretched(base, n, turns, chars)


def _browser():
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        return None
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run",
                f"--user-data-dir={tempfile.mkdtemp()}"):
        options.add_argument(arg)
    return webdriver.Chrome(service=webdriver.ChromeService(shutil.which("chromedriver")), options=options)


def main() -> None:
    out = pathlib.Path(tempfile.mkdtemp())
    print(f"load average {os.getloadavg()[0]:.1f}")
    dialogues = _long_dialogues()
    start = time.perf_counter()
    page = html_report.render_eval(summarize([DialogueSequence.from_record(d) for d in dialogues]), dialogues)
    print(f"evaluation page, 100 dialogues x 10 turns: render {time.perf_counter() - start:.2f} s, "
          f"{len(page.encode()) / 1e6:.2f} MB")
    atomic_write_text(out / "big.html", page)
    metrics = [{"step": s, "reward_mean": s / 1000, "emotion_mean": 30 + s / 100,
                **({"eval_score": 40.0} if s % 25 == 0 else {})} for s in range(1000)]
    atomic_write_jsonl(out / "run" / "metrics.jsonl", metrics)
    start = time.perf_counter()
    index = run_view.write_run_view(out / "run")
    print(f"training index, 1000 steps: render {time.perf_counter() - start:.2f} s, "
          f"{index.stat().st_size / 1e6:.2f} MB")
    browser = _browser()
    if browser is None:
        print("no chromium/chromedriver: browser timings skipped")
        return
    try:
        for url in ((out / "big.html").as_uri(), index.as_uri()):
            browser.get(url)
            loaded = browser.execute_script(
                "var t = performance.getEntriesByType('navigation')[0]; return t.loadEventEnd;")
            print(f"{url.rsplit('/', 1)[-1]}: loaded in {loaded:.0f} ms")
        browser.get((out / "big.html").as_uri())
        ms = browser.execute_script("var t0 = performance.now(); "
                                    "document.querySelectorAll('#dialogues tbody tr')[50].click(); "
                                    "return performance.now() - t0;")
        print(f"open a dialogue: {ms:.1f} ms")
    finally:
        browser.quit()


if __name__ == "__main__":
    main()
