"""An evaluation's dialogues: every profile played once by a policy against a simulator, shared
over the processes, gathered, written as transcripts.

The one driver of the Sentient benchmark (rlver_jax.eval.benchmark, behind launch/eval.py) and of
the training run's in-loop evaluation (rlver_jax.train.loop.evaluate). Each process plays a
contiguous share of the profiles (parallel.hosts.share) with its own policy; the dialogues then
travel as their records (DialogueSequence.to_record) to every process. Profile i is the
dialogue's sampling index (a StaticEngine samples it from fold_in(key, i)), so its dialogue is the
same under any split over processes and any resume. No JAX is imported here: an evaluation of
served models runs without it.
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Sequence

from tqdm import tqdm

from rlver_jax.engines.seam import Policy
from rlver_jax.files import append_jsonl
from rlver_jax.inflight import show_requests
from rlver_jax.parallel import hosts
from rlver_jax.rollout.episodes import EpisodeRequest, EpisodeRunner, RolloutSettings
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.rollout.served_policy import OpenAIPolicy
from rlver_jax.rollout.transcripts import write_transcripts
from rlver_jax.rollout.versions import VersionSchedule
from rlver_jax.simulator.factory import build_simulator
from rlver_jax.simulator.profiles import Profile
from rlver_jax.simulator.settings import SimulatorSettings
from rlver_jax.text.chat import ChatTokens


def play_profiles(policy: Policy, chat_tokens: ChatTokens | None, simulator: SimulatorSettings,
                  rollout: RolloutSettings, profiles: Sequence[tuple[int, Profile]], *, version: int = 0,
                  group_size: int = 0, max_dialogues: int = 0, append_to: pathlib.Path | None = None,
                  transcripts_dir: pathlib.Path | None = None, progress: str | None = None,
                  bar: tqdm | None = None) -> list[DialogueSequence]:
    """Play one dialogue per profile; every process's dialogues, on every process (a collective).

    policy, chat_tokens: this process's policy and its chat tokens (None for a text policy); an
      OpenAIPolicy is closed at the end.
    simulator, rollout: the simulator built for the dialogues and the dialogue settings.
    profiles: (index, profile) pairs, the same list on every process; the index is the dialogue's
      group and sampling index.
    version: the policy version every turn records (the training step).
    group_size, max_dialogues: dialogues per policy call and at most in flight at once; 0 (both):
      all of this process's dialogues in one batch.
    append_to: a JSONL file each dialogue's record is appended to the moment it ends, so a crash
      loses no result (the benchmark's resumable transcripts): process 0 appends its own, then the
      other processes' when they are gathered, each process's in the order they ended.
    transcripts_dir: process 0 writes every dialogue there at the end, as
      `eval_{version:06d}.jsonl` (rollout.transcripts; the training run's evaluations).
    progress: the label of a progress bar on process 0; None for none.
    bar: a progress bar of the caller's to count the dialogues on (under the label `progress`), left
      open: several calls under one bar (the benchmark's robustness probes); None: a bar of its own.

    Returns the dialogues from their records (no token view): process by process, each process's
    in the order of `profiles`.
    """
    mine = [profiles[i] for i in hosts.share(len(profiles))]
    first = hosts.process_index() == 0
    finished: list[DialogueSequence] = []  # this process's dialogues, in the order they ended
    own_bar = bar is None
    if own_bar:
        bar = tqdm(total=len(mine), disable=progress is None or not first, desc=progress, unit="dialogue",
                   dynamic_ncols=True)
    else:
        bar.set_description_str(progress or "")
    stop_showing_requests = show_requests(bar, progress or "")

    def on_finish(seq: DialogueSequence) -> None:
        finished.append(seq)
        if first and append_to is not None:
            append_jsonl(append_to, seq.to_record())
        bar.update(1)

    async def play() -> list[DialogueSequence]:
        async with build_simulator(simulator) as sim:
            runner = EpisodeRunner(policy, sim, chat_tokens, rollout)
            try:
                return await _play(runner, [EpisodeRequest(p, i, index=i) for i, p in mine], version,
                                   group_size, max_dialogues, on_finish)
            finally:
                if isinstance(policy, OpenAIPolicy):
                    await policy.aclose()

    try:
        played = asyncio.run(play())
    finally:
        stop_showing_requests()
        if own_bar:
            bar.close()
    place = {id(s): k for k, s in enumerate(played)}
    parts = hosts.allgather_json([[place[id(s)], s.to_record()] for s in finished])
    if first and append_to is not None:
        for part in parts[1:]:
            for _, record in part:
                append_jsonl(append_to, record)
    seqs = [DialogueSequence.from_record(record) for part in parts
            for _, record in sorted(part, key=lambda placed: placed[0])]
    if first and transcripts_dir is not None:
        write_transcripts(transcripts_dir, version, seqs, prefix="eval")
    return seqs


async def _play(runner: EpisodeRunner, requests: list[EpisodeRequest], version: int, group_size: int,
                max_dialogues: int, on_finish) -> list[DialogueSequence]:
    """All dialogues, `group_size` per policy call, at most `max_dialogues` in flight (0: all of
    them); in the order of `requests`."""
    everything = len(requests)
    group_size = max(1, min(group_size or everything, max_dialogues or everything))
    slots = asyncio.Semaphore(max(1, (max_dialogues or everything) // group_size))

    async def group(chunk):
        async with slots:
            return await runner.run(chunk, VersionSchedule.fixed(version), on_finish=on_finish)

    groups = await asyncio.gather(*(group(requests[i:i + group_size]) for i in range(0, len(requests), group_size)))
    return [s for g in groups for s in g]
