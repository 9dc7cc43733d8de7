"""Loading a run's policy from its checkpoint, and exporting it as a Hugging Face directory that
transformers loads with the same logits and token ids: the installed transformers (5.x) on the tiny
and the real Qwen2.5 tokenizer, and transformers 4.x when RLVER_TF4_PYTHON names a Python that has
it (docs/tokenizers.md)."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest
import tokenizers
import torch
import transformers

from configs.grpo_think import get_config as train_config
from rlver_jax.eval.export import export_hf
from rlver_jax.eval.policy_loading import LoadedPolicy, load_checkpoint_policy
from rlver_jax.eval.run_checkpoint import locate_checkpoint
from rlver_jax.models import hf_io, lora, qwen2
from rlver_jax.models.config import get_preset
from rlver_jax.parallel import sharding
from rlver_jax.rl import train_state
from rlver_jax.text import chat
from rlver_jax.train import checkpoint
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
        state = train_state.init_train_state(actor, optax.adam(1e-3), None, None, seed)
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_export_command(tmp_path, tiny_tokenizer_dir):
    make_run(tmp_path / "run", tiny_tokenizer_dir)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, str(REPO / "launch" / "export_hf.py"), f"--checkpoint={tmp_path / 'run'}",
           f"--out={tmp_path / 'hf'}"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "checkpoints/3" in done.stdout and "bfloat16" in done.stdout
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == "bfloat16"


@pytest.mark.slow
def test_lora_run_exports_the_merged_model_and_its_peft_adapter(tmp_path, tiny_tokenizer_dir):
    """A LoRA run's checkpoint holds adapters (and tiny's default modules_to_save, the embedding and
    the norms, as deltas): launch/export_hf.py writes the plain model with them merged (W + scale *
    A @ B, W + delta, in numpy here), which transformers loads with no adapter tensors and our
    logits, and with --peft_adapter the adapters alone, which peft puts on the base with the same."""
    peft = pytest.importorskip("peft", reason="peft is a test extra: pip install -e '.[test]'")
    config = train_config("tiny")
    config.workdir = str(tmp_path / "run")
    config.lora.rank, config.lora.alpha, config.lora.targets = 4, 8.0, "q,v,o,down"
    settings = lora.LoraSettings.from_config(config.lora)
    assert settings.modules_to_save == ("embed", "norms")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(config.to_json_best_effort(indent=2))
    shutil.copytree(tiny_tokenizer_dir, tmp_path / "run" / "tokenizer")
    cfg = get_preset("tiny")
    base = jax.tree.map(np.asarray, sharding.init_sharded_params(cfg, train_state.seed_keys(config.seed).init, _mesh(),
                                                                 "fsdp"))
    rng = np.random.default_rng(0)  # B != 0, or the merge would be the base
    adapters = jax.tree.map(lambda x: rng.normal(0.0, 0.2, x.shape).astype(np.float32),
                            lora.init_adapters(settings, base, jax.random.key(1)))
    manager = checkpoint.make_manager(tmp_path / "run" / "checkpoints", save_every=1, keep=1, async_save=False)
    checkpoint.save(manager, 2, train_state.init_train_state(adapters, optax.adam(1e-3), None, None, config.seed),
                    {"step": 2, "seed": config.seed}, force=True)
    checkpoint.wait(manager)
    manager.close()

    cmd = [sys.executable, str(REPO / "launch" / "export_hf.py"), f"--checkpoint={tmp_path / 'run'}",
           f"--out={tmp_path / 'hf'}", "--dtype=float32", f"--peft_adapter={tmp_path / 'adapter'}"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=180)
    assert done.returncode == 0, done.stderr
    assert "LoRA rank 4 merged" in done.stdout

    merged = jax.tree.map(np.copy, base)
    for t in settings.targets:
        module, kernel, _, _ = lora.TARGETS[t]
        for group in ("layer_0", "layer_1"):
            w, ad = merged[group][module][kernel], adapters[group][module][kernel]
            a = ad["lora_a"].reshape(-1, settings.rank)
            merged[group][module][kernel] = w + 2.0 * (a @ ad["lora_b"].reshape(settings.rank, -1)).reshape(w.shape)
    merged["embed"]["embedding"] = merged["embed"]["embedding"] + adapters["embed"]["embedding"]["delta"]
    merged["final_norm"]["scale"] = merged["final_norm"]["scale"] + adapters["final_norm"]["scale"]["delta"]
    for group in ("layer_0", "layer_1"):
        for norm in ("input_norm", "post_attn_norm"):
            merged[group][norm]["scale"] = merged[group][norm]["scale"] + adapters[group][norm]["scale"]["delta"]
    ids = np.array([[3, 17, 200, 5, 99, 411, 7]])
    ours = np.asarray(qwen2.forward(cfg, merged, ids))
    from safetensors import safe_open
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "np") as f:
        assert not [k for k in f.keys() if "lora" in k]
    hf_io.save_pretrained(cfg, base, tmp_path / "base")
    with torch.no_grad():
        plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
        hf_base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32)
        got_base = hf_base(torch.tensor(ids)).logits.numpy()
        adapted = peft.PeftModel.from_pretrained(hf_base, tmp_path / "adapter")
        got_peft = adapted(torch.tensor(ids)).logits.numpy()
        got_plain = plain(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(got_plain, ours, rtol=1e-4, atol=2e-4)
    np.testing.assert_allclose(got_peft, ours, rtol=1e-4, atol=2e-4)
    assert np.abs(got_base - ours).max() > 1e-2  # the adapters changed the model


# --------------------------------------------------------------------------- tokenizer files: 4.x and 5.x

# Chinese, emoji, think tags, a non-special added token of Qwen2.5 and a spelled control token.
_MESSAGES = [{"role": "system", "content": "先在<think></think>里思考，再回复。"},
             {"role": "user", "content": "我考试没过 😢 <tool_call> what does <|im_end|> mean?"},
             {"role": "assistant", "content": "<think>温柔一点</think>听起来真的很难受 🌧️"}]
_TEXTS = ["Hello, world!", "你好", "今天工作好累，我真的撑不住了。谢谢你 😊🙏🏽 👨‍👩‍👧", "a <tool_call> <|im_end|> b",
          "  spaced\n\n\tlines  \r\n", "<think>hm</think>ok"]
# Keys only transformers 5 writes or reads; 4.x fails on the first two.
_FIVE_ONLY = {"backend", "extra_special_tokens", "is_local", "local_files_only"}
# Qwen2.5-*-Instruct's tokenizer_config.json, less its added_tokens_decoder and chat_template.
_QWEN25_CONFIG = {
    "add_bos_token": False, "add_prefix_space": False,
    "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                                  "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
                                  "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
                                  "<|video_pad|>"],
    "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
    "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
    "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
}
# Each tokenizer's fixture and its model's embedding rows (Qwen2.5-0.5B's 151,936 for the real one).
_TOKENIZERS = {"tiny": ("tiny_tokenizer_dir", 512), "qwen2.5": ("qwen_tokenizer_dir", 151936)}


def random_policy(tokenizer_dir, vocab_size: int, seed: int = 0) -> LoadedPolicy:
    """A random tiny model (numpy init: no compile) with the tokenizer of `tokenizer_dir`."""
    cfg = get_preset("tiny", vocab_size=vocab_size)
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda x: rng.normal(0.0, 0.1, x.shape).astype(x.dtype), qwen2.abstract_params(cfg))
    return LoadedPolicy(cfg, params, chat.ChatTokens.from_tokenizer(chat.load_tokenizer(tokenizer_dir)),
                        f"random (seed {seed})")


@pytest.fixture(scope="module", params=sorted(_TOKENIZERS))
def exported(request, tmp_path_factory):
    """(name, policy, export directory) for each tokenizer, exported in float32."""
    fixture, vocab = _TOKENIZERS[request.param]
    policy = random_policy(request.getfixturevalue(fixture), vocab)
    return request.param, policy, export_hf(policy, tmp_path_factory.mktemp("export") / "hf", dtype="float32")


def test_exported_files_share_one_mode_and_no_staging_is_left(exported):
    """model.safetensors (safetensors writes it 0600) as readable as the other files: the mode a
    plain write gives under the umask; the staging directories are gone."""
    _, _, out = exported
    mask = os.umask(0o022)
    os.umask(mask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes["model.safetensors"] == modes["config.json"] == 0o666 & ~mask, modes
    assert set(modes.values()) == {0o666 & ~mask} and out.stat().st_mode & 0o777 == 0o777 & ~mask, modes
    assert [p.name for p in out.parent.iterdir()] == [out.name]


def test_exported_tokenizer_files_are_the_qwen25_release_layout(exported):
    name, policy, out = exported
    assert {p.name for p in out.iterdir()} >= {"tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"}
    assert not (out / "chat_template.jinja").exists()  # the template lives in tokenizer_config.json only
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert not config.keys() & _FIVE_ONLY
    backend = json.loads((out / "tokenizer.json").read_text())
    assert config["added_tokens_decoder"] == {
        str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
        for t in backend["added_tokens"]}
    assert config["chat_template"] == policy.chat.tokenizer.chat_template
    if name == "qwen2.5":
        assert {k: v for k, v in config.items() if k not in ("added_tokens_decoder", "chat_template")} == \
            _QWEN25_CONFIG
    else:  # no NFC normaliser: transformers 5 would add one to a "Qwen2Tokenizer"
        assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
        assert (config["eos_token"], config["pad_token"], config["bos_token"]) == ("<|im_end|>", "<|endoftext|>", None)
    assert config["tokenizer_class"] != "TokenizersBackend"
    # vocab.json + merges.txt (what slow-tokenizer readers use) are the BPE of tokenizer.json.
    vocab = json.loads((out / "vocab.json").read_text())
    merges = (out / "merges.txt").read_text().splitlines()
    assert merges[0] == "#version: 0.2" and len(merges) - 1 == len(backend["model"]["merges"])
    assert vocab == backend["model"]["vocab"]
    if name == "qwen2.5":
        assert (len(vocab), len(merges) - 1) == (151643, 151387)
    plain = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(str(out / "vocab.json"), str(out / "merges.txt")))
    full = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    plain.normalizer, plain.pre_tokenizer = full.normalizer, full.pre_tokenizer
    for text in _TEXTS[:3]:
        assert plain.encode(text).ids == full.encode(text).ids
    # The installed transformers reads it back: the same ids as the policy's tokenizer.
    loaded = transformers.AutoTokenizer.from_pretrained(out)
    for text in _TEXTS:
        assert (loaded.encode(text, add_special_tokens=False)
                == policy.chat.tokenizer.encode(text, add_special_tokens=False))
    assert loaded.get_added_vocab() == policy.chat.tokenizer.get_added_vocab()
    assert (loaded.eos_token_id, loaded.pad_token_id) == (policy.chat.im_end, policy.chat.end_of_text)


def _our_logits(policy: LoadedPolicy, ids: list[int]) -> np.ndarray:
    return np.asarray(qwen2.forward(policy.model, policy.params, np.array([ids])))[0]


@pytest.mark.slow
def test_export_loads_in_transformers_with_its_tokenizer(exported):
    """Weights, tokenizer, chat template and stop ids of the export, read by the installed
    transformers, against ours: on the real Qwen2.5 vocabulary as well as the tiny one."""
    name, policy, out = exported
    ids, _ = chat.conversation_ids(policy.chat, _MESSAGES, add_generation_prompt=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(_MESSAGES, add_generation_prompt=True, tokenize=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor([ids])).logits.numpy()[0]
    np.testing.assert_allclose(_our_logits(policy, ids), theirs, rtol=1e-4, atol=1e-4)
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id]
    if name == "qwen2.5":
        assert generation["eos_token_id"] == [151645, 151643] and 151657 in ids  # <tool_call>: one token


# Run by RLVER_TF4_PYTHON: loads an export with transformers 4.x, writes what it read as JSON + .npy.
_TF4_SCRIPT = r"""
import json, sys
import numpy as np, torch, transformers
out, texts, messages, ids, result = sys.argv[1], *map(json.loads, sys.argv[2:5]), sys.argv[5]
fast = transformers.AutoTokenizer.from_pretrained(out)
slow = transformers.AutoTokenizer.from_pretrained(out, use_fast=False)
model = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
with torch.no_grad():
    np.save(result + ".npy", model(input_ids=torch.tensor([ids])).logits.numpy()[0])
