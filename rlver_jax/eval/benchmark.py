"""The Sentient benchmark behind launch/eval.py: every profile's dialogue with the policy under
test, under the SAGE rules of `config.simulator`, then scores, report and plots.

Resumable: each dialogue is appended to WORKDIR/transcripts.jsonl the moment it ends, and a rerun
skips the profiles found there. WORKDIR/setup.json records what defines the results (the resolved
policy, sampling, simulator and rules); a rerun with a different set-up is refused rather than
mixed in, and so is a second evaluation while one runs (the work directory's lock,
rlver_jax.train.workdir.WorkDirLock). A profile whose opening leaves a policy of ours no room for
a turn is refused before any dialogue is played (rlver_jax.rollout.openings); a dialogue that still
ends before the policy spoke (an opening the simulator wrote) is counted in `no_policy_turn`, not
scored. Outputs (report.write_outputs): sentient.json, report.md, trajectories.png,
final_emotions.png.

`config.eval.like_training=RUN` plays under the settings a training run was trained with
(rlver_jax.eval.spec.like_training) instead of SAGE's. The config is read once, into an EvalSpec
(rlver_jax.eval.spec), before anything here runs.

On N processes (launch/eval.py under jax.distributed, like training) process 0 owns the work
directory: it checks the set-up and finds the profiles left to play; every process plays a
contiguous share of them on its own sampling copy of the policy, process 0 appending its
dialogues as they end and the others' once they are gathered at the end; process 0 writes the
outputs and every process returns the same scores.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import logging
import pathlib
import threading
from typing import Any

from tqdm import tqdm

from rlver_jax.eval import panel, policy_source, protocol, report
from rlver_jax.eval.probes import ProbePolicy
from rlver_jax.eval.resume import load_records, record_setup, setup_conflict
from rlver_jax.eval.spec import TRANSPORT as _TRANSPORT
from rlver_jax.eval.spec import BenchmarkSettings, EvalSpec
from rlver_jax.files import atomic_write_text
from rlver_jax.llm_client import EndpointUnavailableError, check_chat_endpoint, restated, served_models
from rlver_jax.parallel.hosts import allgather_json, process_index, share
from rlver_jax.rollout.evaluation import play_profiles
from rlver_jax.rollout.openings import check_openings
from rlver_jax.sampling.settings import SamplingSettings
from rlver_jax.simulator import ProfileError, SimulatorUnavailableError, check_endpoint, load_profiles
from rlver_jax.simulator.profiles import Profile
from rlver_jax.train.workdir import WorkDirBusyError, WorkDirLock

log = logging.getLogger(__name__)

TRANSCRIPTS = "transcripts.jsonl"
SETUP = "setup.json"
PROBES_DIR = "probes"  # WORKDIR/probes/NAME.jsonl: the robustness probes' dialogues


def needs_jax(spec: EvalSpec) -> bool:
    """Whether evaluating `spec` needs JAX in this process: a policy of ours (its backend's row,
    policy_source.POLICY_BACKENDS, says), or a multi-process run (config.mesh.distributed or the environment
    ask for one). A served policy on one process does without it, and without its start-up."""
    return (policy_source.POLICY_BACKENDS.row(spec.policy.backend).needs_jax
            or spec.distributed.initialize_arguments() is not None)


def load_eval_profiles(spec: EvalSpec) -> list[Profile]:
    """The profiles `spec` plays: config.eval.profiles, its last eval.holdout, its first eval.max_profiles."""
    if not spec.profiles:
        raise ValueError("config.eval.profiles is empty: set it to a JSONL file of profiles with first_talk, "
                         "e.g. --config.eval.profiles=../shared/data/rlver/test_profile.jsonl")
    try:
        profiles = load_profiles(spec.profiles)
    except ProfileError as e:
        raise ProfileError(f"config.eval.profiles: {e}") from None
    if holdout := spec.holdout:  # a training run's held-out profiles: the last N of its file
        if holdout > len(profiles):
            raise ValueError(f"config.eval.holdout={holdout}: config.eval.profiles={spec.profiles} holds "
                             f"{len(profiles)} profiles; set --config.eval.holdout=0 to play them all")
        profiles = profiles[-holdout:]
    if spec.settings.max_profiles:
        profiles = profiles[:spec.settings.max_profiles]
    if missing := [p.id for p in profiles if p.first_talk is None]:
        log.warning("%d profiles lack first_talk (SAGE opens with it); the simulator writes their opening: %s",
                    len(missing), missing[:5])
    return profiles


class _PolicySpec:
    """The policy of `spec.policy` (eval/policy_source.py) with what the benchmark records of it:
    setup.json's fields and the report's run line."""

    def __init__(self, spec: EvalSpec):
        self.spec = spec
        self.source = policy_source.resolve(spec.policy, spec.seed, max_in_flight=spec.settings.max_dialogues)

    def setup(self) -> dict[str, Any]:
        """What defines the results, for setup.json."""
        c = self.spec
        out: dict[str, Any] = {"policy.source": self.source.source, "policy.think": self.source.think, "seed": c.seed,
                               "eval.profiles": str(pathlib.Path(c.profiles).resolve())}
        skip = _TRANSPORT | {"checkpoint", "path", "base_path", "think", "fresh_tiny"}
        out.update({f"policy.{k}": v for k, v in c.record["policy"].items() if k not in skip})
        out.update({f"simulator.{k}": v for k, v in c.record["simulator"].items() if k not in _TRANSPORT})
        return out

    def build(self, workdir: pathlib.Path, sampling: SamplingSettings):
        """(policy, chat tokens or None for a text policy) ready to play, sampling by `sampling`."""
        c = self.spec
        return policy_source.build(c.policy, self.source, c.mesh, c.seed, workdir, sampling,
                                   first_process=process_index() == 0)

    def trained_on(self, profile_ids: list[str]) -> list[str]:
        """Those of `profile_ids` the policy's training run trained on (a checkpoint's run only)."""
        if self.source.checkpoint is None:
            return []
        trained = self.source.checkpoint.trained_profile_ids()
        return [pid for pid in profile_ids if pid in trained]

    def protocol_fields(self) -> dict[str, Any]:
        """The policy.* fields of the protocol card (eval/protocol.py): what was evaluated, and the
        ids an endpoint's server lists."""
        src = self.source
        served = served_models(src.client) if src.client is not None else None
        # The engine a policy on our weights samples on, as its row is named (engines.table); none for a served one.
        engine = self.spec.policy.engine.engine if src.client is None else None
        return {"source": src.source, "label": src.label, "backend": src.backend, "think": src.think,
                "engine": engine, "served_models": served,
                "url": src.client.base_url if src.client is not None else None}

    def run_info(self) -> dict[str, Any]:
        c = self.spec
        sim = c.settings.simulator
        rules = ("initial_emotion", "max_change", "ceiling", "floor", "floor_inclusive", "max_turns",
                 "score_final_turn")
        src = self.source
        return {"policy": src.label, "source": src.source, "backend": src.backend, "think": src.think,
                "simulator": sim.describe(),
                "difficulty": sim.difficulty, "rules": {k: getattr(sim.rules, k) for k in rules},
                "profiles": c.profiles + (f", the last {c.holdout}" if c.holdout else "")}


