"""What the entry points in launch/ share: flags, one-line errors, config docs and checks.

Empty on purpose: importing one module does not import the others (a served evaluation
imports no JAX)."""
