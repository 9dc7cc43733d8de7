r"""Fit the embedded simulator's calibrated judge on SAGE's released results, and measure it
leaving one model out (rlver_jax/simulator/judge_fit.py, docs/simulator.md).

  .venv/bin/python launch/fit_judge.py --results=../shared/data/sage/dialogues/*.jsonl.xz (comma-separated) \
      --profiles=../shared/data/rlver/test_profile.jsonl --out=rlver_jax/simulator/data/judge_weights.json
  # a refit with adversarial turns, tried through $RLVER_JUDGE_WEIGHTS=refit.json:
  .venv/bin/python launch/fit_judge.py --results=... \
      --profiles=../shared/data/rlver/test_profile.jsonl,rlver_jax/simulator/data/profiles_en.jsonl \
      --adversarial=runs/adversarial_smol.jsonl.xz (comma-separated) --out=refit.json

fits on every file given and writes the weights (the shipped file comes from the 8 files of
../shared/data/sage/dialogues alone: the first command reproduces it byte for byte); --lomo also
fits on all files but one (and every adversarial turn), judges that one, for each file, and prints
the agreement of the whole judge and of its named features alone (what an English reply gets)
with SAGE's simulator. --adversarial: dialogues in SAGE's result
format that launch/attack_simulator.py --adversarial_out wrote (templates and probes the judge
overpaid), fitted as the lowest change SAGE's simulator recorded (judge_fit.py).
"""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout

from rlver_jax.cli import program  # noqa: E402  (first: one line outside the venv)

from absl import app, flags  # noqa: E402

_RESULTS = flags.DEFINE_list("results", None, "SAGE result files (.jsonl or .jsonl.xz), comma-separated.")
_PROFILES = flags.DEFINE_list("profiles", None, "The profiles of the results by id, comma-separated: RLVER's "
                              "test_profile.jsonl, and the profiles of the adversarial dialogues.")
_ADVERSARIAL = flags.DEFINE_list("adversarial", [], "Adversarial dialogues (SAGE result lines, .jsonl or .jsonl.xz), "
                                 "comma-separated, fitted as the lowest recorded change.")
_SHARE = flags.DEFINE_float("adversarial_share", 0.02, "The adversarial turns' total weight in the fit, as a share of "
                            "SAGE's judged replies.")
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
    profiles = {p.id: p for path in _PROFILES.value for p in load_profiles(path)}
    results = {sage_results.stem(path): sage_results.read_results(path) for path in sorted(_RESULTS.value)}
    adversarial = {sage_results.stem(path): sage_results.read_results(path) for path in sorted(_ADVERSARIAL.value)}
    found = {r.dialogue for files in (results, adversarial) for replies in files.values() for r in replies}
    if missing := sorted(found - set(profiles)):
        raise InputError(f"{len(missing)} dialogue(s) have no profile in --profiles={','.join(_PROFILES.value)} "
                         f"(first: {missing[0]!r})")
    data = judge_fit.rows(results, profiles)
    if adversarial:
        lowest = int(data.y.min())
        data = data.joined(judge_fit.adversarial_rows(adversarial, profiles, lowest))
    if _OUT.value:
        pathlib.Path(_OUT.value).write_text(judge_fit.fit(data, _SHARE.value).to_json(), encoding="utf-8")
        print(f"fitted on {int(data.sage.sum())} judged replies of {len(results)} files and "
              f"{int((~data.sage).sum())} adversarial turns: {_OUT.value}")
    if _LOMO.value:
        rules = EmotionRules.from_config(get_emotion_rules_config(eval_mode=True))
        figures = judge_fit.leave_one_model_out(results, profiles, data, rules, _SHARE.value)
        for variant, summary in figures.items():
            print(f"\nleave one model out, {variant}:\n{agreement.table(summary)}")
        if _LOMO_OUT.value:
            pathlib.Path(_LOMO_OUT.value).write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    program.run(main, required=["results", "profiles"])
