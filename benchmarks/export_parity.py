r"""A training run's Hugging Face export against the run itself (issue 25's done-when):

  .venv/bin/python launch/export_hf.py --checkpoint=RUN --out=EXPORT --dtype=float32
  .venv/bin/python benchmarks/export_parity.py --run=RUN --export=EXPORT [--base=HF_DIR]

transformers loads EXPORT (for a smol run a LlamaForCausalLM) and its logits on two chat prompts are
compared with our model on RUN's latest checkpoint; with --base, also how far training moved the
logits from that base model.
"""

import json
import pathlib

import jax.numpy as jnp
import numpy as np
import torch
import transformers
from absl import app, flags

from rlver_jax.eval import policy_loading
from rlver_jax.eval.run_checkpoint import locate_checkpoint
from rlver_jax.models import qwen2
from rlver_jax.parallel import sharding

_RUN = flags.DEFINE_string("run", None, "Training WORKDIR (latest step) or WORKDIR/checkpoints/STEP.", required=True)
_EXPORT = flags.DEFINE_string("export", None, "launch/export_hf.py's --out for that run.", required=True)
_BASE = flags.DEFINE_string("base", "", "Hugging Face directory the run started from (optional).")
_PROMPTS = ("My son moved out and he barely calls.", "I failed my driving test again today.")


def _batch(tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """The prompts as chat turns with the generation prompt, right-padded."""
    ids = [tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                   tokenize=False), add_special_tokens=False)["input_ids"]
           for p in _PROMPTS]
    tokens = np.full((len(ids), max(map(len, ids))), tokenizer.pad_token_id or 0)
    mask = np.zeros(tokens.shape, np.int32)
    for i, row in enumerate(ids):
        tokens[i, :len(row)], mask[i, :len(row)] = row, 1
    return tokens, mask


def _torch_logits(path: str, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    print(f"{path}: {type(model).__name__}")
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask)).logits.numpy()


def main(_) -> None:
    export = pathlib.Path(_EXPORT.value)
    print("architectures:", json.loads((export / "config.json").read_text())["architectures"])
    mesh = sharding.make_mesh((1, 1, 1))
    policy = policy_loading.load_checkpoint_policy(locate_checkpoint(_RUN.value, "--run"), mesh,
                                                   "fsdp_tensor")
    tokens, mask = _batch(transformers.AutoTokenizer.from_pretrained(export))
    ours = np.asarray(qwen2.forward(policy.model, policy.params, jnp.asarray(tokens), jnp.asarray(mask)))
    theirs = _torch_logits(str(export), tokens, mask)
    valid = mask.astype(bool)
    print(f"max |ours on the checkpoint - transformers on the export|: {np.abs(ours - theirs)[valid].max():.3g} "
          f"(largest logit {np.abs(theirs[valid]).max():.3g})")
    if _BASE.value:
        base = _torch_logits(_BASE.value, tokens, mask)
        print(f"max |export - base| logits (what training moved): {np.abs(theirs - base)[valid].max():.3g}")


if __name__ == "__main__":
    app.run(main)
