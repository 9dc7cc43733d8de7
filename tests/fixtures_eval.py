"""Scripted endpoints for evaluations (launch/eval.py, rlver_jax.eval.benchmark): a policy server
and a simulator server whose answers are functions of the profile and the turn, and the profiles
and config that point an evaluation at them.

Per profile, the emotion change the simulated user gives each judged reply, and the reply turn
after which the user says goodbye. From 40 under the SAGE rules (end at 100, below 10, after 10
rounds with the 10th reply not judged):
  P1 +10 x6 -> 100, success after 6 replies     P2 -10 x4 -> 0, failure after 4 replies
  P3 +1 x9 -> 49, turn limit after 10 replies    P4 +5 x2 -> 50, goodbye after 2 replies
  P5 answers malformed text: a simulator error, not scored
"""

import json
import re

from configs.eval import get_config
from rlver_jax.simulator.profiles import GOALS
from rlver_jax.testing.scripted_server import ScriptedServer, route

CHANGES = {"P1": 10, "P2": -10, "P3": 1, "P4": 5}
GOODBYE_AFTER = {"P4": 2}


def profile(name):
    return {"id": f"id-{name}", "player": f"Name: {name}\nA tired office worker.",
            "scene": "Had a rough week at work and wants to talk.", "main_cha": "passive",
            "cha_group": ["quiet"], "task": GOALS["listening"][1], "first_talk": f"[{name}] Long week, honestly."}


def profiles_file(tmp_path, names=("P1", "P2", "P3", "P4")):
    path = tmp_path / "profiles.jsonl"
    path.write_text("".join(json.dumps(profile(n)) + "\n" for n in names))
    return path


def _last(pattern, text):
    return re.findall(pattern, text)[-1]


def _policy(request):
    """Answers with the turn number, so the simulator's scripts know which reply they judge."""
    name = _last(r"\[(P\d)\]", request["messages"][1]["content"])
    turn = sum(m["role"] == "assistant" for m in request["messages"]) + 1
    return f"That sounds heavy, {name}. I am here. [t{turn}]"


def _emotion(changes):
    def script(request):
        name = _last(r"Name: (P\d)", request["messages"][0]["content"])
        if name == "P5":
            return "I feel a little better, I think."
        return f"Intent: comfort\nFit: fine\nInner reaction: ok\nFeeling: moved\nChange: {changes[name]:+d}"
    return script


def _reply(request):
    system, user = request["messages"][0]["content"], request["messages"][1]["content"]
    name, turn = _last(r"Name: (P\d)", system), int(_last(r"\[t(\d+)\]", user))
    return "Plan: wrap up\nResponse: Bye, I have to go." if GOODBYE_AFTER.get(name) == turn else \
        "Plan: go on\nResponse: Yeah... it has been a lot."


class Servers:
    """The policy endpoint and the simulator endpoint, each a scripted server."""

    def __init__(self, changes=CHANGES):
        self.changes = changes

    def __enter__(self):
        self.policy = ScriptedServer(_policy, model="policy").__enter__()
        self.simulator = ScriptedServer(route(emotion=_emotion(self.changes), reply=_reply)).__enter__()
        return self

    def __exit__(self, *exc):
        self.simulator.__exit__(*exc)
        self.policy.__exit__(*exc)

    def policy_requests(self, name):
        return sum(f"[{name}]" in r["messages"][1]["content"] for r in self.policy.requests)


def config_urls(workdir, policy_url, simulator_url, profiles, **overrides):
    """configs/eval.py's default preset: an openai policy at `policy_url`, the simulator at
    `simulator_url`, groups of one, fast retries; overrides as {"section.field": value}."""
    c = get_config()
    c.workdir = str(workdir)
    c.eval.profiles = str(profiles)
    c.eval.group_size = 1
    c.policy.backend = "openai"
    c.policy.base_url = policy_url
    c.simulator.base_url = simulator_url
    c.simulator.backoff_initial_s = 0.001
    c.simulator.malformed_retries = 1
    for key, value in overrides.items():
        section, field = key.split(".")
        c[section][field] = value
    return c
