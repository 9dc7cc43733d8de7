"""Read and write Hugging Face Qwen2 and Llama checkpoints (config.json + safetensors) and their tokenizer files.

A Llama (SmolLM2, Llama 3) is our decoder without the q/k/v biases (or with Llama's own optional
attention and MLP biases), and is written back as `LlamaForCausalLM`; both share the tensor names.

Loading streams tensor by tensor: each Hugging Face tensor is read, converted to our layout and,
when shardings are given, placed on the mesh with `jax.make_array_from_callback`, so every device
receives only its own shard and the host holds at most one (stacked, for scanned layers) tensor.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from rlver_jax.checks import InputError
from rlver_jax.files import atomic_directory
from rlver_jax.models.config import ARCHITECTURES, Llama3RopeScaling, Qwen2Config
from rlver_jax.models.qwen2 import abstract_params

Params = Any
_SINGLE = "model.safetensors"
_INDEX = "model.safetensors.index.json"
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


class CheckpointError(InputError):
    """A Hugging Face checkpoint that cannot be loaded as a Qwen2 or Llama model."""


# Per architecture: the Hugging Face classes of a causal LM and of a critic (one-label token classifier).
_CLASSES = {"qwen2": ("Qwen2ForCausalLM", "Qwen2ForTokenClassification"),
            "llama": ("LlamaForCausalLM", "LlamaForTokenClassification")}


def config_from_hf(hf: dict[str, Any], path: str = "config.json", **overrides) -> Qwen2Config:
    """Our config from a Hugging Face Qwen2 or Llama `config.json` dict."""
    model_type = hf.get("model_type")
    if model_type not in ARCHITECTURES:
        raise CheckpointError(
            f"{path}: model_type={model_type!r}, expected one of {list(ARCHITECTURES)} "
            "(Qwen2/Qwen2.5 and Llama-family checkpoints such as SmolLM2)")
    llama = model_type == "llama"
    if llama and hf.get("pretraining_tp", 1) != 1:
        raise CheckpointError(f"{path}: pretraining_tp={hf['pretraining_tp']} is not supported (only 1)")
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{path}: hidden_act={hf['hidden_act']!r}, expected 'silu'")
    if hf.get("use_sliding_window", False):
        raise CheckpointError(f"{path}: use_sliding_window=true is not supported")
    rope_theta, rope_scaling = _rope(hf, path, default_theta=10000.0)
    try:
        fields = dict(
            vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
            num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
            num_kv_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]),
            intermediate_size=hf["intermediate_size"],
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            rope_theta=rope_theta, rope_scaling=rope_scaling,
            architecture=model_type,
            # Qwen2: q/k/v biases always, none elsewhere; Llama: its two flags.
            attention_bias=bool(hf.get("attention_bias", False)) if llama else True,
            o_bias=bool(hf.get("attention_bias", False)) if llama else False,
            mlp_bias=bool(hf.get("mlp_bias", False)) if llama else False,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
            initializer_range=float(hf.get("initializer_range", 0.02)))
    except KeyError as e:
        raise CheckpointError(f"{path}: missing field {e.args[0]!r}") from None
    head_dim = hf.get("head_dim")
    if head_dim is not None and head_dim != fields["hidden_size"] // fields["num_heads"]:
        if not llama:
            raise CheckpointError(f"{path}: head_dim={head_dim} differs from hidden_size/num_attention_heads")
        fields["head_size"] = int(head_dim)
    fields.update(overrides)
    try:
        return Qwen2Config(**fields)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None


def _rope(hf: dict[str, Any], path: str, default_theta: float) -> tuple[float, Llama3RopeScaling | None]:
    """RoPE's theta and scaling from either spelling: transformers 4's `rope_theta` (+ `rope_scaling`),
    transformers 5's `rope_parameters` (flat, or one dict per layer type). Plain RoPE and llama3's
    rescaling are implemented; any other rope type, or specs that disagree, is an error."""
    specs = []  # (field name, dict)
    for field in ("rope_scaling", "rope_parameters"):
        value = hf.get(field) or {}
        if not isinstance(value, dict):
            raise CheckpointError(f"{path}: {field}={value!r} is not a dict")
        if value and all(isinstance(v, dict) for v in value.values()):  # one dict per layer type
            specs += [(f"{field}.{k}", v) for k, v in value.items()]
        elif value:
            specs.append((field, value))
    scalings = {}
    for field, spec in specs:
        kind = spec.get("rope_type", spec.get("type", "default"))
        if kind not in ("default", "llama3"):
            raise CheckpointError(
                f"{path}: {field} has rope_type={kind!r}, which is not supported: only plain RoPE "
                "(rope_type 'default') and 'llama3' are implemented, and reading it as plain RoPE would give "
                "wrong positions")
        if kind == "llama3":
            try:
                scalings[field] = Llama3RopeScaling(
                    factor=float(spec["factor"]), low_freq_factor=float(spec["low_freq_factor"]),
                    high_freq_factor=float(spec["high_freq_factor"]),
                    original_max_position_embeddings=int(spec["original_max_position_embeddings"]))
            except KeyError as e:
                raise CheckpointError(f"{path}: {field} (rope_type 'llama3') lacks {e.args[0]!r}") from None
            except ValueError as e:
                raise CheckpointError(f"{path}: {field}: {e}") from None
        else:
            scalings[field] = None
        if spec.get("partial_rotary_factor", 1.0) != 1.0:
            raise CheckpointError(f"{path}: {field} has partial_rotary_factor={spec['partial_rotary_factor']}; "
                                  "only full rotary embeddings (1.0) are supported")
    thetas = {field: float(spec["rope_theta"]) for field, spec in specs if "rope_theta" in spec}
    if "rope_theta" in hf:
        thetas["rope_theta"] = float(hf["rope_theta"])
    if len(set(thetas.values())) > 1:
        raise CheckpointError(f"{path}: the RoPE thetas disagree ({thetas}); transformers 4 reads rope_theta, "
                              "5 reads rope_parameters: make them equal")
    if len(set(scalings.values())) > 1:
        raise CheckpointError(f"{path}: the RoPE scalings disagree ({scalings}); transformers 4 reads "
                              "rope_scaling, 5 reads rope_parameters: make them equal")
    return next(iter(thetas.values()), default_theta), next(iter(scalings.values()), None)


def config_to_hf(config: Qwen2Config, torch_dtype: str) -> dict[str, Any]:
    """A Hugging Face `config.json` dict for `Qwen2ForCausalLM` or `LlamaForCausalLM` (the config's
    architecture), or for a critic (`config.value_head`) the matching `...ForTokenClassification` with
    one label: its `score` layer is the value head, as verl and OpenRLHF load critics
    (`AutoModelForTokenClassification`, num_labels=1). RoPE is spelled as transformers 4 reads it
    (`rope_theta`, `rope_scaling`); transformers 5 converts that spelling on loading."""
    llama = config.architecture == "llama"
    if llama and config.attention_bias != config.o_bias:
        raise ValueError("a Llama has q/k/v and output biases together (attention_bias) or neither; "
                         f"got attention_bias={config.attention_bias}, o_bias={config.o_bias}")
    if not llama and (not config.attention_bias or config.o_bias or config.mlp_bias or config.head_size
                      and config.head_size != config.hidden_size // config.num_heads):
        raise ValueError("a Qwen2 has q/k/v biases, no other biases and head_dim = hidden_size / num_heads; "
                         "use architecture='llama' for another layout")
    causal, classifier = _CLASSES[config.architecture]
    critic = {"architectures": [classifier], "id2label": {"0": "LABEL_0"},
              "label2id": {"LABEL_0": 0}} if config.value_head else {}
    scaling = config.rope_scaling
    if llama:
        family = {"attention_bias": config.attention_bias, "mlp_bias": config.mlp_bias,
                  "head_dim": config.head_dim, "pretraining_tp": 1}
    else:
        family = {"use_sliding_window": False, "sliding_window": None, "max_window_layers": config.num_layers}
    return {
        "architectures": [causal],
        "model_type": config.architecture,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "initializer_range": config.initializer_range,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        **({"rope_scaling": {"rope_type": "llama3", **dataclasses.asdict(scaling)}} if scaling else {}),
        "tie_word_embeddings": config.tie_word_embeddings,
        **family,
        "attention_dropout": 0.0,
        "use_cache": True,
        "torch_dtype": torch_dtype,
        **critic,
    }


# --------------------------------------------------------------------------- name mapping
# Each of our parameters is built from Hugging Face tensors by a `(hf_names, to_ours, to_hf)`
# rule: `to_ours` maps the list of HF arrays to our array, `to_hf` maps back.


def _layer_rules(config: Qwen2Config) -> dict[tuple[str, ...], tuple[str, Callable, Callable]]:
    """The rules of the layer parameters this architecture has (a Llama: no q/k/v biases)."""
    d, n, k, h = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
    same = (lambda w: w, lambda w: w)
    rules = {
        ("input_norm", "scale"): ("input_layernorm.weight", lambda w: w, lambda w: w),
        ("post_attn_norm", "scale"): ("post_attention_layernorm.weight", lambda w: w, lambda w: w),
        ("attn", "q_kernel"): ("self_attn.q_proj.weight", lambda w: w.T.reshape(d, n, h),
                                    lambda w: w.reshape(d, n * h).T),
        ("attn", "q_bias"): ("self_attn.q_proj.bias", lambda w: w.reshape(n, h), lambda w: w.reshape(n * h)),
        ("attn", "k_kernel"): ("self_attn.k_proj.weight", lambda w: w.T.reshape(d, k, h),
                                    lambda w: w.reshape(d, k * h).T),
        ("attn", "k_bias"): ("self_attn.k_proj.bias", lambda w: w.reshape(k, h), lambda w: w.reshape(k * h)),
        ("attn", "v_kernel"): ("self_attn.v_proj.weight", lambda w: w.T.reshape(d, k, h),
                                    lambda w: w.reshape(d, k * h).T),
        ("attn", "v_bias"): ("self_attn.v_proj.bias", lambda w: w.reshape(k, h), lambda w: w.reshape(k * h)),
        ("attn", "o_kernel"): ("self_attn.o_proj.weight", lambda w: w.T.reshape(n, h, d),
                               lambda w: w.reshape(n * h, d).T),
        ("mlp", "gate_kernel"): ("mlp.gate_proj.weight", lambda w: w.T, lambda w: w.T),
        ("mlp", "up_kernel"): ("mlp.up_proj.weight", lambda w: w.T, lambda w: w.T),
        ("mlp", "down_kernel"): ("mlp.down_proj.weight", lambda w: w.T, lambda w: w.T),
        ("attn", "o_bias"): ("self_attn.o_proj.bias", *same),
        ("mlp", "gate_bias"): ("mlp.gate_proj.bias", *same),
        ("mlp", "up_bias"): ("mlp.up_proj.bias", *same),
        ("mlp", "down_bias"): ("mlp.down_proj.bias", *same),
    }
    absent = {("attn", b) for b in ("q_bias", "k_bias", "v_bias") if not config.attention_bias}
    absent |= {("attn", "o_bias")} if not config.o_bias else set()
    absent |= {("mlp", b) for b in ("gate_bias", "up_bias", "down_bias") if not config.mlp_bias}
    return {sub: rule for sub, rule in rules.items() if sub not in absent}


def _hf_expected_shape(name: str, config: Qwen2Config) -> tuple[int, ...]:
    d, f, h = config.hidden_size, config.intermediate_size, config.head_dim
    n, k, v = config.num_heads, config.num_kv_heads, config.vocab_size
    suffix_shapes = {
        "input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,),
        "self_attn.q_proj.weight": (n * h, d), "self_attn.q_proj.bias": (n * h,),
        "self_attn.k_proj.weight": (k * h, d), "self_attn.k_proj.bias": (k * h,),
        "self_attn.v_proj.weight": (k * h, d), "self_attn.v_proj.bias": (k * h,),
        "self_attn.o_proj.weight": (d, n * h), "self_attn.o_proj.bias": (d,),
        "mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d), "mlp.down_proj.weight": (d, f),
        "mlp.gate_proj.bias": (f,), "mlp.up_proj.bias": (f,), "mlp.down_proj.bias": (d,),
        "model.embed_tokens.weight": (v, d), "lm_head.weight": (v, d), "model.norm.weight": (d,),
        "score.weight": (1, d), "score.bias": (1,),
    }
    key = name.split(".", 3)[-1] if name.startswith("model.layers.") else name
    return suffix_shapes[key]


def _param_plan(config: Qwen2Config) -> list[tuple[tuple[str, ...], list[str], Callable, Callable]]:
    """(our path, HF tensor names, to_ours(list of arrays), to_hf(array) -> list of arrays)."""
    plan = [
        (("embed", "embedding"), ["model.embed_tokens.weight"], lambda ws: ws[0], lambda w: [w]),
        (("final_norm", "scale"), ["model.norm.weight"], lambda ws: ws[0], lambda w: [w]),
    ]
    if config.untied_lm_head:
        plan.append((("lm_head",), ["lm_head.weight"], lambda ws: ws[0].T, lambda w: [w.T]))
    layers = range(config.num_layers)
    for sub, (hf_suffix, fwd, bwd) in _layer_rules(config).items():
        names = [f"model.layers.{i}.{hf_suffix}" for i in layers]
        if config.scan_layers:
            plan.append((("layers",) + sub, names,
                         lambda ws, fwd=fwd: np.stack([fwd(w) for w in ws]),
                         lambda w, bwd=bwd: [bwd(x) for x in w]))
        else:
            for i, name in zip(layers, names):
                plan.append(((f"layer_{i}",) + sub, [name],
                             lambda ws, fwd=fwd: fwd(ws[0]), lambda w, bwd=bwd: [bwd(w)]))
    return plan


def tree_get(tree, path):
    """The node of nested dicts `tree` at `path` (a sequence of keys)."""
    for p in path:
        tree = tree[p]
    return tree


def tree_set(tree: dict, path, value) -> None:
    """Put `value` at `path` in nested dicts `tree`, making the dicts on the way."""
    for p in path[:-1]:
        tree = tree.setdefault(p, {})
    tree[path[-1]] = value


class _TensorReader:
    """Finds each tensor's safetensors file (single file or sharded index) and reads it."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        single, index = path / _SINGLE, path / _INDEX
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            self.file_of = {name: path / fname for name, fname in weight_map.items()}
        elif single.exists():
            with safe_open(str(single), "numpy") as f:
                self.file_of = {name: single for name in f.keys()}
        else:
            raise CheckpointError(f"{path}: neither {_SINGLE} nor {_INDEX} found")
        for fname in sorted(set(self.file_of.values())):
            if not fname.exists():
                raise CheckpointError(f"{fname}: listed in {index} but missing")
        self._open: dict[pathlib.Path, Any] = {}

    def read(self, name: str, expected_shape: tuple[int, ...]) -> np.ndarray:
        if name not in self.file_of:
            raise CheckpointError(f"{self.path}: tensor {name!r} not found in the checkpoint")
        fname = self.file_of[name]
        if fname not in self._open:
            self._open[fname] = safe_open(str(fname), "numpy")
        arr = self._open[fname].get_tensor(name)
        if tuple(arr.shape) != tuple(expected_shape):
            raise CheckpointError(
                f"{fname}: tensor {name!r} has shape {tuple(arr.shape)}, config.json implies {expected_shape}")
        return arr


