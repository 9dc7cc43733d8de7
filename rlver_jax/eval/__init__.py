"""Evaluation: the Sentient benchmark, comparisons, export and the LLM-judge analysis.

Modules: sentient (SAGE metrics of finished dialogues), benchmark (the resumable benchmark run
behind launch/eval.py), policy_loading (a run's checkpoint, a Hugging Face directory or a fresh
tiny model as a policy), report and plots (sentient.json, report.md, PNGs), compare (paired
comparison of runs), export (Hugging Face export behind launch/export_hf.py), judge and analysis
(capability ratings and response strategies behind launch/analyze.py), endpoint (fail-fast check
of an OpenAI-compatible server), resume (append-as-you-go result files).
"""
