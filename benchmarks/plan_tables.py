r"""docs/sharding.md's tables of the 7B presets' plans on TPU slices and GPU nodes: every plan of
PLANS run by launch/plan.py (compile-only, one at a time, each writing its figures as JSON), then
the memory table and the step-estimate table written between the markers <!--plans--> and
<!--/plans--> of docs/sharding.md.

  .venv/bin/python benchmarks/plan_tables.py --write                 # every plan, then the tables
  .venv/bin/python benchmarks/plan_tables.py --only=v5e-16-ppo,h100-8-ppo --write
  .venv/bin/python benchmarks/plan_tables.py --tables_only --write   # the tables from the JSON kept

TPU plans run in the project's venv (libtpu), GPU plans in --gpu_python's (jax's CUDA plugin in a
venv of its own: `python3 -m venv ../gpu-venv && ../gpu-venv/bin/pip install -e '.[gpu-plan]'`).
A 7B plan for a TPU slice takes 10-40 minutes on a 2-core host, one for GPUs about a minute; a plan
whose JSON is in --workdir is not run again (delete it to rerun). A plan that fails or is missing
gets a row saying so.
"""

import json
import os
import pathlib
import subprocess
import sys
import time

from absl import app, flags

REPO = pathlib.Path(__file__).resolve().parents[1]
_ONLY = flags.DEFINE_list("only", [], "Names of PLANS to run (default: all).")
_WORKDIR = flags.DEFINE_string("workdir", str(REPO / "runs" / "plan_tables"), "Where each plan's JSON and log go.")
_GPU_PYTHON = flags.DEFINE_string("gpu_python", str(REPO.parent / "gpu-venv" / "bin" / "python"),
                                  "The GPU-planning venv's interpreter.")
_WRITE = flags.DEFINE_bool("write", False, "Write the tables into docs/sharding.md (else print them).")
_TABLES_ONLY = flags.DEFINE_bool("tables_only", False, "Run no plan: the tables from the JSON in --workdir.")

_PHASES = "--phases=prepare,actor update,critic update,rollout"
# name -> (target words, launch/plan.py arguments); GPU targets run in the GPU venv.
PLANS = {
    "v5e-16-ppo": ("v5e-16 (`v5e:4x4`)", ["--config=configs/ppo_think.py:7b", "--topology=v5e:4x4"]),
    "v5e-16-grpo": ("v5e-16 (`v5e:4x4`)", ["--config=configs/grpo_think.py:7b", "--topology=v5e:4x4"]),
    "2xv5e-16-ppo": ("2 x v5e-16 (`--slices=2`), mesh (2,4,4)", [
        "--config=configs/ppo_think.py:7b", "--topology=v5e:4x4", "--slices=2", "--config.mesh.shape=(2,-1,4)",
        "--config.rl.micro_batch_size=8"]),
    "v5p-16-ppo": ("v5p-16 (`v5p:2x2x2`)", ["--config=configs/ppo_think.py:7b", "--topology=v5p:2x2x2"]),
    "v6e-16-ppo": ("v6e-16 (`v6e:4x4`)", ["--config=configs/ppo_think.py:7b", "--topology=v6e:4x4"]),
    "v4-32-ppo": ("v4-32 (`v4:2x2x4`)", ["--config=configs/ppo_think.py:7b", "--topology=v4:2x2x4"]),
    "h100-8-ppo": ("`h100:8`", ["--config=configs/ppo_think.py:7b", "--gpu=h100:8"]),
    "h100-8-grpo": ("`h100:8`", ["--config=configs/grpo_think.py:7b", "--gpu=h100:8"]),
    "h200-8-ppo": ("`h200:8`", ["--config=configs/ppo_think.py:7b", "--gpu=h200:8"]),
    "h200-8-grpo": ("`h200:8`", ["--config=configs/grpo_think.py:7b", "--gpu=h200:8"]),
    "a100-8-ppo": ("`a100:8`", ["--config=configs/ppo_think.py:7b", "--gpu=a100:8"]),
    "2xh100-8-ppo": ("`h100:8x2`, mesh (2,2,4)", ["--config=configs/ppo_think.py:7b", "--gpu=h100:8x2",
                                                   "--config.mesh.shape=(2,-1,4)", "--config.rl.micro_batch_size=8"]),
    "h100-1-lora-ppo": ("`h100:1`", ["--config=configs/ppo_think.py:7b_lora", "--gpu=h100:1"]),
    "h100-1-lora-grpo": ("`h100:1`", ["--config=configs/grpo_think.py:7b_lora", "--gpu=h100:1"]),
    "h200-1-lora-ppo": ("`h200:1`", ["--config=configs/ppo_think.py:7b_lora", "--gpu=h200:1"]),
    "h200-1-lora-grpo": ("`h200:1`", ["--config=configs/grpo_think.py:7b_lora", "--gpu=h200:1"]),
}


