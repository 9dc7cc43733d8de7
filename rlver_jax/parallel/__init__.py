"""Meshes and logical-axis rules, multi-process start-up (no JAX to decide), gathers across hosts.

Empty on purpose: importing one module does not import the others (a served evaluation
imports no JAX)."""
