"""Batched generation (prefill + decode in one jit), its settings (no JAX) and padded sizes.

Empty on purpose: importing one module does not import the others (a served evaluation
imports no JAX)."""