def _run(name: str, workdir: pathlib.Path) -> None:
    words, args = PLANS[name]
    out = workdir / f"{name}.json"
    if out.exists():
        return
    python = _GPU_PYTHON.value if any(a.startswith("--gpu=") for a in args) else sys.executable
    cmd = [python, str(REPO / "launch" / "plan.py"), *args, _PHASES, "--nosearch", f"--json={out}",
           f"--config.workdir={workdir / 'run'}"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "XLA_FLAGS": ""}
    t0 = time.time()
    with open(workdir / f"{name}.log", "w") as log:
        done = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    print(f"{name}: exit {done.returncode} in {time.time() - t0:.0f} s, load {os.getloadavg()[0]:.1f}", flush=True)


def _gb(programs: dict, *names: str) -> str:
    cells = [f"{programs[n]['total_gb']:.2f}" for n in names if n in programs]
    return " / ".join(cells) or "-"


def _memory_row(name: str, r: dict) -> str:
    words, args = PLANS[name]
    p = r["programs"]
    fits = "yes" if r["fits"] else f"NO ({r['peak']})"
    compile_s = " / ".join(f"{v['compile_s']:.0f}" for v in p.values())
    return (f"| {words} | `{args[0].split('=')[1]}` | {_gb(p, 'prepare')} | {_gb(p, 'actor update')} | "
            f"{_gb(p, 'critic update')} | {_gb(p, 'rollout', 'rollout prefill')} | {r['peak_gb']:.2f} of "
            f"{r['memory_gb']:g} | {fits} | {compile_s} |")


def _s(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _estimate_row(name: str, r: dict) -> str:
    words, args = PLANS[name]
    est = r["estimate"]
    if est is None:
        return f"| {words} | `{args[0].split('=')[1]}` | no estimate (see the plan's log) |" + " |" * 8
    bound, drawn = est["cases"]
    t = bound["update_terms"]
    comm = t["overlapped"] + t["collectives"] + t["latency"]
    rt = bound.get("rollout_terms") or {}
    rollout_comm = rt.get("overlapped", 0) + rt.get("collectives", 0) + rt.get("latency", 0)
    return (f"| {words} | `{args[0].split('=')[1]}` | {bound['optimizer_steps']} x {bound['update_rows']} x "
            f"{bound['update_length']} | {_s(bound['update_s'])} ({_s(comm)} comm., {_s(t['kernel_fixed'])} grid) | "
            f"{_s(bound.get('rollout_s', 0))} (device {_s(bound.get('rollout_device_s', 0))}, grid "
            f"{_s(rt.get('kernel_fixed', 0))}, comm. {_s(rollout_comm)}"
            f"; user {_s(bound.get('rollout_waiting_s', 0))}) | {_s(bound['offload_s'])} | {_s(bound['step_s'])} | "
            f"{_s(drawn.get('rollout_s', 0))} + {_s(drawn['update_s'])} = {_s(drawn['step_s'])} | "
            f"{100 * est['update_mfu']:.0f}% / {100 * est['mfu']:.1f}% |")


def tables(workdir: pathlib.Path) -> str:
    records = {n: json.loads((workdir / f"{n}.json").read_text()) for n in PLANS if (workdir / f"{n}.json").exists()}
    missing = [n for n in PLANS if n not in records]
    lines = ["| target | preset | prepare | actor update | critic update | rollout / prefill | peak of budget | fits "
             "| compile s |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [_memory_row(n, r) for n, r in records.items()]
    lines += ["", "| target | preset | update: steps x rows x T | update s | rollout s (every reply at max) | "
                  "offload s | step s | lognormal replies: rollout + update = step s | MFU update / step |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [_estimate_row(n, r) for n, r in records.items()]
    if missing:
        lines += ["", "Not planned in this run (no figures): " + ", ".join(f"`{n}`" for n in missing) + "."]
    return "\n".join(lines)


def main(argv):
    del argv
    workdir = pathlib.Path(_WORKDIR.value)
    workdir.mkdir(parents=True, exist_ok=True)
    if not _TABLES_ONLY.value:
        for name in _ONLY.value or list(PLANS):
            _run(name, workdir)
    text = tables(workdir)
    if not _WRITE.value:
        print(text)
        return
    doc = REPO / "docs" / "sharding.md"
    body = doc.read_text()
    start, end = body.index("<!--plans-->") + len("<!--plans-->"), body.index("<!--/plans-->")
    doc.write_text(body[:start] + "\n" + text + "\n" + body[end:])


if __name__ == "__main__":
    app.run(main)
