"""The training program: the loop, building a run, checkpoints, metrics and tracking, interrupts,
work directories, the memory planner.

Empty on purpose: importing one module does not import the others (a served evaluation
imports no JAX)."""
