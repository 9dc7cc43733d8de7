"""Export a trained policy as a Hugging Face directory (weights, config, tokenizer files) that
transformers 4.45+ and 5.x, vLLM and SGLang load, e.g. to serve it and evaluate it with
--config.policy.backend=openai. The tokenizer files follow Qwen2.5's own release (docs/tokenizers.md).

  .venv/bin/python launch/export_hf.py --checkpoint=runs/ppo_think_7b --out=exports/ppo_think_7b
  .venv/bin/python launch/export_hf.py --checkpoint=runs/tiny/checkpoints/10 --out=exports/tiny \\
    --dtype=float32

--checkpoint is a training run's work directory (its latest step) or WORKDIR/checkpoints/STEP.
Only the actor is read; the critic and optimizer states stay on disk. A LoRA run's export is the plain
model with its adapters merged (W + scale * A @ B, no adapter tensors); --peft_adapter=DIR writes
the adapters alone as well, in PEFT's format, for servers that load LoRA adapters onto the base:

  .venv/bin/python launch/export_hf.py --checkpoint=runs/lora --out=exports/lora --peft_adapter=exports/lora_adapter
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # rlver_jax/

from rlver_jax.cli import program  # noqa: E402  (first: one line outside the venv)

from absl import app, flags  # noqa: E402

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Training WORKDIR (latest step) or WORKDIR/checkpoints/STEP.")
_OUT = flags.DEFINE_string("out", None, "New directory for the Hugging Face checkpoint.")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32", "float16"], "Dtype of the written weights.")
_PEFT = flags.DEFINE_string("peft_adapter", "", "A LoRA run only: also write its adapters alone, in PEFT's "
                            "format, to this new directory.")
_BASE_PATH = flags.DEFINE_string("base_path", "", "Hugging Face directory of the run's base model, if it moved "
                                 "since training (its architecture and tokenizer).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    from rlver_jax.eval.run_checkpoint import locate_checkpoint

    # The checkpoint is found (its directory, config.json, a finished step) before JAX is imported.
    ckpt = program.checked_config(lambda: locate_checkpoint(_CHECKPOINT.value, "--checkpoint"))
    program.checked_config(ckpt.resolved_step)
    from rlver_jax.parallel import sharding
    from rlver_jax.eval.export import export_hf, export_peft_adapter
    from rlver_jax.eval.policy_loading import load_checkpoint_policy

    # Any layout will do: writing gathers every parameter to the host.
    mesh = sharding.make_mesh((1, -1, 1))
    policy = load_checkpoint_policy(ckpt, mesh, "fsdp", _BASE_PATH.value)
    if _PEFT.value:  # first: it is refused for a run without adapters
        print(f"exported the PEFT adapter of {policy.source} to {export_peft_adapter(policy, _PEFT.value)}")
    out = export_hf(policy, _OUT.value, _DTYPE.value)
    merged = f", LoRA rank {policy.adapter.settings.rank} merged" if policy.adapter else ""
    print(f"exported {policy.source} ({policy.model.num_params():,} parameters, {_DTYPE.value}{merged}) to {out}")


if __name__ == "__main__":
    program.run(main, required=["checkpoint", "out"])