# A critic's value head as Qwen2/LlamaForTokenClassification's `score` layer (weight [1, D], bias [1]).
_VALUE_HEAD = {"value_kernel": "score.weight", "value_bias": "score.bias"}


def load_pretrained(
    path: str | os.PathLike,
    dtype: str = "float32",
    shardings: Params | Callable[[Qwen2Config], Params] | None = None,
    compute_dtype: str | None = None,
    **config_overrides,
) -> tuple[Qwen2Config, Params]:
    """Load a Hugging Face Qwen2 or Llama directory as `(config, params)`.

    dtype: parameter dtype to load into ("float32" or "bfloat16"); compute_dtype defaults to it.
    shardings: optional pytree of
    `jax.sharding.Sharding` matching the params, or a function of the loaded config returning one
    (e.g. `lambda c: sharding.param_shardings(c, mesh, rules)`: the config is known only once
    config.json is read); each tensor then goes straight to its shards.
    config_overrides: other Qwen2Config fields (compute dtype, scan_layers, remat, value_head...).
    With value_head=True the model is a critic: no LM head is read, and the value head is the
    checkpoint's `score` layer (a critic saved by `save_pretrained`, ...ForTokenClassification
    with one label) or, in a causal-LM checkpoint, zero.
    """
    path = pathlib.Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise CheckpointError(f"{cfg_file}: not found (expected a Hugging Face model directory)")
    config = config_from_hf(json.loads(cfg_file.read_text()), str(cfg_file), param_dtype=dtype,
                            dtype=compute_dtype or dtype, **config_overrides)
    if callable(shardings):
        shardings = shardings(config)
    reader = _TensorReader(path)
    np_dtype = _NP_DTYPES[dtype]
    abstract = abstract_params(config)
    params: dict = {}
    plan = _param_plan(config)
    # A bias the architecture lacks (a Qwen2 labelled llama, attention_bias false over biased
    # tensors) would be dropped silently: the model would not be the checkpoint's.
    read = {name for _, names, _, _ in plan for name in names}
    unread = sorted(n for n in reader.file_of if n.endswith(".bias") and n not in read and not n.startswith("score."))
    if unread:
        raise CheckpointError(f"{cfg_file}: the checkpoint holds {len(unread)} bias tensors (e.g. {unread[0]!r}) that "
                              f"model_type={config.architecture!r} with these attention_bias/mlp_bias fields has not")
    for our_path, names, to_ours, _ in plan:
        arr = to_ours([reader.read(n, _hf_expected_shape(n, config)) for n in names]).astype(np_dtype)
        expected = tree_get(abstract, our_path).shape
        assert arr.shape == expected, (our_path, arr.shape, expected)  # our own mapping, not input
        tree_set(params, our_path, _place(arr, None if shardings is None else tree_get(shardings, our_path)))
    if config.value_head:
        for name, hf_name in _VALUE_HEAD.items():
            leaf = abstract[name]
            arr = (reader.read(hf_name, _hf_expected_shape(hf_name, config)).reshape(leaf.shape)
                   if hf_name in reader.file_of else np.zeros(leaf.shape))
            sharding = None if shardings is None else shardings[name]
            tree_set(params, (name,), _place(arr.astype(np.float32), sharding))
    return config, params


