"""Multi-turn dialogues between the policy and simulated users, many at once.

Each dialogue moves on its own: its next policy turn as soon as its simulator step returns.
A policy that schedules turns itself (RolloutSettings.continuous: an engine whose row says so,
engines.table) takes each dialogue's turn the moment it is asked for, every dialogue of the batch
in one session.
Otherwise the policy generates in one batched call for the dialogues of a group that are ready
(rollout.ready_batches: with a short bounded wait for others to join; an infinite one is
lockstep rounds), and a batch may be split into pipeline groups, each with its own KV-cache
session, whose calls share the policy's device: while one group's dialogues wait on the
simulator, the policy generates for another.

Every dialogue becomes one DialogueSequence: its messages and turn records, plus, for a token
policy, the training rows its history assembled (rollout.history), scored by the run's reward
source (rollout.rewards) as it ends. Each policy turn asks for the parameter version its run's
schedule gives it (rollout.versions) and records the version that wrote it (`policy_version` of
its turn record).

The dialogues of one GRPO group (requests sharing a group id) start from one opening: the
simulator opens each group once and its n dialogues continue from that state (the reference
clones the simulator), so the group baseline compares replies to the same start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from rlver_jax.checks import check_ranges, named
from rlver_jax.engines.seam import Policy, PolicyTurn, TurnRequest
from rlver_jax.rollout import rewards
from rlver_jax.rollout.history import THINK_HISTORIES, TextHistory, TokenHistory
from rlver_jax.rollout.prompts import system_prompt
from rlver_jax.rollout.ready_batches import ReadyBatches
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.rollout.versions import VersionSchedule
from rlver_jax.simulator.agent import DialogueState, Simulator
from rlver_jax.simulator.profiles import Profile
from rlver_jax.text import chat

FORMAT_FAILURE_OUTCOMES = ("end", "continue")


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
    """The `config.rollout` fields the dialogue loop reads."""

    think: bool = True  # think-then-say: reason in <think>...</think>, only the rest is sent
    max_new_tokens: int = 512  # per policy turn
    max_total_tokens: int = 4096  # per training row; the dialogue ends as truncated beyond it
    format_failure: str = "end"  # end: the dialogue ends with reward 0; continue: send the raw text
    # The policy schedules turns itself (its engine's row, engines.table.EngineRow.continuous): each
    # dialogue's turn goes straight to it, every dialogue in one session; else the fields below.
    continuous: bool = False
    # Concurrent groups of dialogues, each its own session (overlap generation with the simulator).
    pipeline_groups: int = 1
    # Per-dialogue progress (rollout.ready_batches): how long a dialogue ready for its next policy
    # turn waits for others of its group to join the call; inf: for all of them (lockstep rounds).
    batch_wait_s: float = 0.25
    # Think mode: "drop" earlier thoughts from the context, one training row per turn (the
    # reference), or "keep" them, one row per dialogue (rollout.history).
    think_history: str = "drop"
    # The policy's system message; "" = the project's own (rollout/prompts.py, by language and think mode).
    system_prompt: str = ""

    where: str = dataclasses.field(default="config.rollout.", compare=False)  # the config section, for errors

    @property
    def drop_thoughts(self) -> bool:
        return self.think and self.think_history == "drop"

    def __post_init__(self):
        if self.think_history not in THINK_HISTORIES:
            raise ValueError(f"{self.where}think_history={self.think_history!r}; use one of {THINK_HISTORIES}")
        if self.format_failure not in FORMAT_FAILURE_OUTCOMES:
            raise ValueError(f"{self.where}format_failure={self.format_failure!r}; "
                             f"use one of {FORMAT_FAILURE_OUTCOMES}")
        # max_new_tokens: SamplingSettings checks it, built from the same section
        check_ranges(named(self, self.where, ("max_total_tokens", "pipeline_groups", "batch_wait_s")),
                     lowest={"max_total_tokens": 1, "pipeline_groups": 1, "batch_wait_s": 0})

    @classmethod
    def from_config(cls, section: Any, where: str, *, think: bool, continuous: bool = False, pipeline_groups: int = 1,
                    batch_wait_s: float = batch_wait_s, system_prompt: str = "") -> RolloutSettings:
        """The dialogue fields of a config section (config.rollout, config.policy,
        config.train.eval_policy; `where` names it in errors); the think mode, how turns reach the
        policy and a system prompt of the caller's own are the caller's (an evaluation's think mode
        may come from the policy's run)."""
        return cls(think=think, max_new_tokens=section.max_new_tokens, max_total_tokens=section.max_total_tokens,
                   format_failure=section.format_failure, continuous=continuous, pipeline_groups=pipeline_groups,
                   batch_wait_s=batch_wait_s, think_history=section.think_history, system_prompt=system_prompt,
                   where=where)


@dataclasses.dataclass(frozen=True)
class EpisodeRequest:
    profile: Profile
    group: int  # GRPO group id: the n samples of one profile share it
    index: int | None = None  # the dialogue's sampling index (TurnRequest.dialogue); None: its place in run()


@dataclasses.dataclass
class _Episode:
    """Host-side bookkeeping of one dialogue while it runs."""

    request: EpisodeRequest
    state: DialogueState
    history: TokenHistory | TextHistory  # what the policy sees, in its own form
    messages: list[dict[str, str]]  # the transcript: replies as the user read them
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


class EpisodeRunner:
    """Runs batches of dialogues for one policy and one simulator.

    chat_tokens: the token policy's chat tokens (its dialogues are TokenHistory), or None for a
    text policy (an OpenAI endpoint under evaluation; TextHistory).
    reward_mode: the reward source every finished dialogue is scored by (a row of
    rollout.rewards.REWARDS: config.rl.reward_mode in training; evaluation's, the paper's "final").
    """

    def __init__(self, policy: Policy, simulator: Simulator, chat_tokens: chat.ChatTokens | None,
                 settings: RolloutSettings, reward_mode: str = "final"):
        self.policy = policy
        self.simulator = simulator
        self.settings = settings
        self.reward_mode = reward_mode
        rewards.REWARDS.row(reward_mode)  # an unknown name fails here, before any dialogue is played
        drop = settings.drop_thoughts
        if chat_tokens is None:
            self._history = lambda: TextHistory(self.settings.max_new_tokens, drop)
        else:
            self._history = lambda: TokenHistory(chat_tokens, self.settings.max_new_tokens,
                                                 self.settings.max_total_tokens, drop)
        self._episode_ids = itertools.count()
        self._session_ids = itertools.count()

    async def run(self, requests: Sequence[EpisodeRequest], versions: VersionSchedule = VersionSchedule(0, 0),
                  on_finish: Callable[[DialogueSequence], None] | None = None) -> list[DialogueSequence]:
        """All dialogues of `requests` to the end, in the order given, each turn asking for the
        version `versions` gives it. `on_finish` is called with each dialogue as soon as it ends
        (evaluation saves it then, so a crash loses no result)."""
        groups = 1 if self.settings.continuous else self.settings.pipeline_groups
        n_groups = min(groups, max(len(requests), 1))
        chunks = [list(range(i, len(requests), n_groups)) for i in range(n_groups)]
        results: list[DialogueSequence | None] = [None] * len(requests)
        requests = [r if r.index is not None else dataclasses.replace(r, index=i) for i, r in enumerate(requests)]
        states = await self._openings(requests)

        async def run_chunk(session, idx):
            seqs = await self._run_group(session, [requests[i] for i in idx], [states[i] for i in idx], versions,
                                         on_finish)
            for i, s in zip(idx, seqs):
                results[i] = s

        # Session ids are unique across calls, so concurrent runs on one policy never share one.
        await asyncio.gather(*(run_chunk(next(self._session_ids), idx) for idx in chunks if idx))
        return results  # type: ignore[return-value]

    async def _openings(self, requests: Sequence[EpisodeRequest]) -> list[DialogueState]:
        """Each request's opening state: one simulator start per group id, shared by its members
        (the state is immutable, so sharing it is cloning it)."""
        first: dict[int, EpisodeRequest] = {}
        for r in requests:
            if first.setdefault(r.group, r).profile.id != r.profile.id:
                raise ValueError(f"group {r.group} holds profiles {first[r.group].profile.id!r} and "
                                 f"{r.profile.id!r}; a group's dialogues share one profile")
        groups = list(first)
        started = await asyncio.gather(*(self.simulator.start(first[g].profile) for g in groups))
        by_group = dict(zip(groups, started))
        return [by_group[r.group] for r in requests]

    # ------------------------------------------------------------------ one pipeline group

    async def _run_group(self, session: int, requests: list[EpisodeRequest], states: list[DialogueState],
                         versions: VersionSchedule, on_finish: Callable[[DialogueSequence], None] | None
                         ) -> list[DialogueSequence]:
        episodes = [self._open(r, s) for r, s in zip(requests, states)]
        for slot, e in enumerate(episodes):
            e.session, e.slot, e.episode = session, slot, next(self._episode_ids)
        finished: dict[int, DialogueSequence] = {}

        async def finish(i: int) -> None:
            finished[i] = await self._finish(episodes[i], versions)
            if on_finish is not None:
                on_finish(finished[i])

        live = [i for i, e in enumerate(episodes) if not e.done]
        for i in range(len(episodes)):
            if i not in live:  # the simulator failed to open it
                await finish(i)
        calls = ReadyBatches(self.policy, self.settings.batch_wait_s, len(live))
        continuous = self.settings.continuous
        act = self._act if continuous else calls.act

        async def play(i: int) -> None:
            try:
                await self._play(episodes[i], act, versions)
            finally:
                calls.leave()
            await finish(i)  # an async reward source: the others play on while it scores

        serve = [] if continuous else [asyncio.ensure_future(calls.serve())]
        tasks = serve + [asyncio.ensure_future(play(i)) for i in live]
        try:
            await asyncio.gather(*tasks)
        finally:  # one failed: the others stop with it
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.policy.release(session)
        return [finished[i] for i in range(len(episodes))]

    async def _act(self, request: TurnRequest) -> PolicyTurn:
        (turn,) = await self.policy.act([request])
        return turn

    async def _play(self, episode: _Episode, act: Callable[[TurnRequest], Awaitable[PolicyTurn]],
                    versions: VersionSchedule) -> None:
        """One dialogue to its end: a policy turn as soon as its user has answered."""
        while not episode.done:
            request = self._turn_request(episode, versions)
            reply = self._record_policy_turn(episode, request, await act(request))
            if reply is not None:
                self._record_user_turn(episode, await self.simulator.respond(episode.state, reply))

    def _open(self, request: EpisodeRequest, state: DialogueState) -> _Episode:
        system = self.settings.system_prompt or system_prompt(state.language, self.settings.think)
        episode = _Episode(request=request, state=state, history=self._history(),
                           messages=[{"role": "system", "content": system}])
        episode.history.add_system(system)
        if state.done:  # the simulator failed to open the dialogue
            episode.end_reason = state.end_reason
            return episode
        self._append_user(episode, state.history[-1]["content"])
        return episode

    def _append_user(self, episode: _Episode, text: str) -> None:
        episode.messages.append({"role": "user", "content": text})
        # No room for a policy turn after it: the dialogue ends here, and the user turn stays in
        # the messages only (no policy token would follow it).
        if not episode.history.add_user(text):
            episode.truncated, episode.end_reason = True, "truncated"

    def _turn_request(self, episode: _Episode, versions: VersionSchedule) -> TurnRequest:
        turn = len(episode.turns)
        return episode.history.request(session=episode.session, slot=episode.slot, episode=episode.episode,
                                       dialogue=episode.request.index, turn=turn, version=versions.version(turn))

    def _record_policy_turn(self, episode: _Episode, request: TurnRequest, turn: PolicyTurn) -> str | None:
        """Append the sampled turn; return the text for the user, or None when the dialogue ends."""
        split = chat.split_think(turn.text, think=self.settings.think)
        shown = chat.shown_text(turn.text, split)
        fits = episode.history.add_turn(turn, shown)
        record = {"turn": len(episode.turns) + 1, "raw": turn.text, "thinking": split.thinking,
                  "reply": split.reply, "stopped": turn.stopped, "format_ok": split.ok,
                  "policy_version": request.version if turn.version is None else turn.version}
        if turn.reencoded:  # the KV cache could not hold it (engines.kv_sessions): counted, see turns_reencoded
            record["reencoded"] = True
        episode.turns.append(record)
        episode.messages.append({"role": "assistant", "content": shown})
        if not fits:
            episode.truncated, episode.end_reason = True, "truncated"
            return None
        if not split.ok:
            episode.format_failure = True
            if self.settings.format_failure == "end":
                episode.end_reason = "format_failure"
                return None
        return shown

    def _record_user_turn(self, episode: _Episode, state: DialogueState) -> None:
        episode.state = state
        last = state.records[-1]
        episode.turns[-1].update(change=last.change, emotion=last.emotion, band=last.band,
                                 simulator_thoughts=last.thoughts, user=last.utterance)
        if state.done:
            episode.end_reason = state.end_reason
            if last.utterance is not None:  # a goodbye: kept in the messages, no policy turn follows
                episode.messages.append({"role": "user", "content": last.utterance})
        elif last.utterance is not None:
            self._append_user(episode, last.utterance)

    async def _finish(self, episode: _Episode, versions: VersionSchedule) -> DialogueSequence:
        state, h = episode.state, episode.history
        # The version of its first (oldest) turn; with no policy turn, the schedule's first (no
        # version precedes 0: the first batches of a run want versions below it).
        version = episode.turns[0]["policy_version"] if episode.turns else max(versions.first, 0)
        return await rewards.score(DialogueSequence(
            profile_id=state.profile.id, group=episode.request.group, tokens=h.tokens,
            policy_mask=h.policy_mask, logprobs=h.logprobs, turn_ends=h.turn_ends, row_starts=h.row_starts,
            emotions=list(state.emotions), end_reason=episode.end_reason or "unknown",
            truncated=episode.truncated, format_failure=episode.format_failure,
            simulator_error=episode.end_reason == "simulator_error", policy_version=version,
            language=state.language, turns=episode.turns, messages=episode.messages,
            simulator_state=state.to_dict()), self.reward_mode)