def simulator_error_causes(workdir: pathlib.Path) -> collections.Counter[str]:
    """How often each error ended a dialogue of WORKDIR's transcripts in a simulator error."""
    return collections.Counter(r["simulator_state"].get("error") or "no error recorded"
                               for r in load_records(pathlib.Path(workdir) / TRANSCRIPTS) if r["simulator_error"])


def run_benchmark(spec: EvalSpec, *, progress: bool = True) -> dict[str, Any]:
    """Evaluate (or finish evaluating) the policy of `spec` (EvalSpec.from_config: every field
    checked before any file, model or server is touched; under `like_training`'s settings when
    config.eval.like_training is set); returns the scores of sentient.json. setup.json is written
    once the simulator and the policy were found, before the first dialogue."""
    settings = spec.settings
    if not spec.workdir:
        raise ValueError("config.workdir is empty: set --config.workdir=DIR (results, report and plots go there)")
    if settings.panel:
        return _run_panel(spec, settings.panel, progress)
    workdir = pathlib.Path(spec.workdir)
    profiles = load_eval_profiles(spec)
    policy = _PolicySpec(spec)
    transcripts = workdir / TRANSCRIPTS
    lock = WorkDirLock(workdir, "an evaluation") if process_index() == 0 else None
    try:
        plan = allgather_json(_plan(workdir, policy, profiles, lock) if lock is not None else None)[0]
        if "error" in plan:  # every process stops with process 0's error
            raise ValueError(plan["error"])
        pending = [(i, p) for i, p in enumerate(profiles) if p.id in set(plan["pending"])]
        log.info("%d profiles: %d already evaluated in %s, %d to go", len(profiles), len(profiles) - len(pending),
                 transcripts, len(pending))
        if pending:
            _evaluate(spec, policy, pending, workdir, progress)
        probes = _play_probes(settings, profiles, workdir, progress)
        scores = None
        if process_index() == 0:
            done = {r["profile_id"]: r for r in load_records(transcripts)}
            rules = settings.simulator.rules
            card = protocol.card(settings.simulator, protocol.served_simulator_models(settings.simulator),
                                 profiles_file=spec.profiles, profiles=len(profiles),
                                 policy=policy.protocol_fields(), sampling=settings.sampling,
                                 rollout=dataclasses.replace(settings.rollout, think=policy.source.think),
                                 seed=spec.seed)
            run = {**policy.run_info(), "trained_on": policy.trained_on([p.id for p in profiles])}
            scores = report.write_outputs(workdir, [done[p.id] for p in profiles], {p.id: p for p in profiles}, run,
                                          levels=(rules.floor, rules.band_b, rules.band_a, rules.ceiling),
                                          card=card, probes=probes)
        return allgather_json(scores)[0]
    finally:
        if lock is not None:
            lock.release()


