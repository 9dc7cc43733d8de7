"""The data, once, for users with a model hub: the three published sets downloaded with
huggingface_hub into DIR in the local formats configs/capabilities.py reads, and DIR/SHA256SUMS
(`sha256sum -c SHA256SUMS` checks them later; each run records its files' checksums in setup.json).
Nothing reads a hub at run time."""

from __future__ import annotations

import hashlib
import pathlib
import shutil

# (repository, files, subdirectory); LiveCodeBench's release_v6 is test.jsonl ... test6.jsonl.
SETS = (("HuggingFaceH4/MATH-500", ("test.jsonl",), "math500"),
        ("google/IFEval", ("ifeval_input_data.jsonl",), "ifeval"),
        ("livecodebench/code_generation_lite", ("test.jsonl",) + tuple(f"test{i}.jsonl" for i in range(2, 7)),
         "livecodebench"))


def fetch(out: pathlib.Path) -> pathlib.Path:
    """Download the sets into `out`; returns the SHA256SUMS file."""
    from rlver_jax.eval.capabilities import extra

    hub = extra.require("huggingface_hub", "huggingface_hub")
    sums = []
    for repo, names, sub in SETS:
        (out / sub).mkdir(parents=True, exist_ok=True)
        for name in names:
            cached = hub.hf_hub_download(repo, name, repo_type="dataset")
            target = out / sub / name
            shutil.copyfile(cached, target)
            sums.append(f"{hashlib.sha256(target.read_bytes()).hexdigest()}  {sub}/{name}")
    path = out / "SHA256SUMS"
    path.write_text("\n".join(sums) + "\n")
    return path
