"""The scripted OpenAI-compatible server now lives in rlver_jax/testing/scripted_server.py, where the
benchmarks import it too. This name remains only for the test modules that still import it here
(tests/eval_test.py, tests/capabilities_run_test.py); import from rlver_jax.testing instead."""

from rlver_jax.testing.scripted_server import (SCHEMA_KEYWORDS, Reply, ScriptedServer, echoing,  # noqa: F401
                                               quoted_reply, route, schema_errors, system_prompt)
