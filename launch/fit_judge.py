r"""Fit the embedded simulator's calibrated judge on SAGE's released results, and measure it
leaving one model out (rlver_jax/simulator/judge_fit.py, docs/simulator.md).

  .venv/bin/python launch/fit_judge.py --results=../shared/data/sage/dialogues/*.jsonl.xz (comma-separated) \
      --profiles=../shared/data/rlver/test_profile.jsonl --out=rlver_jax/simulator/data/judge_weights.json

fits on every file given and writes the weights (the shipped file comes from the 8 files of
../shared/data/sage/dialogues: the same command reproduces it byte for byte); --lomo also fits on
all files but one, judges that one, for each file, and prints the agreement of the whole judge and
of its named features alone (what an English reply gets) with SAGE's simulator.
"""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout

from rlver_jax.cli import program  # noqa: E402  (first: one line outside the venv)

from absl import app, flags  # noqa: E402

_RESULTS = flags.DEFINE_list("results", None, "SAGE result files (.jsonl or .jsonl.xz), comma-separated.")
_PROFILES = flags.DEFINE_string("profiles", None, "The profiles of the results by id: RLVER's test_profile.jsonl.")
_OUT = flags.DEFINE_string("out", None, "Write the fitted weights here (JSON).")
_LOMO = flags.DEFINE_bool("lomo", False, "Also measure the judge leaving one model (file) out.")
_LOMO_OUT = flags.DEFINE_string("lomo_out", None, "Write the leave-one-model-out figures here (JSON).")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from configs.simulator import get_emotion_rules_config
    from rlver_jax.checks import InputError
    from rlver_jax.simulator import agreement, judge_fit, sage_results
    from rlver_jax.simulator.profiles import load_profiles
    from rlver_jax.simulator.state import EmotionRules

    if not (_OUT.value or _LOMO.value):
        raise app.UsageError("nothing to do: give --out=FILE (the weights) and/or --lomo")
    profiles = {p.id: p for p in load_profiles(_PROFILES.value)}
    results = {sage_results.stem(path): sage_results.read_results(path) for path in sorted(_RESULTS.value)}
    if missing := sorted({r.dialogue for replies in results.values() for r in replies} - set(profiles)):
        raise InputError(f"{len(missing)} dialogue(s) have no profile in --profiles={_PROFILES.value} "
                         f"(first: {missing[0]!r})")
    data = judge_fit.rows(results, profiles)
    if _OUT.value:
        pathlib.Path(_OUT.value).write_text(judge_fit.fit(data).to_json(), encoding="utf-8")
        print(f"fitted on {len(data.y)} judged replies of {len(results)} files: {_OUT.value}")
    if _LOMO.value:
        rules = EmotionRules.from_config(get_emotion_rules_config(eval_mode=True))
        figures = judge_fit.leave_one_model_out(results, profiles, data, rules)
        for variant, summary in figures.items():
            print(f"\nleave one model out, {variant}:\n{agreement.table(summary)}")
        if _LOMO_OUT.value:
            pathlib.Path(_LOMO_OUT.value).write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    program.run(main, required=["results", "profiles"])
