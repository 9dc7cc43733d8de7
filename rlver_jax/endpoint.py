"""Fail fast, with the fix, when an OpenAI-compatible chat endpoint (the simulator, a policy under
test, the judge) cannot serve: one GET /models before any dialogue starts."""

from __future__ import annotations

import openai

from rlver_jax.simulator.openai_backend import api_key_from_env


class EndpointUnavailableError(RuntimeError):
    """The server is down, refuses the key, or does not serve the model."""


_START_HINT = ("Start an OpenAI-compatible server for the model (e.g. `python -m sglang.launch_server "
               "--model-path MODEL --port PORT`)")


def check_chat_endpoint(base_url: str, model: str, api_key_env: str, flag_prefix: str, *,
                        start_hint: str = _START_HINT, timeout_s: float = 30.0) -> None:
    """Raises EndpointUnavailableError naming the flags to fix (`flag_prefix` + base_url, model,
    api_key_env; e.g. "--config.policy.") and, when nothing answers, how to start a server."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key_from_env(api_key_env), timeout=timeout_s,
                           max_retries=0)
    try:
        served = [m.id for m in client.models.list()]
    except openai.APIConnectionError as e:
        raise EndpointUnavailableError(
            f"no server answers at {flag_prefix}base_url={base_url} ({e.__class__.__name__}). {start_hint}, "
            f"or point {flag_prefix}base_url at a running one") from e
    except (openai.AuthenticationError, openai.PermissionDeniedError) as e:
        raise EndpointUnavailableError(
            f"the server at {base_url} rejected the API key (HTTP {e.status_code}); put the key in the "
            f"environment variable ${api_key_env} (named by {flag_prefix}api_key_env)") from e
    except openai.NotFoundError:
        return  # up, but it does not list its models: nothing more to check
    except openai.APIStatusError as e:
        raise EndpointUnavailableError(f"the server at {base_url} answered HTTP {e.status_code}: {e.message}") from e
    finally:
        client.close()
    if served and model not in served:
        raise EndpointUnavailableError(
            f"the server at {base_url} serves {served}, not {flag_prefix}model={model!r}; set it to one of those")
