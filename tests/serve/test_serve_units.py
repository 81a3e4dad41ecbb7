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
from waiting import deadline


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


@pytest.mark.parametrize("body_model, requested", [(None, None), ("m", None), ("gpt-4o", "gpt-4o"), ("", "")])
def test_another_model_name_is_served_by_the_served_model(body_model, requested):
    """Not a 404 (as llama-server): the request runs on the served model, whose name the
    responses carry; the name asked for is kept for the server's one warning."""
    body = {"messages": [{"role": "user", "content": "x"}], **({} if body_model is None else {"model": body_model})}
    for req in (schema.parse_chat(body, served()),
                schema.parse_completion({"prompt": "x", **({} if body_model is None else {"model": body_model})},
                                        served())):
        assert req.model == "m" and req.requested_model == requested
        assert schema.response(req, "id", 0, "t", [1], "stop", {})["model"] == "m"


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
                    assert gate.wait(deadline(10)), "the test never opened the gate"
                order.append(tag)
                return tag
            return run

        jobs = [Job(work(tag), loop) for tag in ("first", "second", "third")]
        queue.submit(jobs[0])
        stop = loop.time() + deadline(10)
        while queue.active == 0:                           # the first job has started
            assert loop.time() < stop, "the first job never started"
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


@pytest.mark.parametrize("raw, param, reason", [
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content",
     "unpaired UTF-16 surrogate U+D800"),
    (b'{"messages": [{"role": "user", "content": "a\\udfffb"}]}', "messages[0].content", "U+DFFF at character 1"),
    (b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}', "messages[0].content",
     "a byte 0xED that is not UTF-8"),
    (b'{"messages": [{"role": "user", "content": "ok\xc0\xaf"}]}', "messages[0].content",
     "0xC0 that is not UTF-8 (or an"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\xff"}]}]}',
     "messages[0].content[0].text", "0xFF"),
    (b'{"messages": [{"role": "user", "content": "x", "name": "\\udc80"}]}', "messages[0].name", "0x80"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stop": ["a", "\\ud83d"]}', "stop[1]", "U+D83D"),
    (b'{"messages": [{"role": "user", "content": "x"}], "model": "\xe0\x80\xaf"}', "model", "0xE0"),
    (b'{"messages": [{"role": "user", "content": "x"}], "user": "\\udfff"}', "user", "U+DFFF"),
    (b'{"messages": [{"role": "user", "content": "x"}], "\\ud800": 1}', "(the body)", "has a field name that"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stream_options": {"\xff": 1}}', "stream_options",
     "has a field name that"),
    (b'{"prompt": "\\ud800", "model": "m"}', "prompt", "U+D800"),
    (b'{"prompt": ["\xed\xbf\xbf"]}', "prompt[0]", "0xED"),
    ('{"prompt": "\ud800"}'.encode("utf-16-le", "surrogatepass"), "prompt", "U+D800"),      # JSON in UTF-16
])
def test_text_that_is_not_unicode_is_a_400_naming_its_field(raw, param, reason):
    body = schema.decode_json(raw)
    parse = schema.parse_chat if "messages" in body else schema.parse_completion
    with pytest.raises(schema.OpenAIError) as e:
        parse(body, served())
    assert (e.value.status, e.value.code, e.value.param) == (400, "invalid_text", param)
    assert e.value.message.startswith(f"{param}: ") and reason in e.value.message and "\n" not in e.value.message


@pytest.mark.parametrize("raw", [b'{"prompt": "a\\u0000b"}', b'{"prompt": "\\ud83d\\ude00 paired"}',
                                 b'\xef\xbb\xbf{"prompt": "with a byte-order mark"}', '{"prompt": "\u00e9"}'.encode()])
def test_nul_characters_and_paired_surrogates_are_text(raw):
    req = schema.parse_completion(schema.decode_json(raw), served())
    assert req.prompt_ids


def test_deep_json_is_checked_without_recursion():
    from lever.http.json_body import invalid_text
    depth = 50_000
    value = ["\ud800"]
    for _ in range(depth):
        value = [value]
    path, reason = invalid_text({"x": value})
    assert path == "x" + "[0]" * (depth + 1) and "U+D800" in reason
