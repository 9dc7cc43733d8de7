"""The memory planner behind launch/plan.py: the per-device memory of the programs a training run
executes, compiled ahead of time from abstract shapes, without allocating a weight.

`setup` (the abstract run compiled for, and what of the train state rests on the devices),
`compiled` (a program compiled into its memory and cost), `phases` (each program compiled: the
update's, the offload's moves, the rollout engine's), `sampler` (what the engines' plans share,
and the plan a row names: `continuous_plan`, `static_plan`), `search` (the largest shapes that
fit), `plan` (the plan of a spec), `report` (the plan as text), `roofline` (a train step's time
estimated from the programs' costs on a TPU chip or GPU card) over `hlo_cost` (FLOPs and HBM
bytes read from a compiled program's HLO).

Empty on purpose: importing one module does not import the others."""
