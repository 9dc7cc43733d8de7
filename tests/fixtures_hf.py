"""Transformers' PyTorch Qwen2, the independent reference for the model, the sampler and exports:
a tiny random Qwen2ForCausalLM saved as a Hugging Face directory, a left-padded batch, its logits."""

import numpy as np
import torch
import transformers

HF_TINY = dict(
    vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
    num_attention_heads=6, num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-6,
    max_position_embeddings=128)


def perturb_biases_and_norms(model):
    """HF zero-inits biases and unit-inits norms; random ones make a parity test check their mapping."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def make_hf_model(tmp_path, tied: bool, seed: int = 0):
    """A random transformers Qwen2ForCausalLM saved as a Hugging Face directory."""
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(**HF_TINY, tie_word_embeddings=tied)
    model = perturb_biases_and_norms(transformers.Qwen2ForCausalLM(cfg).eval())
    out = tmp_path / f"hf_{'tied' if tied else 'untied'}"
    model.save_pretrained(out)
    return model, out


def left_padded_batch(vocab: int):
    rng = np.random.default_rng(0)
    lengths = [11, 7, 3]
    t = max(lengths)
    ids = np.zeros((len(lengths), t), np.int64)
    mask = np.zeros((len(lengths), t), np.int64)
    for b, n in enumerate(lengths):
        ids[b, t - n:] = rng.integers(1, vocab, n)
        mask[b, t - n:] = 1
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    return ids, mask, positions


def torch_logits(model, ids, mask, positions):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                    position_ids=torch.tensor(positions))
    return out.logits.float().numpy()
