"""The transport to a served simulator: any OpenAI-compatible chat endpoint (SGLang by default).

Requests go through llm_client.ChatClient (one bound on requests in flight shared by all
dialogues, adapting to the server's pace; a server that is down or throttled waited for up to
config.simulator.outage_budget_s, a slow one as long as it is there; retries with backoff on
408/409 and 5xx but 501/505). Its errors become the simulator's: a request the server refused alone
(HTTP 400/413/422) ends that dialogue (SimulatorRequestError), an outage past its budget stops the
run resumably (SimulatorOutageError, exit status 75), any other EndpointUnavailableError stops the
run (SimulatorUnavailableError); a refused response_format goes back to the LLM user as it came
(ResponseFormatRejectedError).
"""

from __future__ import annotations

from typing import Any

from rlver_jax.llm_client import (
    ChatClient,
    ClientSettings,
    EndpointUnavailableError,
    OutageError,
    RequestRejectedError,
    ResponseFormatRejectedError,
)
from rlver_jax.simulator.interface import SimulatorOutageError, SimulatorRequestError, SimulatorUnavailableError


class OpenAITransport:
    """interface.Transport to the chat endpoint `client` describes (config.simulator's base_url, model, ...)."""

    def __init__(self, client: ClientSettings):
        self.model = client.model
        self.client = ChatClient(client)

    async def complete(self, messages: list[dict[str, str]], response_format: dict[str, Any] | None, *,
                       temperature: float, max_tokens: int) -> str:
        try:
            completion = await self.client.complete(messages, temperature=temperature, max_tokens=max_tokens,
                                                    response_format=response_format)
        except ResponseFormatRejectedError:
            raise
        except RequestRejectedError as e:  # this dialogue's request only: the dialogue ends, the run goes on
            raise SimulatorRequestError(str(e)) from e
        except OutageError as e:
            raise SimulatorOutageError(str(e)) from e
        except EndpointUnavailableError as e:
            raise SimulatorUnavailableError(str(e)) from e
        # No choices or no content: an empty answer, handled as malformed by the LLM user.
        return completion.text

    async def aclose(self) -> None:
        await self.client.aclose()
