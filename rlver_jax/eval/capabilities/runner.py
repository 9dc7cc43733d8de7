"""The capability run behind launch/capabilities.py: every item of the benchmarks given
(config.data.*) asked of the policy, graded, and the outputs written.

Resumable, in two steps per item, each appended the moment it is done: the policy's answer to
WORKDIR/answers.jsonl, then its grade to WORKDIR/items.jsonl. A rerun asks only the items
without an answer and grades only the answers without a grade; WORKDIR/setup.json records what
defines the results (policy, sampling, prompts, data checksums, code limits) and a rerun with a
different set-up is refused rather than mixed in (rlver_jax.eval.resume).

Think mode: the text after the last </think> is graded (the reference's rule); a reply without
it is counted (think_unclosed) and fails every measure (`unclosed_result`: no grader runs, so an
empty text passes nothing, not even an IFEval instruction such as "no commas"; capabilities.json's
counts and scores, pass@1 included, all come from these verdicts). A request the endpoint refuses
alone (HTTP 400/413/422: too long for its context, a content filter) is recorded as an empty answer
with the refusal (`rejected`), graded wrong and counted; any other endpoint failure stops the run.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
from typing import Any

from tqdm import tqdm

from rlver_jax.eval import policy_source, protocol
from rlver_jax.eval.capabilities import compare, data, prompts, report
from rlver_jax.eval.resume import check_setup, load_records
from rlver_jax.eval.spec import CapabilitiesSpec
from rlver_jax.files import append_jsonl
from rlver_jax.inflight import show_requests
from rlver_jax.llm_client import (
    EndpointUnavailableError,
    RequestRejectedError,
    check_chat_endpoint,
    restated,
    served_models,
)
from rlver_jax.text.chat import THINK_CLOSE

log = logging.getLogger(__name__)

ANSWERS = "answers.jsonl"
ITEMS = report.ITEMS
SETUP = "setup.json"
UNCLOSED = "the thinking never closed (no </think>): graded wrong"


def load_items(spec: CapabilitiesSpec) -> list[data.Item]:
    """The items of every benchmark config.data names (the first eval.max_examples of each)."""
    given = [b for b in data.BENCHMARKS if spec.data[b]]
    if not given:
        raise ValueError("no benchmark to run: set at least one of --config.data.math500, --config.data.ifeval, "
                         "--config.data.livecodebench to a local file (docs/capabilities.md)")
    if spec.max_examples < 0:
        raise ValueError(f"config.eval.max_examples={spec.max_examples}: use 0 (all) or a positive count")
    items = []
    for b in given:
        found = data.READERS[b](spec.data[b])
        if not found:
            raise data.DataError(f"config.data.{b}={spec.data[b]!r} holds no items")
        items += found[:spec.max_examples] if spec.max_examples else found
    if len({i.key for i in items}) != len(items):
        raise data.DataError("two items share an id within one benchmark; ids must be unique")
    return items


def graded_text(reply: str, think: bool) -> tuple[str, bool | None]:
    """(the text graded, whether </think> closed the thinking; None outside think mode)."""
    if not think:
        return reply, None
    _, closed, tail = reply.rpartition(THINK_CLOSE)
    return (tail.strip(), True) if closed else ("", False)


def setup_of(spec: CapabilitiesSpec, source: policy_source.PolicySource) -> dict[str, Any]:
    """What defines the results, for setup.json (not how they are fetched)."""
    p = spec.record["policy"]
    out: dict[str, Any] = {"policy.source": source.source, "policy.think": source.think, "seed": spec.seed,
                           "eval.think_instruction": spec.think_instruction if source.think else "",
                           "eval.max_examples": spec.max_examples}
    out.update({f"policy.{k}": p[k] for k in ("temperature", "top_p", "top_k", "max_new_tokens")})
    for b in data.BENCHMARKS:
        if spec.data[b]:
            out[f"data.{b}.sha256"] = data.sha256(data.files(spec.data[b], f"config.data.{b}"))
    if spec.data["livecodebench"]:
        out["code.test_timeout_s"] = spec.limits.test_timeout_s
        out["code.memory_mb"] = spec.limits.memory_mb
    return out


def run(spec: CapabilitiesSpec, *, progress: bool = True) -> dict[str, Any]:
    """Run (or finish) the evaluation of config.policy (`spec`: CapabilitiesSpec.from_config);
    returns capabilities.json's scores."""
    if not spec.workdir:
        raise ValueError("config.workdir is empty: set --config.workdir=DIR (results and reports go there)")
    workdir = pathlib.Path(spec.workdir)
    items = load_items(spec)
    from rlver_jax.eval.capabilities import extra

    extra.check(sorted({i.benchmark for i in items}))
    source = policy_source.resolve(spec.policy, spec.seed, max_in_flight=spec.max_in_flight)
    workdir.mkdir(parents=True, exist_ok=True)
    answers_path, items_path = workdir / ANSWERS, workdir / ITEMS
    check_setup(workdir / SETUP, setup_of(spec, source), answers_path)
    answered = {r["key"]: r for r in load_records(answers_path)}
    graded = {r["key"] for r in load_records(items_path)}
    to_ask = [i for i in items if i.key not in answered]
    to_grade = [i for i in items if i.key in answered and i.key not in graded]
    log.info("%d items: %d to ask, %d more to grade, %d done", len(items), len(to_ask), len(to_grade),
             len(items) - len(to_ask) - len(to_grade))
    if to_ask or to_grade:
        position = {item.key: n for n, item in enumerate(items)}
        _ask_and_grade(spec, source, workdir, to_ask, to_grade, answered, position, progress)
    done = {r["key"]: r for r in load_records(items_path)}
    records = [done[i.key] for i in items]
    info = {"policy": source.label, "source": source.source, "backend": source.backend, "think": source.think,
            "temperature": spec.record["policy"]["temperature"],
            "max_new_tokens": spec.record["policy"]["max_new_tokens"],
            "data": {b: spec.data[b] for b in data.BENCHMARKS if spec.data[b]},
            # how the result was obtained (eval/protocol.py): the set-up, the served model's ids, version, date
            "protocol": {**setup_of(spec, source), **protocol.stamp(), "policy.served_models":
                         served_models(source.client) if source.client is not None else None}}
    scores = report.write_outputs(workdir, records, info)
    if spec.compare_to:
        compare.write_comparison(pathlib.Path(spec.compare_to), workdir, seed=spec.seed)
    return scores


