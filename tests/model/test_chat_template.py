"""Chat templates render in a worker process under a budget
(lever.model.chat_template): real templates exactly as Jinja renders them
in process, hostile ones stopped with one error naming the template."""

from __future__ import annotations

import copy
import time

import pytest

from hostile_templates import HOSTILE
from lever.errors import LeverError, ModelFormatError
from lever.gguf.file import GGUFFile
from lever.model import chat_template
from lever.model.chat_template import TemplateBudget, TemplateRenderer
from lever.model.tokenizer import Tokenizer
from waiting import deadline

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3? \u00e9\u4e2d {{ x }} {% y %}"}],
    [{"role": "assistant", "content": ""}],
]


@pytest.fixture(scope="module")
def smol(smollm2_path):
    return Tokenizer.from_gguf(GGUFFile(smollm2_path))


def in_process(tokenizer: Tokenizer, messages, add_generation_prompt: bool) -> str:
    """How the chat template was rendered before the budget: Jinja's immutable
    sandbox in this process, Hugging Face's settings."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    return env.from_string(tokenizer.chat_template).render(
        messages=messages, add_generation_prompt=add_generation_prompt, bos_token=tokenizer.bos_token or "",
        eos_token=tokenizer.eos_token or "", pad_token="")


@pytest.mark.parametrize("gen", [True, False])
def test_the_smollm2_template_renders_as_before(smol, gen):
    assert "im_start" in smol.chat_template
    for messages in CONVERSATIONS:
        assert smol.apply_chat_template(messages, add_generation_prompt=gen) == in_process(smol, messages, gen)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_template_is_one_error_naming_it(smol, smollm2_path, name):
    template, fragment = HOSTILE[name]
    hostile = copy.copy(smol)
    hostile.chat_template = template
    t0 = time.monotonic()
    with pytest.raises(LeverError) as e:
        hostile.apply_chat_template(CONVERSATIONS[0])
    assert time.monotonic() - t0 < deadline(10)           # the time budget is 5 s
    message = str(e.value)
    assert message.startswith(f"the chat template of {smollm2_path} ") and fragment in message
    assert "\n" not in message
    assert smol.apply_chat_template(CONVERSATIONS[0]) == in_process(smol, CONVERSATIONS[0], True)   # renders on


def test_a_render_over_time_kills_its_worker_and_the_next_starts_fresh():
    renderer = TemplateRenderer(TemplateBudget(seconds=0.5), workers=1)
    try:
        assert renderer.render("{{ 1 + 1 }}", {}) == "2"
        worker = renderer._idle[0]
        with pytest.raises(LeverError, match=r"^loop did not finish rendering within its budget of 0.5 s"):
            renderer.render(HOSTILE["nested_range_loop"][0], {}, "loop")
        assert worker.proc.poll() is not None and renderer._idle == []        # killed and reaped
        assert renderer.render("{{ messages[0] }}", {"messages": ["again"]}) == "again"
        assert renderer._idle[0] is not worker
    finally:
        renderer.close()


def test_an_idle_worker_exits_and_is_not_reused_near_its_exit(monkeypatch):
    """A worker frees its memory after WORKER_IDLE_SECONDS without a request;
    the renderer reuses one only within REUSE_SECONDS, then starts another."""
    monkeypatch.setattr(chat_template, "WORKER_IDLE_SECONDS", 0.5)
    monkeypatch.setattr(chat_template, "REUSE_SECONDS", 0.25)
    renderer = TemplateRenderer(workers=1)
    try:
        assert renderer.render("{{ 1 + 1 }}", {}) == "2"
        worker = renderer._idle[0]
        assert renderer.render("{{ 2 + 2 }}", {}) == "4" and renderer._idle == [worker]     # reused at once
        worker.proc.wait(timeout=deadline(10))                                             # exits by itself
        assert worker.proc.returncode == 0
        assert renderer.render("{{ 3 + 3 }}", {}) == "6" and renderer._idle[0] is not worker
    finally:
        renderer.close()


@pytest.mark.parametrize("budget, ok, over, fragment", [
    (dict(range_items=10), "{{ range(10)|list|length }}", "{{ range(11)|list|length }}", "range() of 11 items"),
    (dict(sequence_items=6), "{{ 'ab' * 3 }}{{ [1] + [2] }}", "{{ 'abc' + 'defg' }}", "7 items (made by '+')"),
    (dict(sequence_items=6), "{{ [1, 2] * 3 }}", "{{ 7 * 'a' }}", "7 items (made by '*')"),
    (dict(int_bits=64), "{{ 2 ** 40 }}{{ 3 * 5 }}", "{{ 2 ** 100 }}", "bits (made by '**')"),
    (dict(call_depth=3), "{% macro f(n) %}{{ f(n - 1) if n > 1 else 'end' }}{% endmacro %}{{ f(3) }}",
     "{% macro f(n) %}{{ f(n - 1) if n > 1 else 'end' }}{% endmacro %}{{ f(4) }}", "deeper than the budget of 3"),
    (dict(output_chars=5), "{{ 'abcde' }}", "{{ 'abc' }}{{ 'def' }}", "over the budget of 5 characters"),
])
def test_each_cap_allows_up_to_its_budget(budget, ok, over, fragment):
    renderer = TemplateRenderer(TemplateBudget(**budget), workers=1)
    try:
        renderer.render(ok, {})
        with pytest.raises(LeverError, match="went over its budget") as e:
            renderer.render(over, {}, "t")
        assert fragment in str(e.value)
    finally:
        renderer.close()


def test_template_errors_stay_errors_of_the_template():
    renderer = TemplateRenderer(workers=1)
    try:
        with pytest.raises(ModelFormatError, match="^t does not compile"):
            renderer.render("{% for %}", {}, "t")
        with pytest.raises(LeverError, match="^t failed on this conversation: roles must alternate"):
            renderer.render("{{ raise_exception('roles must alternate') }}", {}, "t")
        with pytest.raises(LeverError, match="unsafe"):
            renderer.render("{{ messages.__class__.__mro__ }}", {"messages": []}, "t")
        with pytest.raises(LeverError, match="TypeError"):
            renderer.render("{{ 1 + 'a' }}", {}, "t")
        with pytest.raises(LeverError, match="JSON values"):
            renderer.render("{{ x }}", {"x": object()}, "t")
        assert renderer.render("{{ x|tojson }}", {"x": {"a": "<b>"}}) == '{"a": "<b>"}'     # plain JSON, as HF
    finally:
        renderer.close()


def test_a_worker_that_cannot_start_is_one_error(monkeypatch):
    monkeypatch.setattr("sys.executable", "/bin/false")
    renderer = TemplateRenderer(workers=1)
    with pytest.raises(LeverError, match="^t: its worker process exited as it started"):
        renderer.render("{{ 1 }}", {}, "t")
