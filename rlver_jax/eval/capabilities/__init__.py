"""Capability retention: MATH500, IFEval and LiveCodeBench of a policy, graded by the field's own
libraries (launch/capabilities.py, docs/capabilities.md).

Modules: data (the published data formats), prompts (what the policy is asked), extra (the
graders' libraries and their offline data), grade_math, grade_ifeval and grade_code (one
benchmark each), sandbox (generated code in a child process under limits), policy (the policy
section of configs/eval.py as a policy), runner (the resumable run), report (capabilities.json,
report.md, capabilities.html) and compare (base against trained). Empty of imports: a served run
imports no JAX.
"""