def unclosed_result(item: data.Item) -> dict[str, Any]:
    """The grade of a think-mode reply whose thinking never closed: wrong on every measure."""
    if item.benchmark == "math500":
        return {"correct": False, "extracted": "", "answer": item.reference["answer"],
                "subject": item.reference["subject"], "level": item.reference["level"]}
    if item.benchmark == "ifeval":
        instructions = item.reference["doc"]["instruction_id_list"]
        return {"correct": False, "prompt_level_strict_acc": False, "prompt_level_loose_acc": False,
                "inst_level_strict_acc": [False] * len(instructions),
                "inst_level_loose_acc": [False] * len(instructions), "instruction_id_list": instructions}
    return {"correct": False, "program": "", "results": [], "error": UNCLOSED, **_code_fields(item)}


def _code_fields(item: data.Item) -> dict[str, Any]:
    """What items.jsonl keeps of a LiveCodeBench problem besides its grade."""
    return {k: item.reference[k] for k in ("tests", "difficulty", "platform", "title")}


def _grade_sync(item: data.Item, text: str) -> dict[str, Any]:
    if item.benchmark == "math500":
        from rlver_jax.eval.capabilities import grade_math

        return {**grade_math.grade(text, item.reference["answer"]), "answer": item.reference["answer"],
                "subject": item.reference["subject"], "level": item.reference["level"]}
    from rlver_jax.eval.capabilities import grade_ifeval

    return {**grade_ifeval.grade(text, item.reference["doc"]),
            "instruction_id_list": item.reference["doc"]["instruction_id_list"]}