def _place(arr: np.ndarray, sharding) -> jax.Array:
    if sharding is None:
        return jnp.asarray(arr)
    return jax.make_array_from_callback(arr.shape, sharding, lambda idx: arr[idx])


def _to_host(x: jax.Array) -> np.ndarray:
    """Gather a (possibly sharded, possibly multi-host) array to a host numpy array."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)


def hf_tensors(config: Qwen2Config, params: Params, dtype: str | None = None,
               keep: Callable[[str], bool] = lambda name: True) -> dict[str, np.ndarray]:
    """`params` as host arrays under their Hugging Face names (in `dtype`, default the parameter
    dtype), only the names `keep` accepts (the others are not gathered)."""
    np_dtype = _NP_DTYPES[dtype or config.param_dtype]
    tensors: dict[str, np.ndarray] = {}
    for our_path, names, _, to_hf in _param_plan(config):
        if any(keep(n) for n in names):
            arrays = to_hf(_to_host(tree_get(params, our_path)))
            tensors.update({n: np.ascontiguousarray(np.asarray(a).astype(np_dtype)) for n, a in zip(names, arrays)
                            if keep(n)})
    if config.value_head:
        for name, hf_name in _VALUE_HEAD.items():
            if keep(hf_name):
                tensors[hf_name] = _to_host(params[name]).reshape(_hf_expected_shape(hf_name, config)).astype(np_dtype)
    return tensors


def save_pretrained(
    config: Qwen2Config,
    params: Params,
    path: str | os.PathLike,
    dtype: str | None = None,
    max_shard_bytes: int = 5 * 1024**3,
) -> pathlib.Path:
    """Write a directory that `transformers.AutoModelForCausalLM.from_pretrained` loads.

    Written atomically (a temporary sibling directory renamed into place), in `dtype` (default:
    the parameter dtype), sharded with an index file above `max_shard_bytes`. A critic
    (`config.value_head`) is written as `...ForTokenClassification` with one label (the value
    head as its `score` layer, no LM head), which `AutoModelForTokenClassification` loads. In
    multi-host runs every process must call this (arrays are gathered); only process 0 writes.
    """
    path = pathlib.Path(path)
    dtype = dtype or config.param_dtype
    tensors = hf_tensors(config, params, dtype)
    if jax.process_index() != 0:
        return path
    with atomic_directory(path) as tmp:
        (tmp / "config.json").write_text(json.dumps(config_to_hf(config, dtype), indent=2))
        shards, current, size = [], {}, 0
        for name, arr in tensors.items():
            if current and size + arr.nbytes > max_shard_bytes:
                shards.append(current)
                current, size = {}, 0
            current[name] = arr
            size += arr.nbytes
        shards.append(current)
        metadata = {"format": "pt"}  # transformers refuses safetensors files without it
        if len(shards) == 1:
            save_file(shards[0], str(tmp / _SINGLE), metadata=metadata)
        else:
            weight_map = {}
            for i, shard in enumerate(shards):
                fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(tmp / fname), metadata=metadata)
                weight_map.update({name: fname for name in shard})
            total = sum(a.nbytes for a in tensors.values())
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / _INDEX).write_text(json.dumps(index, indent=2))
    return path
