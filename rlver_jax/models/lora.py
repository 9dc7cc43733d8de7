"""LoRA adapters on the decoder's projection kernels, as a small explicit functional transform.

An adapter for kernel W [*in, *out] is two leaves, `lora_a` [*in, rank] (random) and `lora_b`
[rank, *out] (zeros, so a fresh adapter leaves the model equal to its base); the adapted kernel is
W + scale * A @ B with scale = alpha / rank. The adapters form their own pytree, nested like the
base parameters ({"layers": {"attn": {"q_kernel": {"lora_a", "lora_b"}}}}), with logical axes
derived from the base kernel's (the new axis is "lora_rank"), so sharding rules, the memory planner
and orbax treat them as ordinary parameters; the base tree stays frozen and is held once.

`modules_to_save` (PEFT's name) trains whole modules beside the adapters, as LongLoRA's "LoRA+"
does (Chen et al. 2023: trainable embeddings and norms close most of LoRA's gap to full
fine-tuning): "embed" (the embedding, and an untied LM head) and "norms" (every RMSNorm scale).
Each such leaf W gets a sibling {"delta"} (zeros, fp32) and trains as W + delta, so the frozen
base is still held once and a fresh state is still the base bit for bit.

Our own ~100 lines, not qwix: qwix is not installed, and our projections are explicit 2-D matmuls
(qwen2._dense), so the adapter needs nothing from a module-interception library.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec

from rlver_jax.models import hf_io
from rlver_jax.models.config import Qwen2Config
from rlver_jax.models.hf_io import tree_get, tree_set
from rlver_jax.models.lora_settings import MODULES, TARGETS, LoraSettings

Params = Any

_LAYER_MODULES = ("input_norm", "post_attn_norm")  # MODULES paths inside each decoder layer
RANK_AXIS = "lora_rank"


def _layer_groups(params: Params) -> list[str]:
    """The keys of the base tree holding decoder layers ("layers" scanned, or "layer_0", ...)."""
    return [k for k in params if k == "layers" or k.startswith("layer_")]


def _sites(settings: LoraSettings, params: Params):
    """(layer group, module, kernel, input dims) of every adapted kernel."""
    for group in _layer_groups(params):
        for t in settings.targets:
            module, kernel, in_dims, _ = TARGETS[t]
            yield group, module, kernel, in_dims


def _saved_leaves(settings: LoraSettings, params: Params):
    """Paths (tuples of keys) of the leaves of `params` that modules_to_save trains whole; a path
    absent from `params` (a tied model's LM head, a critic's) is skipped."""
    for m in settings.modules_to_save:
        for path in MODULES[m][0]:
            prefixes = [(g,) for g in _layer_groups(params)] if path[0] in _LAYER_MODULES else [()]
            for prefix in prefixes:
                try:
                    tree_get(params, prefix + path)
                except KeyError:
                    continue
                yield prefix + path


def _hf_modules(settings: LoraSettings) -> list[str]:
    """The Hugging Face module names of modules_to_save, as PEFT's adapter_config lists them."""
    return sorted({m for name in settings.modules_to_save for m in MODULES[name][1]})


def init_adapters(settings: LoraSettings, base: Params, rng: jax.Array) -> Params:
    """Fresh adapters (fp32): lora_a ~ normal(1/sqrt(fan_in)) as Kaiming-style LoRA inits, lora_b
    zeros; a zero {"delta"} for each leaf of modules_to_save."""
    out: dict = {}
    for path in _saved_leaves(settings, base):
        tree_set(out, path, {"delta": jnp.zeros(tree_get(base, path).shape, jnp.float32)})
    for i, (group, module, kernel, in_dims) in enumerate(_sites(settings, base)):
        w = base[group][module][kernel]
        lead = 1 if group == "layers" else 0  # the scanned stack's layer axis
        in_shape, out_shape = w.shape[lead:lead + in_dims], w.shape[lead + in_dims:]
        a_shape = w.shape[:lead] + in_shape + (settings.rank,)
        a = jax.random.normal(jax.random.fold_in(rng, i), a_shape, jnp.float32) / math.sqrt(math.prod(in_shape))
        b = jnp.zeros(w.shape[:lead] + (settings.rank,) + out_shape, jnp.float32)
        out.setdefault(group, {}).setdefault(module, {})[kernel] = {"lora_a": a, "lora_b": b}
    return out


def adapter_axes(settings: LoraSettings, base_axes: Params) -> Params:
    """Logical axes of the adapters from the base kernels' (`qwen2.logical_axes`); a delta's are its
    leaf's."""
    out: dict = {}
    for path in _saved_leaves(settings, base_axes):
        tree_set(out, path, {"delta": tree_get(base_axes, path)})
    for group, module, kernel, in_dims in _sites(settings, base_axes):
        spec = tuple(base_axes[group][module][kernel])
        lead = 1 if group == "layers" else 0
        a = spec[:lead + in_dims] + (RANK_AXIS,)
        b = spec[:lead] + (RANK_AXIS,) + spec[lead + in_dims:]
        out.setdefault(group, {}).setdefault(module, {})[kernel] = {
            "lora_a": PartitionSpec(*a), "lora_b": PartitionSpec(*b)}
    return out