def _ask_and_grade(spec: CapabilitiesSpec, source: policy_source.PolicySource, workdir: pathlib.Path,
                   to_ask: list[data.Item], to_grade: list[data.Item], answered: dict[str, dict[str, Any]],
                   position: dict[str, int], progress: bool) -> None:
    if source.client is not None:
        check_chat_endpoint(source.client)
    limits = spec.limits
    think_instruction = spec.think_instruction if source.think else ""
    bar = tqdm(total=len(to_ask) + len(to_grade), disable=not progress, desc="capabilities", unit="item",
               dynamic_ncols=True)
    stop_showing = show_requests(bar, "capabilities")
    code_slots = asyncio.Semaphore(spec.code_workers) if spec.data["livecodebench"] else None

    async def grade(item: data.Item, answer: dict[str, Any]) -> None:
        text, closed = graded_text(answer["reply"], source.think)
        if closed is False:
            result = unclosed_result(item)
        elif item.benchmark == "livecodebench":
            from rlver_jax.eval.capabilities import grade_code

            async with code_slots:
                result = {**await grade_code.grade(text, item.reference["input_output"], limits), **_code_fields(item)}
        else:
            result = _grade_sync(item, text)  # on the loop's (main) thread: math-verify times out by signal
        messages = prompts.messages(item, think_instruction)
        append_jsonl(workdir / ITEMS, {
            "key": item.key, "benchmark": item.benchmark, "id": item.id, "question": messages[-1]["content"],
            "reply": answer["reply"], "graded_text": text, "think_closed": closed, "stopped": answer["stopped"],
            "rejected": answer.get("rejected", ""), **result})
        bar.update(1)

    async def main() -> None:
        built, chat_tokens = policy_source.build(spec.policy, source, spec.mesh, spec.seed, workdir, spec.sampling)
        group = 1 if chat_tokens is None else max(1, spec.group_size)
        slots = asyncio.Semaphore(max(1, spec.max_in_flight // group))
        tasks: list[asyncio.Task] = []

        async def ask(chunk: list[data.Item]) -> None:
            from rlver_jax.engines.seam import TurnRequest
            from rlver_jax.text import chat

            requests = []
            for item in chunk:
                messages = prompts.messages(item, think_instruction)
                ids = (chat.conversation_ids(chat_tokens, messages, add_generation_prompt=True)[0]
                       if chat_tokens is not None else None)
                # dialogue: the item's place in the run, so a JAX policy's draws depend on neither
                # batching nor resuming
                requests.append(TurnRequest(ids, messages, spec.sampling.max_new_tokens,
                                            dialogue=position[item.key]))
            async with slots:
                try:
                    turns = [(t.text, t.stopped, "") for t in await built.act(requests)]
                except RequestRejectedError as e:  # this request only (e.g. too long): graded as no answer
                    turns = [("", True, str(e))] * len(requests)
            for item, (text, stopped, rejected) in zip(chunk, turns):
                answer = {"key": item.key, "reply": text, "stopped": stopped, "rejected": rejected}
                append_jsonl(workdir / ANSWERS, answer)
                tasks.append(asyncio.create_task(grade(item, answer)))

        try:
            for item in to_grade:
                tasks.append(asyncio.create_task(grade(item, answered[item.key])))
            await asyncio.gather(*(ask(to_ask[i:i + group]) for i in range(0, len(to_ask), group)))
            while tasks:  # grading tasks started as the answers came in
                pending, tasks[:] = list(tasks), []
                await asyncio.gather(*pending)
        finally:
            if hasattr(built, "aclose"):
                await built.aclose()

    resume = f"Finished items are saved in {workdir}; rerun the same command to resume."
    try:
        asyncio.run(main())
    except EndpointUnavailableError as e:
        raise restated(e, f"{e}\n{resume}") from e
    finally:
        stop_showing()
        bar.close()