json.dump({
    "version": transformers.__version__, "fast_class": type(fast).__name__, "slow_class": type(slow).__name__,
    "fast": [fast.encode(t, add_special_tokens=False) for t in texts],
    "slow": [slow.encode(t, add_special_tokens=False) for t in texts],
    "split": [fast.encode(t, add_special_tokens=False, split_special_tokens=True) for t in texts],
    "chat_text": fast.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
    "eos_pad": [fast.eos_token_id, fast.pad_token_id], "added": fast.get_added_vocab(),
}, open(result + ".json", "w"))
"""


@pytest.mark.skipif(not os.environ.get("RLVER_TF4_PYTHON"),
                    reason="set RLVER_TF4_PYTHON to a Python with transformers 4.x (docs/tokenizers.md)")
@pytest.mark.slow
def test_export_loads_in_transformers_4(exported, tmp_path):
    """The export read by transformers 4.x (a separate venv): fast and slow tokenizers give our
    ids, the model our logits."""
    name, policy, out = exported
    ours = policy.chat.tokenizer
    ids, _ = chat.conversation_ids(policy.chat, _MESSAGES, add_generation_prompt=True)
    result = tmp_path / "tf4"
    done = subprocess.run(
        [os.environ["RLVER_TF4_PYTHON"], "-c", _TF4_SCRIPT, str(out), json.dumps(_TEXTS), json.dumps(_MESSAGES),
         json.dumps(ids), str(result)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(result.with_suffix(".json").read_text())
    assert seen["version"].startswith("4.")
    assert seen["fast_class"] == ("Qwen2TokenizerFast" if name == "qwen2.5" else "PreTrainedTokenizerFast")
    plain = [ours.encode(t, add_special_tokens=False) for t in _TEXTS]
    assert seen["fast"] == plain
    if name == "qwen2.5":  # the slow tokenizer reads vocab.json + merges.txt (the tiny one has no slow class)
        assert seen["slow_class"] == "Qwen2Tokenizer" and seen["slow"] == plain
    assert seen["split"] == [ours.encode(t, add_special_tokens=False, split_special_tokens=True) for t in _TEXTS]
    assert seen["chat_text"] == ours.decode(ids)
    assert seen["eos_pad"] == [policy.chat.im_end, policy.chat.end_of_text]
    assert seen["added"] == ours.get_added_vocab()
    np.testing.assert_allclose(np.load(result.with_suffix(".npy")), _our_logits(policy, ids), rtol=1e-4, atol=1e-4)