def _run_panel(spec: EvalSpec, members: tuple[panel.Member, ...], progress: bool) -> dict[str, Any]:
    """The evaluation of `spec` under each simulator of the panel, one after another, each in
    its own directory under WORKDIR; then (process 0) the panel's sentient.json and report.md."""
    workdir = pathlib.Path(spec.workdir)
    ones = []
    for k, member in enumerate(members):  # every member checked (its server asked) before anything is written
        # Its errors name the member, beside the config.simulator fields it set.
        named = f"config.eval.simulators: member {k + 1} of {len(members)}, {member.label!r}"
        try:
            ones.append(spec.panel_member(k, member))  # `spec` is already under the run's settings
            check_endpoint(ones[-1].settings.simulator, wait=(pathlib.Path(ones[-1].workdir) / TRANSCRIPTS).exists())
        except SimulatorUnavailableError as e:  # an outage past its budget keeps its type: exit status 75
            raise type(e)(f"{named}: {e}") from e
        except ValueError as e:
            raise ValueError(f"{named}: {e}") from e
    results = []
    for k, (member, one) in enumerate(zip(members, ones)):
        log.info("panel: simulator %d of %d, %s, into %s", k + 1, len(members), member.label, one.workdir)
        results.append(run_benchmark(one, progress=progress))
    summary = None
    if process_index() == 0:
        summary = panel.summarize_panel(members, results)
        atomic_write_text(workdir / "sentient.json", report.json_text(summary))
        atomic_write_text(workdir / "report.md", panel.render(summary, results[0]["run"]["policy"]))
    return allgather_json(summary)[0]


def _plan(workdir: pathlib.Path, spec: _PolicySpec, profiles: list[Profile], lock: WorkDirLock) -> dict[str, Any]:
    """Process 0's view of the work directory, once it holds its `lock` (another evaluation in it
    is refused: it would play every profile a second time): the ids of the profiles left to play,
    or the error that stops the evaluation."""
    workdir.mkdir(parents=True, exist_ok=True)
    transcripts = workdir / TRANSCRIPTS
    try:
        lock.acquire()
        setup_conflict(workdir / SETUP, spec.setup(), transcripts)
    except (ValueError, WorkDirBusyError) as e:
        return {"error": str(e)}
    finished = {r["profile_id"] for r in load_records(transcripts)}
    return {"pending": [p.id for p in profiles if p.id not in finished]}


