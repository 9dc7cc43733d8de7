"""Loading a run's policy from its checkpoint, and exporting it as a Hugging Face directory that
transformers loads with the same logits."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest
import torch
import transformers

from configs.grpo_think import get_config as train_config
from rlver_jax import chat, checkpoint, sharding
from rlver_jax.eval.export import export_hf
from rlver_jax.eval.policy_loading import load_checkpoint_policy, locate_checkpoint
from rlver_jax.models import qwen2
from rlver_jax.models.config import get_preset
from rlver_jax.rl import trainer
from tests.conftest import REPO


def make_run(root, tokenizer_dir, *, scan_layers=False, think=True, steps=(3,), seed=0):
    """A training work directory as launch/train.py leaves it: config.json, tokenizer/ and
    checkpoints of a whole TrainState (random tiny actor, Adam state). Returns the actor saved
    at the last step."""
    config = train_config("tiny")
    config.workdir = str(root)
    config.model.scan_layers = scan_layers
    config.rollout.think = think
    root.mkdir(parents=True)
    (root / "config.json").write_text(config.to_json_best_effort(indent=2))
    shutil.copytree(tokenizer_dir, root / "tokenizer")
    manager = checkpoint.make_manager(root / "checkpoints", save_every=1, keep=5, async_save=False)
    abstract = qwen2.abstract_params(get_preset("tiny", scan_layers=scan_layers))
    for step in steps:
        rng = np.random.default_rng([seed, step])  # numpy: no model compile in a test
        actor = jax.tree.map(lambda x: rng.normal(0.0, 0.1, x.shape).astype(x.dtype), abstract)
        state = trainer.init_train_state(actor, optax.adam(1e-3), None, None, seed)
        checkpoint.save(manager, step, state, {"step": step, "seed": seed}, force=True)
    checkpoint.wait(manager)
    manager.close()
    return actor


def _mesh():
    return sharding.make_mesh((1, -1, 1))


@pytest.mark.parametrize("scan_layers", [False, True])
def test_checkpoint_policy_is_the_saved_actor(tmp_path, tiny_tokenizer_dir, scan_layers):
    actor = make_run(tmp_path / "run", tiny_tokenizer_dir, scan_layers=scan_layers, steps=(2, 3))
    loaded = load_checkpoint_policy(locate_checkpoint(tmp_path / "run", "--checkpoint"), _mesh(), "fsdp")
    assert loaded.source.endswith("checkpoints/3")
    assert loaded.model == get_preset("tiny", scan_layers=scan_layers)
    jax.tree.map(np.testing.assert_array_equal, loaded.params, actor)
    earlier = load_checkpoint_policy(locate_checkpoint(tmp_path / "run/checkpoints/2", "--checkpoint"), _mesh(),
                                     "fsdp")
    assert earlier.source.endswith("checkpoints/2")
    assert not np.array_equal(earlier.params["embed"]["embedding"], actor["embed"]["embedding"])


def test_bad_checkpoint_paths_name_the_flag(tmp_path, tiny_tokenizer_dir):
    with pytest.raises(FileNotFoundError, match="--checkpoint='.*nowhere': no such directory"):
        locate_checkpoint(tmp_path / "nowhere", "--checkpoint")
    (tmp_path / "not_a_run").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        locate_checkpoint(tmp_path / "not_a_run", "--checkpoint")
    make_run(tmp_path / "run", tiny_tokenizer_dir)
    with pytest.raises(FileNotFoundError, match="no step 7; available: \\[3\\]"):
        load_checkpoint_policy(locate_checkpoint(tmp_path / "run/checkpoints/7", "--checkpoint"), _mesh(), "fsdp")
    config = json.loads((tmp_path / "run/config.json").read_text())
    config["model"]["path"] = str(tmp_path / "moved_base_model")
    (tmp_path / "run/config.json").write_text(json.dumps(config))
    with pytest.raises(FileNotFoundError, match="moved_base_model/config.json: not found.*--base_path"):
        load_checkpoint_policy(locate_checkpoint(tmp_path / "run", "--checkpoint"), _mesh(), "fsdp")


def test_export_loads_in_transformers_with_the_same_logits(tmp_path, tiny_tokenizer_dir):
    actor = make_run(tmp_path / "run", tiny_tokenizer_dir, scan_layers=True)
    loaded = load_checkpoint_policy(locate_checkpoint(tmp_path / "run", "--checkpoint"), _mesh(), "fsdp")
    out = export_hf(loaded, tmp_path / "hf", dtype="float32")
    assert not list(tmp_path.glob(".hf*")), "no staging directory is left behind"

    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    messages = [{"role": "user", "content": "I failed my exam and I feel awful."},
                {"role": "assistant", "content": "<think>be gentle</think>That sounds painful."}]
    ids, _ = chat.conversation_ids(loaded.chat, messages, add_generation_prompt=True)
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == \
        loaded.chat.tokenizer.decode(ids)
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor([ids])).logits.numpy()
    ours = np.asarray(qwen2.forward(get_preset("tiny", scan_layers=True), actor, np.array([ids])))
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"][0] == tokenizer.convert_tokens_to_ids("<|im_end|>")

    with pytest.raises(FileExistsError, match="--out=.* exists"):
        export_hf(loaded, out, dtype="float32")


def test_export_command(tmp_path, tiny_tokenizer_dir):
    make_run(tmp_path / "run", tiny_tokenizer_dir)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, str(REPO / "launch" / "export_hf.py"), f"--checkpoint={tmp_path / 'run'}",
           f"--out={tmp_path / 'hf'}"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "checkpoints/3" in done.stdout and "bfloat16" in done.stdout
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == "bfloat16"
