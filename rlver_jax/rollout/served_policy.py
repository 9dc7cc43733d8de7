"""`OpenAIPolicy`: a policy (engines.seam.Policy) that asks any OpenAI-compatible chat endpoint for
each turn (text out, for scoring served or API models on the same footing). The policies on the
trainer's parameters are the rollout engines (rlver_jax.engines); nothing here imports JAX, so an
evaluation of served models starts without it.
"""

from __future__ import annotations

import asyncio

from rlver_jax.engines.seam import PolicyTurn, TurnRequest
from rlver_jax.llm_client import ChatClient, ClientSettings


class OpenAIPolicy:
    """A policy served behind an OpenAI-compatible chat API (vLLM, SGLang, a provider), called
    through rlver_jax.llm_client: its timeout, retries and bound on requests in flight."""

    def __init__(self, client: ClientSettings, *, temperature: float = 0.7, max_tokens: int = 1024):
        self.client = ChatClient(client)
        self.temperature, self.max_tokens = temperature, max_tokens

    async def _one(self, req: TurnRequest) -> PolicyTurn:
        answer = await self.client.complete(req.messages, temperature=self.temperature,
                                            max_tokens=min(self.max_tokens, req.max_new_tokens))
        return PolicyTurn(text=answer.text, stopped=answer.finish_reason != "length")

    async def act(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    def release(self, session: int) -> None:
        """Nothing is kept between turns."""

    async def aclose(self) -> None:
        await self.client.aclose()

