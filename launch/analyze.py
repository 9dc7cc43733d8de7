"""An LLM judge rates the dialogues of evaluation runs on the RLVER paper's five capabilities
(empathy depth, insight, solution crafting, dialogue guidance, style adaptability; 1 to 5) and
counts the response strategies of every policy reply; a table and charts per model.

  .venv/bin/python launch/analyze.py --runs=runs/eval_base,runs/eval_ppo_think --out=runs/analysis \\
      --base_url=http://simhost:30000/v1 --model=simulator

By default the judge is the simulator's server (configs/simulator.py). Writes OUT/analysis.md,
analysis.json, capabilities.png, strategies.png and judgements.jsonl; rerunning resumes.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # configs/ and rlver_jax/

from rlver_jax.cli import program  # noqa: E402  (first: one line outside the venv)

from absl import app, flags  # noqa: E402

from configs.simulator import get_simulator_config  # noqa: E402

_SIMULATOR = get_simulator_config(eval_mode=True)
_RUNS = flags.DEFINE_list("runs", None, "Evaluation directories (launch/eval.py work directories), one model each.")
_OUT = flags.DEFINE_string("out", None, "Directory for the analysis.")
_BASE_URL = flags.DEFINE_string("base_url", _SIMULATOR.base_url, "OpenAI-compatible endpoint of the judge.")
_MODEL = flags.DEFINE_string("model", _SIMULATOR.model, "Served model name of the judge.")
_API_KEY_ENV = flags.DEFINE_string("api_key_env", "JUDGE_API_KEY", "Environment variable holding the judge's "
                                   "API key (unset is fine for a local server).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Judge sampling temperature.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 1024, "Judge answer length limit.")
_MAX_CONCURRENCY = flags.DEFINE_integer("max_concurrency", 16, "Judge requests in flight.")
_TIMEOUT_S = flags.DEFINE_float("timeout_s", 120.0, "Per judge request, in seconds.")
_MAX_RETRIES = flags.DEFINE_integer("max_retries", 5, "Retries of a judge request after a connection error, a "
                                    "timeout, 408/409/429 or 5xx.")
_MALFORMED_RETRIES = flags.DEFINE_integer("malformed_retries", 2, "Fresh answers after an unparsable one.")
_MAX_DIALOGUES = flags.DEFINE_integer("max_dialogues", 0, "Judge the first N dialogues of each run; 0 = all.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    from rlver_jax.eval.analysis import analyze
    from rlver_jax.eval.llm_judge import JudgeSettings

    settings = JudgeSettings(base_url=_BASE_URL.value, model=_MODEL.value, api_key_env=_API_KEY_ENV.value,
                             temperature=_TEMPERATURE.value, max_tokens=_MAX_TOKENS.value,
                             max_concurrency=_MAX_CONCURRENCY.value, timeout_s=_TIMEOUT_S.value,
                             max_retries=_MAX_RETRIES.value, malformed_retries=_MALFORMED_RETRIES.value)
    summary = analyze(_RUNS.value, _OUT.value, settings, max_dialogues=_MAX_DIALOGUES.value)
    for model, s in summary["models"].items():
        print(f"{model}: mean capability {s['overall']:.2f} over {s['judged']} dialogues "
              f"({s['judge_errors']} judge errors)")
    print(f"-> {pathlib.Path(_OUT.value) / 'analysis.md'}")


if __name__ == "__main__":
    program.run(main, required=["runs", "out"], statuses=(*program.COMMON_STATUSES, program.EXIT_RESTART))
