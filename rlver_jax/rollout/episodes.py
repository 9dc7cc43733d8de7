"""Multi-turn dialogues between the policy and simulated users, many at once.

Each round: one batched policy call for every live dialogue, then every live dialogue's
simulator step at once (asyncio), then end checks; finished dialogues leave the batch. A batch
may be split into pipeline groups that run their rounds concurrently: while one group's
dialogues wait on the simulator, the policy generates for another.

Every dialogue becomes one DialogueSequence assembled from the exact sampled token ids plus the
chat template's ids (rlver_jax.chat), never by re-tokenising decoded text.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from rlver_jax import chat
from rlver_jax.rollout.policy import Policy, PolicyTurn, TurnRequest
from rlver_jax.rollout.prompts import system_prompt
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.simulator.agent import DialogueState, Simulator
from rlver_jax.simulator.profiles import Profile

FORMAT_FAILURE_OUTCOMES = ("end", "continue")


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
    """The `config.rollout` fields the dialogue loop reads."""

    think: bool = True  # think-then-say: reason in <think>...</think>, only the rest is sent
    max_new_tokens: int = 512  # per policy turn
    max_total_tokens: int = 4096  # per dialogue; the dialogue ends as truncated beyond it
    format_failure: str = "end"  # end: the dialogue ends with reward 0; continue: send the raw text
    pipeline_groups: int = 1  # concurrent groups of dialogues (overlap generation with the simulator)

    def __post_init__(self):
        if self.format_failure not in FORMAT_FAILURE_OUTCOMES:
            raise ValueError(f"config.rollout.format_failure={self.format_failure!r}; "
                             f"use one of {FORMAT_FAILURE_OUTCOMES}")
        if self.pipeline_groups < 1:
            raise ValueError(f"config.rollout.pipeline_groups={self.pipeline_groups} must be >= 1")


@dataclasses.dataclass(frozen=True)
class EpisodeRequest:
    profile: Profile
    group: int  # GRPO group id: the n samples of one profile share it


@dataclasses.dataclass
class _Episode:
    """Host-side bookkeeping of one dialogue while it runs."""

    request: EpisodeRequest
    state: DialogueState
    messages: list[dict[str, str]]
    tokens: list[int] = dataclasses.field(default_factory=list)
    policy_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    turn_ends: list[int] = dataclasses.field(default_factory=list)
    turns: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    session: int = 0  # the pipeline group, its row in it, and a unique id (see TurnRequest)
    slot: int = 0
    episode: int = 0
    end_reason: str | None = None
    truncated: bool = False
    format_failure: bool = False

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    def extend(self, ids: Sequence[int], mask: Sequence[int], logprobs: Sequence[float] | None = None):
        self.tokens.extend(ids)
        self.policy_mask.extend(mask)
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


class EpisodeRunner:
    """Runs batches of dialogues for one policy and one simulator."""

    def __init__(self, policy: Policy, simulator: Simulator, chat_tokens: chat.ChatTokens | None,
                 settings: RolloutSettings):
        self.policy = policy
        self.simulator = simulator
        self.chat = chat_tokens  # None for text-only policies (an OpenAI endpoint under evaluation)
        self.settings = settings
        self._episode_ids = itertools.count()
        self._session_ids = itertools.count()

    @property
    def _closing(self) -> int:
        """Template tokens after a turn's sampled ids: <|im_end|> (when cut) and "\n"."""
        return 1 + len(self.chat.newline)

    async def run(self, requests: Sequence[EpisodeRequest], version: int = 0,
                  on_finish: Callable[[DialogueSequence], None] | None = None) -> list[DialogueSequence]:
        """All dialogues of `requests` to the end, in the order given. `on_finish` is called with
        each dialogue as soon as it ends (evaluation saves it then, so a crash loses no result)."""
        n_groups = min(self.settings.pipeline_groups, max(len(requests), 1))
        chunks = [list(range(i, len(requests), n_groups)) for i in range(n_groups)]
        results: list[DialogueSequence | None] = [None] * len(requests)

        async def run_chunk(session, idx):
            seqs = await self._run_group(session, [requests[i] for i in idx], version, on_finish)
            for i, s in zip(idx, seqs):
                results[i] = s

        # Session ids are unique across calls, so concurrent runs on one policy never share one.
        await asyncio.gather(*(run_chunk(next(self._session_ids), idx) for idx in chunks if idx))
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------------ one pipeline group

    async def _run_group(self, session: int, requests: list[EpisodeRequest], version: int,
                         on_finish: Callable[[DialogueSequence], None] | None) -> list[DialogueSequence]:
        states = await asyncio.gather(*(self.simulator.start(r.profile) for r in requests))
        episodes = [self._open(r, s) for r, s in zip(requests, states)]
        for slot, e in enumerate(episodes):
            e.session, e.slot, e.episode = session, slot, next(self._episode_ids)
        finished: dict[int, DialogueSequence] = {}

        def collect():
            for i, e in enumerate(episodes):
                if e.done and i not in finished:
                    finished[i] = self._finish(e, version)
                    if on_finish is not None:
                        on_finish(finished[i])

        collect()
        while live := [e for e in episodes if not e.done]:
            turns = await self.policy.act([self._turn_request(e) for e in live])
            replies = [self._record_policy_turn(e, t) for e, t in zip(live, turns)]
            judged = [(e, r) for e, r in zip(live, replies) if r is not None]
            new_states = await asyncio.gather(*(self.simulator.respond(e.state, r) for e, r in judged))
            for (e, _), state in zip(judged, new_states):
                self._record_user_turn(e, state)
            collect()
        self.policy.release(session)
        return [finished[i] for i in range(len(episodes))]

    def _open(self, request: EpisodeRequest, state: DialogueState) -> _Episode:
        lang = state.language
        messages = [{"role": "system", "content": system_prompt(lang, self.settings.think)}]
        episode = _Episode(request=request, state=state, messages=messages)
        if self.chat is not None:
            episode.extend(*chat.encode_message(self.chat, "system", messages[0]["content"]))
        if state.done:  # the simulator failed to open the dialogue
            episode.end_reason = state.end_reason
            return episode
        self._append_user(episode, state.history[-1]["content"])
        return episode

    def _append_user(self, episode: _Episode, text: str) -> None:
        episode.messages.append({"role": "user", "content": text})
        if self.chat is None:
            return
        ids, mask = chat.encode_message(self.chat, "user", text)
        # Room for the generation prompt and at least one sampled token; else the dialogue ends
        # here and the user turn stays in the transcript only (no policy token would follow it).
        if len(episode.tokens) + len(ids) + len(self.chat.assistant_header) + 1 + self._closing > \
                self.settings.max_total_tokens:
            episode.truncated, episode.end_reason = True, "truncated"
        else:
            episode.extend(ids, mask)

    def _turn_request(self, episode: _Episode) -> TurnRequest:
        ident = dict(session=episode.session, slot=episode.slot, episode=episode.episode)
        if self.chat is None:
            return TurnRequest(prompt_ids=None, messages=list(episode.messages),
                               max_new_tokens=self.settings.max_new_tokens, **ident)
        prompt = episode.tokens + list(self.chat.assistant_header)
        budget = min(self.settings.max_new_tokens, self.settings.max_total_tokens - len(prompt) - self._closing)
        return TurnRequest(prompt_ids=prompt, messages=list(episode.messages), max_new_tokens=budget, **ident)

    def _record_policy_turn(self, episode: _Episode, turn: PolicyTurn) -> str | None:
        """Append the sampled turn; return the text for the user, or None when the dialogue ends."""
        split = chat.split_think(turn.text, think=self.settings.think)
        if self.chat is not None:
            header = list(self.chat.assistant_header)
            episode.extend(header, [0] * len(header))
            ids, mask = chat.assistant_turn_ids(self.chat, turn.token_ids)
            lps = list(turn.logprobs) + [0.0] * (len(ids) - len(turn.logprobs))
            start = len(episode.tokens)
            episode.extend(ids, mask, lps)
            episode.turn_ends.append(start + len(turn.token_ids) - 1)
        record = {"turn": len(episode.turns) + 1, "raw": turn.text, "thinking": split.thinking,
                  "reply": split.reply, "stopped": turn.stopped, "format_ok": split.ok}
        episode.turns.append(record)
        episode.messages.append({"role": "assistant", "content": split.reply if split.ok else turn.text})
        if self.chat is not None and not turn.stopped and len(episode.tokens) >= self.settings.max_total_tokens:
            episode.truncated, episode.end_reason = True, "truncated"
            return None
        if not split.ok:
            episode.format_failure = True
            if self.settings.format_failure == "end":
                episode.end_reason = "format_failure"
                return None
            return turn.text
        return split.reply

    def _record_user_turn(self, episode: _Episode, state: DialogueState) -> None:
        episode.state = state
        last = state.records[-1]
        episode.turns[-1].update(change=last.change, emotion=last.emotion, band=last.band,
                                 simulator_thoughts=last.thoughts, user=last.utterance)
        if state.done:
            episode.end_reason = state.end_reason
            if last.utterance is not None:  # a goodbye: kept for the transcript, no policy turn follows
                episode.messages.append({"role": "user", "content": last.utterance})
        elif last.utterance is not None:
            self._append_user(episode, last.utterance)

    def _finish(self, episode: _Episode, version: int) -> DialogueSequence:
        state = episode.state
        transcript = {
            "profile_id": state.profile.id, "group": episode.request.group, "language": state.language,
            "end_reason": episode.end_reason, "final_emotion": state.emotion,
            "emotions": list(state.emotions), "turns": episode.turns, "messages": episode.messages,
            "format_failure": episode.format_failure, "truncated": episode.truncated,
            "simulator_error": episode.end_reason == "simulator_error", "simulator_state": state.to_dict(),
            "policy_version": version,
        }
        return DialogueSequence(
            profile_id=state.profile.id, group=episode.request.group, tokens=episode.tokens,
            policy_mask=episode.policy_mask, logprobs=episode.logprobs, turn_ends=episode.turn_ends,
            emotions=[float(x) for x in state.emotions], end_reason=episode.end_reason or "unknown",
            truncated=episode.truncated, format_failure=episode.format_failure,
            simulator_error=episode.end_reason == "simulator_error", policy_version=version,
            transcript=transcript)