def delta(settings: LoraSettings, adapter: dict, in_dims: int, scanned: bool) -> jax.Array:
    """scale * A @ B in fp32, shaped like the kernel."""
    a, b = adapter["lora_a"].astype(jnp.float32), adapter["lora_b"].astype(jnp.float32)
    r = settings.rank
    if scanned:
        a2 = a.reshape(a.shape[0], -1, r)
        d = jnp.einsum("lir,lro->lio", a2, b.reshape(b.shape[0], r, -1))
        return settings.scale * d.reshape(a.shape[:-1] + b.shape[2:])
    d = a.reshape(-1, r) @ b.reshape(r, -1)
    return settings.scale * d.reshape(a.shape[:-1] + b.shape[1:])


def merge(settings: LoraSettings, base: Params, adapters: Params, dtype=None) -> Params:
    """The plain parameter tree with every adapted kernel replaced by W + scale * A @ B and every
    leaf of modules_to_save by W + delta (summed in fp32, stored in `dtype`, default the base
    leaf's); rank 0 returns `base` itself."""
    if not settings.enabled:
        return base
    merged = jax.tree_util.tree_map(lambda x: x, base)  # a new tree: `base` stays as it is
    for path in _saved_leaves(settings, base):
        w = tree_get(base, path)
        tree_set(merged, path, (w.astype(jnp.float32) + tree_get(adapters, path)["delta"]).astype(dtype or w.dtype))
    for group, module, kernel, in_dims in _sites(settings, base):
        w = base[group][module][kernel]
        d = delta(settings, adapters[group][module][kernel], in_dims, group == "layers")
        merged[group][module][kernel] = (w.astype(jnp.float32) + d).astype(dtype or w.dtype)
    return merged


def full_rank_rate(settings: LoraSettings) -> optax.GradientTransformation:
    """Appended to a LoRA optimizer whose rate is config.optim's x lr_multiplier: scales the updates
    of every leaf but the adapter factors (modules_to_save deltas, a critic's value head) back by
    1 / lr_multiplier. The ~10x rate suits low-rank factors only ("LoRA Without Regret"); a whole
    module trains at the full fine-tuning rate (at 10x the tiny run's entropy fell from 6.22 to
    2.48 in 40 steps, docs/benchmarks.md)."""
    def mask(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, _: getattr(path[-1], "key", None) not in ("lora_a", "lora_b"), params)

    return optax.masked(optax.scale(1.0 / settings.lr_multiplier), mask)


# ----------------------------------------------------------------------------- PEFT format


def peft_tensors(settings: LoraSettings, config: Qwen2Config, adapters: Params, merged: Params
                 ) -> dict[str, np.ndarray]:
    """The adapters as PEFT's `adapter_model.safetensors` names them: lora_A [rank, in],
    lora_B [out, rank] per HF projection (PEFT adds scale * B_hf @ A_hf to the [out, in] weight),
    and the whole weights of modules_to_save, taken from the `merged` model."""
    modules = _hf_modules(settings)
    saved = hf_io.hf_tensors(config, merged, "float32", keep=lambda n: n.split(".")[-2] in modules)
    if "lm_head" in modules and not config.untied_lm_head:
        # A tied model's head is its embedding; PEFT wraps lm_head apart, so it needs its own copy.
        saved["lm_head.weight"] = saved["model.embed_tokens.weight"]
    out = {f"base_model.model.{name}": arr for name, arr in saved.items()}
    for t in settings.targets:
        module, kernel, in_dims, hf_name = TARGETS[t]
        for i in range(config.num_layers):
            group, idx = ("layers", i) if config.scan_layers else (f"layer_{i}", None)
            ad = adapters[group][module][kernel]
            a, b = (np.asarray(jax.device_get(ad[k]), np.float32) for k in ("lora_a", "lora_b"))
            if idx is not None:
                a, b = a[idx], b[idx]
            prefix = f"base_model.model.model.layers.{i}.{hf_name}"
            out[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(a.reshape(-1, settings.rank).T)
            out[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(b.reshape(settings.rank, -1).T)
    return out


def peft_config(settings: LoraSettings, config: Qwen2Config, base_path: str) -> dict[str, Any]:
    """PEFT's `adapter_config.json` for these adapters on the base model at `base_path`."""
    modules = _hf_modules(settings)
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_path,
        "r": settings.rank, "lora_alpha": settings.alpha, "lora_dropout": 0.0, "bias": "none",
        "target_modules": sorted(TARGETS[t][3].rsplit(".", 1)[-1] for t in settings.targets),
        "fan_in_fan_out": False, "inference_mode": True, "use_rslora": False, "use_dora": False,
        "modules_to_save": modules or None,
        # a tied model's trained embedding is its head too: PEFT keeps the two tied
        "ensure_weight_tying": "embed_tokens" in modules and not config.untied_lm_head,
    }


def save_peft_adapter(settings: LoraSettings, config: Qwen2Config, adapters: Params, merged: Params, path,
                      base_path: str):
    """Write `adapter_model.safetensors` and `adapter_config.json` into directory `path`, which
    `peft.PeftModel.from_pretrained(base, path)` loads onto the transformers base at `base_path`
    (`merged`: the adapted model, for the weights of modules_to_save)."""
    import json
    import pathlib

    from safetensors.numpy import save_file

    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file(peft_tensors(settings, config, adapters, merged), str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps(peft_config(settings, config, base_path), indent=1))
    return path