def _play_probes(settings: BenchmarkSettings, profiles: list[Profile], workdir: pathlib.Path,
                 progress: bool) -> dict[str, list[dict[str, Any]]]:
    """The dialogues of every robustness probe of `settings.probes` (eval/probes.py) with every
    profile, under the benchmark's simulator and rules, counted on one progress bar; resumable like
    the policy's (WORKDIR/probes/NAME.jsonl). Every process plays its share; process 0 returns each
    probe's records in profile order ([] elsewhere)."""
    paths = {name: workdir / PROBES_DIR / f"{name}.jsonl" for name in settings.probes}
    pending = {}
    for name, path in paths.items():
        done = {r["profile_id"] for r in load_records(path)} if process_index() == 0 else set()
        left = set(allgather_json(sorted(p.id for p in profiles if p.id not in done))[0])
        pending[name] = [(i, p) for i, p in enumerate(profiles) if p.id in left]
    rollout = dataclasses.replace(settings.rollout, think=False)  # a canned reply is all said, nothing thought
    todo = [name for name in paths if pending[name]]
    with tqdm(total=sum(len(share(len(pending[n]))) for n in todo), unit="dialogue", dynamic_ncols=True,
              disable=not (progress and todo) or process_index() != 0) as bar:
        for k, name in enumerate(todo):
            play_profiles(ProbePolicy(name), None, settings.simulator, rollout, pending[name],
                          group_size=settings.group_size, max_dialogues=settings.max_dialogues, append_to=paths[name],
                          progress=f"probes ({k + 1} of {len(todo)}: {name})", bar=bar)
    if process_index():
        return {name: [] for name in paths}
    by_id = {name: {r["profile_id"]: r for r in load_records(path)} for name, path in paths.items()}
    return {name: [by_id[name][p.id] for p in profiles] for name in paths}


def _evaluate(eval_spec: EvalSpec, spec: _PolicySpec, pending: list[tuple[int, Profile]], workdir: pathlib.Path,
              progress: bool) -> None:
    """Play the dialogues of `pending` ((index in the benchmark, profile) pairs; each process a
    share of them), appending each to the transcripts as it ends: process 0 its own at once, the
    other processes' when they are gathered at the end."""
    settings = eval_spec.settings
    rerun = (workdir / TRANSCRIPTS).exists()  # a rerun waits for a server still down, as the run did
    check_endpoint(settings.simulator, wait=rerun)
    if spec.source.client is not None:
        check_chat_endpoint(spec.source.client, wait=rerun)
    policy, chat_tokens = spec.build(workdir, settings.sampling)
    # A token policy samples on config.policy.engine, whose row says whether it takes each turn as it comes.
    rollout = dataclasses.replace(settings.rollout, think=spec.source.think,
                                  continuous=chat_tokens is not None and eval_spec.policy.engine.row.continuous)
    if chat_tokens is not None:  # a profile whose opening fills the policy's budget would end before it spoke
        check_openings(chat_tokens, rollout, [p for _, p in pending], "config.eval.profiles",
                       language=settings.simulator.language)
    transcripts = workdir / TRANSCRIPTS
    if process_index() == 0:  # what the results will be of (checked against the directory in `_plan`)
        record_setup(workdir / SETUP, spec.setup())
    if process_index() == 0:  # the report's plots need matplotlib (~1 s to import): import it while the dialogues wait
        threading.Thread(target=importlib.import_module, args=("matplotlib.backends.backend_agg",),
                         name="import matplotlib", daemon=True).start()
    resume = f"The finished dialogues are saved in {transcripts}; rerun the same command to resume."
    try:
        play_profiles(policy, chat_tokens, settings.simulator, rollout, pending, group_size=settings.group_size,
                      max_dialogues=settings.max_dialogues, append_to=transcripts,
                      progress="sentient" if progress else None)
    except SimulatorUnavailableError as e:  # an outage past its budget keeps its type: exit status 75
        raise type(e)(f"{e}\n{resume}") from e
    except EndpointUnavailableError as e:  # not the simulator's (caught above): the policy's endpoint
        raise restated(e, f"the policy endpoint --config.policy.base_url={eval_spec.policy.base_url} failed: "
                          f"{e}.\n{resume}") from e
