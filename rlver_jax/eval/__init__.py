"""Evaluation: the Sentient benchmark, comparisons, reports, export and the LLM-judge analysis.

Modules: spec (the evaluation configs read into typed specs, the one reader of them), sentient
(SAGE metrics of finished dialogues, on rlver_jax.rollout.summary), benchmark (the resumable
benchmark run behind launch/eval.py), policy_source (the policy under test, by backend),
run_checkpoint (a training run's checkpoint, found without JAX), policy_loading (a run's checkpoint, a
Hugging Face directory or a fresh tiny model as a policy), report (sentient.json, report.md and
the PNGs of rlver_jax.plots), html_report (report.html and compare.html), run_view (the pages of a
training run, launch/view.py), compare (paired comparison of runs), export (Hugging Face export
behind launch/export_hf.py), judge and analysis (capability ratings and response strategies
behind launch/analyze.py), resume (append-as-you-go result files); the subpackage capabilities
(MATH500, IFEval and LiveCodeBench retention behind launch/capabilities.py). The OpenAI-compatible client
and its endpoint check are rlver_jax.llm_client.
"""
