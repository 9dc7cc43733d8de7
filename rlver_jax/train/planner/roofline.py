"""The plan's step estimate as text (report.format_plan): each compiled program's cost on the chip
(planner.terms) and the step (planner.estimate), term by term, with what it assumed. An
estimate, not a measurement.
"""

from __future__ import annotations

from rlver_jax.parallel import chips
from rlver_jax.train.planner.estimate import CaseEstimate, StepEstimate
from rlver_jax.train.planner.plan import Plan
from rlver_jax.train.planner.terms import OVERLAP, Terms, terms


def _chip_line(chip: chips.Chip) -> str:
    if chip.measured:
        return (f"this host's {chip.device_kind}, {chip.measured}: {chip.bf16_tflops * 1e3:.1f} GFLOP/s, "
                f"{chip.hbm_gb_s:.1f} GB/s, {chip.op_us:.1f} us an operation, {chip.call_us:.0f} us a call "
                "(parallel/host_peaks.py)")
    links = f"collectives {chip.near_gb_s:g} GB/s inside a slice or node, {chip.far_gb_s:g} GB/s across"
    grid = f", {chip.grid_step_us:g} us a Pallas grid step" if chip.grid_step_us else ""
    return (f"{chip.name}'s published {chip.bf16_tflops:g} TFLOP/s bf16, {chip.hbm_gb_s:g} GB/s HBM, {links}, "
            f"{chip.near_step_us:g} / {chip.far_step_us:g} us a ring step{grid}, {chip.host_gb_s:g} GB/s to the host")


def secs(x: float) -> str:
    """Seconds in three significant figures (a step of minutes, a tiny program's milliseconds)."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _terms(t: Terms) -> str:
    return (f"compute {secs(t.compute)}, HBM {secs(t.memory)}, collectives {secs(t.communication)} "
            f"({secs(t.overlapped)} overlapped), kernel grid steps {secs(t.kernel_fixed)}"
            + (f", fixed costs {secs(t.op_fixed)}" if t.op_fixed else ""))


def _case_lines(c: CaseEstimate) -> list[str]:
    u = c.update
    programs = ", ".join(f"{name} {secs(t.seconds)}" for name, t in u.programs.items())
    stale = f" (max_staleness {c.staleness}: {secs(c.on_policy)} s on-policy, {secs(c.hidden)} s hidden)"
    lines = [f"step       {c.name}: {secs(c.step)} s" + (stale if c.staleness else "")]
    if c.rollout is not None:
        r = c.rollout
        lines.append(f"  rollout  {secs(r.wall)} s the slowest host: device {secs(r.device)} s (decode "
                     f"{secs(r.decode.seconds)} s, prefill {secs(r.prefill.seconds)} s in {r.calls:,} calls; "
                     f"{_terms(r.decode + r.prefill)}), "
                     f"idle waiting for the simulator {secs(r.waiting)} s; {r.sampled:,} tokens sampled, "
                     f"{r.fed:,} prefilled")
    lines.append(f"  update   {secs(u.seconds)} s = {programs} ({_terms(u.total)}); "
                 f"{u.shapes.optimizer_steps} optimizer step(s) per model at {u.shapes.rows} x {u.shapes.length}")
    if c.offload:
        lines.append(f"  offload  {secs(c.offload)} s: the state's moves over the host link")
    if c.staleness and c.rollout is not None:
        lines.append(f"  async    the next batch's rollout runs during this update: the step is the longer of the "
                     f"rollout ({secs(c.rollout_wall)} s) and its device time plus the update "
                     f"({secs(c.rollout.device + c.update.seconds + c.offload)} s)")
    return lines


def format_roofline(plan: Plan) -> list[str]:
    """The estimate's lines of a plan with a chip's figures (none otherwise)."""
    chip = plan.setup.chip
    costed = [p for p in plan.phases if p.cost is not None]
    if chip is None or not costed:
        return []
    lines = [f"estimate   an ESTIMATE, not a measurement, each compiled program per device (loops by their trip "
             f"counts) on {_chip_line(chip)}",
             f"  {'program':<18}{'TFLOP':>9} {'HBM GB':>9} {'compute':>8} {'memory':>8} {'collect':>8} {'grid':>8} "
             f"{'fixed':>8} {'estimate':>9}  (per device, s; one run)"]
    for p in costed:
        c, t = p.cost, terms(p.cost, chip)
        extra = f"  {c.unknown_loops} loop(s) of unknown trip count counted once" if c.unknown_loops else ""
        lines.append(f"  {p.name:<18}{c.flops / 1e12:9.3f} {c.bytes / 1e9:9.2f} {t.compute:8.3f} {t.memory:8.3f} "
                     f"{t.communication:8.3f} {t.kernel_fixed:8.3f} {t.op_fixed:8.3f} {t.seconds:9.3f}{extra}")
    est: StepEstimate | None = plan.estimate
    if est is None:
        return lines
    for case in plan.cases:
        if case.compiled_apart:
            lines.append(f"  {case.name}: the update compiled again at its own shapes, {case.shapes.rows} x "
                         f"{case.shapes.length}")
    for c in est.cases:
        lines += _case_lines(c)
    lines.append(f"mfu        {100 * est.mfu:.1f}% of the step, {100 * est.update_mfu:.1f}% of the update (every "
                 f"reply at max; model FLOPs: 6N a trained token, 4N with LoRA, 2N a read or sampled one)")
    sim = est.simulator
    lines.append(f"assumes    {est.lengths}; every dialogue plays every turn; the simulator {sim.latency_s:.3g} s a "
                 f"request, {sim.concurrency} in flight per host ({sim.source}); {OVERLAP}")
    if not chip.measured:
        lines.append(f"sources    {chips.SOURCES}; assumed: {chips.ASSUMED}")
    return lines
