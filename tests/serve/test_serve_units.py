"""The pieces of `lever serve` without a model: stop strings over streamed
text, request validation, the engine queue (FIFO, bound, cancellation)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from lever.sampling import SamplingParams
from lever.serve import openai_schema as schema
from lever.serve.generation_queue import Cancelled, GenerationQueue, Job, QueueFull
from lever.serve.stop_strings import StopScanner


@pytest.mark.parametrize("pieces, stops, shown, stopped", [
    (["Hello", " wor", "ld"], (), "Hello world", False),
    (["a", "bc", "STO", "P", "tail"], ("STOP",), "abc", True),
    (["x S", "T", "y"], ("STOP",), "x STy", False),                     # a false start is released
    (["one\n", "\ntwo"], ("\n\n", "END"), "one", True),
    (["abEN", "D!"], ("\n\n", "END"), "ab", True),
    (["ST"], ("STOP",), "ST", False),                                   # held back, released by flush
])
def test_stop_scanner_never_shows_text_a_stop_cuts(pieces, stops, shown, stopped):
    scanner = StopScanner(stops)
    out = []
    for p in pieces:
        out.append(scanner.push(p))
        for s in stops:                    # nothing shown so far contains a stop string
            assert s not in "".join(out)
    out.append(scanner.flush())
    assert "".join(out) == shown and scanner.stopped is stopped


def served(context: int = 100, max_tokens: int = 50) -> schema.ServedModel:
    return schema.ServedModel(name="m", vocab_size=1000, context=context, max_tokens=max_tokens,
                              defaults=SamplingParams(), encode_chat=lambda ms: [1] * sum(len(m["content"]) for m in ms),
                              encode_text=lambda text: [2] * len(text))


def test_a_chat_request_is_parsed_with_defaults_and_extensions():
    req = schema.parse_chat({"model": "m", "messages": [{"role": "system", "content": "ab"},
                                                        {"role": "user", "content": [{"type": "text", "text": "cd"}]}],
                             "top_k": 5, "seed": 3, "stop": "x", "stream": True,
                             "stream_options": {"include_usage": True}, "presence_penalty": 0.0,
                             "frequency_penalty": 0, "logprobs": False, "user": "u",
                             "temperature": None}, served())
    assert req.prompt_ids == [1] * 4 and req.max_tokens == 50               # capped by the server's max_tokens
    assert req.params == SamplingParams(0.0, 1.0, 5, 3) and req.stop == ("x",)
    assert req.stream and req.include_usage and req.kind == "chat"


@pytest.mark.parametrize("body, status, param, text", [
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "max_completion_tokens": 1}, 400, "max_tokens", "give one of max_completion_tokens or max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 0.5}, 400, "presence_penalty", "only 0 is supported"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": 0}, 400, "logprobs", "only false is supported"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": ["a"] * 5}, 422, "stop", "at most 4 stop strings"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": [""]}, 422, "stop", "1 to 256 characters"),
    ({"messages": [{"role": "user", "content": "x"}], "seed": -1}, 422, "seed", "must be between 0 and"),
    ({"messages": [{"role": "user", "content": "x"}], "top_p": 0}, 422, "top_p", "top_p must be between"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": True}, 400, "temperature", "must be a number"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400, "stream", "must be true or false"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, 400, "messages[0]", "unsupported field 'tool_calls'"),
    ({"messages": [{"role": "user", "content": "x" * 100}]}, 422, "messages", "context holds 100 tokens"),          # no room in the context
    ({"messages": [{"role": "user", "content": "x" * 60}], "max_tokens": 45}, 422, "max_tokens", "plus max_tokens 45 exceeds"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 51}, 422, "max_tokens", "must be between 1 and 50"),
    ({"messages": [{"role": "user", "content": "x"}], "model": 3}, 400, "model", "must be a string"),
])
def test_a_bad_chat_request_names_its_field(body, status, param, text):
    with pytest.raises(schema.OpenAIError) as e:
        schema.parse_chat(body, served())
    assert (e.value.status, e.value.param) == (status, param), e.value.message
    assert text in e.value.message
    err = e.value.body()["error"]
    assert set(err) == {"message", "type", "code", "param"} and err["type"] == "invalid_request_error"


def test_completion_prompts():
    assert schema.parse_completion({"prompt": "abc"}, served()).prompt_ids == [2, 2, 2]
    assert schema.parse_completion({"prompt": [[5, 6]]}, served()).prompt_ids == [5, 6]
    for prompt in ([1000], [-1], [1.5], ["a", "b"], 7, []):
        with pytest.raises(schema.OpenAIError):
            schema.parse_completion({"prompt": prompt}, served())


def test_the_queue_runs_jobs_in_order_bounded_and_drops_cancelled_ones():
    async def main():
        loop = asyncio.get_running_loop()
        queue = GenerationQueue(max_waiting=2)
        gate, order = threading.Event(), []

        def work(tag):
            def run(job):
                if tag == "first":
                    gate.wait(10)
                order.append(tag)
                return tag
            return run

        jobs = [Job(work(tag), loop) for tag in ("first", "second", "third")]
        queue.submit(jobs[0])
        while queue.active == 0:
            await asyncio.sleep(0.005)
        queue.submit(jobs[1])
        queue.submit(jobs[2])
        with pytest.raises(QueueFull):
            queue.submit(Job(work("fourth"), loop))
        jobs[1].cancel()                                   # its client left while it waited
        assert queue.depth == 1 and queue.dropped == 1
        gate.set()
        assert await jobs[0].done == "first" and await jobs[2].done == "third"
        with pytest.raises(Cancelled):
            await jobs[1].done
        assert order == ["first", "third"] and queue.completed == 2 and queue.freed == 2
        queue.close()

    asyncio.run(main())


def test_a_running_job_stops_at_its_next_check():
    async def main():
        loop = asyncio.get_running_loop()
        queue = GenerationQueue(max_waiting=1)
        steps = []

        def work(job):
            for i in range(10_000):
                job.check()
                steps.append(i)
                job.post(i)
                threading.Event().wait(0.001)
            return "finished"

        job = Job(work, loop)
        queue.submit(job)
        assert await job.events.get() == 0
        job.cancel()
        with pytest.raises(Cancelled):
            await job.done
        assert len(steps) < 10_000 and queue.cancelled == 1 and queue.freed == 1
        queue.close()

    asyncio.run(main())


def test_mode_lever_keeps_one_policy_per_sampling_setting():
    from lever.engine import SpecConfig
    from lever.serve.specs import LeverSpecs
    made = []
    specs = LeverSpecs(lambda params: made.append(params) or object(), SpecConfig("tree", 3))
    greedy, greedy_again = specs(SamplingParams()), specs(SamplingParams(seed=5))
    warm, warm_other_seed = specs(SamplingParams(0.7, seed=1)), specs(SamplingParams(0.7, seed=2))
    assert greedy.policy is greedy_again.policy and warm.policy is warm_other_seed.policy
    assert greedy.policy is not warm.policy and len(made) == 2
    assert greedy.mode == "lever" and greedy.draft_len == 3
