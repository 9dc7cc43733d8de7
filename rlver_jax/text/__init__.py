"""Chat token assembly, think-then-say parsing, the locally built tiny tokenizer.

Empty on purpose: importing one module does not import the others (a served evaluation
imports no JAX)."""
