"""The `lever` options: one definition per option (the same type and help in
every command that has it), one name per idea (old spellings parse as hidden
aliases for one release), every numeric option bounded, and generate's
--ignore-eos."""

import argparse
import json

import pytest

from lever.cli import build_parser, main

SHARED = ("--dtype", "--kernels", "--target-store", "--max-new-tokens", "--cache-dir", "--dram-budget",
          "--memory-limit", "--reader", "--prefetch-depth", "--read-queue-depth", "--read-limit", "--draft-head",
          "--temperature", "--seed", "--draft", "--probes", "--no-progress", "--reprofile", "--host", "--port",
          "--token-file", "--model")

# one definition whose help names what the command applies it to (the tokens, the target, the default seed)
PARAMETERISED_HELP = ("--max-new-tokens", "--seed", "--dram-budget", "--target-store", "--draft", "--probes", "--port",
                      "--token-file", "--model")

# (command line before the option, old spelling, new spelling, a value)
ALIASES = [
    (["bench"], "--target", "--model", "smollm2-135m"),
    (["bench"], "--new-tokens", "--max-new-tokens", "9"),
    (["profile", "--draft", "d"], "--target", "--model", "smollm2-135m"),
    (["probe", "record", "--draft", "d", "--out", "o"], "--target", "--model", "smollm2-135m"),
    (["probe", "record", "--draft", "d", "--out", "o"], "--new-tokens", "--max-new-tokens", "9"),
    (["compile-npu"], "--target", "--model", "smollm2-135m"),
    (["serve"], "--max-tokens", "--max-new-tokens", "9"),
]


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every (sub)command's parser by its command line ("probe record", ...)."""
    out = {}

    def walk(parser, prefix):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out[prefix.strip()] = parser
        for sub in subs:
            for name, child in sub.choices.items():
                walk(child, f"{prefix} {name}")
    walk(build_parser(), "")
    return out


def options_of(parser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings if a.help != argparse.SUPPRESS}


def test_shared_options_have_one_definition():
    seen: dict[str, list[tuple[str, argparse.Action]]] = {}
    for name, parser in command_parsers().items():
        for option, action in options_of(parser).items():
            if option in SHARED:
                seen.setdefault(option, []).append((name, action))
    assert {"--dtype", "--kernels", "--target-store", "--max-new-tokens"} <= set(seen)
    for option, uses in seen.items():
        first_name, first = uses[0]
        for name, action in uses[1:]:
            assert (getattr(action.type, "__qualname__", action.type) ==
                    getattr(first.type, "__qualname__", first.type)), (option, name, first_name)
            assert action.choices == first.choices, (option, name, first_name)
            if option not in PARAMETERISED_HELP:
                assert action.help == first.help, (option, name, first_name)


def test_every_numeric_option_is_bounded():
    bare = [(name, option) for name, parser in command_parsers().items()
            for option, action in options_of(parser).items() if action.type in (int, float)]
    assert bare == []


@pytest.mark.parametrize("before,old,new,value", ALIASES, ids=[f"{' '.join(a[0][:2])} {a[1]}" for a in ALIASES])
def test_old_spellings_are_hidden_aliases(before, old, new, value):
    parser = build_parser()
    dest = new.lstrip("-").replace("-", "_")
    assert getattr(parser.parse_args([*before, old, value]), dest) == getattr(parser.parse_args([*before, new, value]),
                                                                            dest)
    help_text = command_parsers()[" ".join(w for w in before if not w.startswith("-") and w in
                                           ("bench", "profile", "probe", "record", "compile-npu", "serve"))]
    assert new in help_text.format_help() and old + " " not in help_text.format_help()


def test_one_name_per_idea():
    """No command spells the target model or the token budget another way."""
    for name, parser in command_parsers().items():
        options = options_of(parser)
        assert "--target" not in options and "--new-tokens" not in options and "--max-tokens" not in options, name


@pytest.mark.real
def test_generate_ignore_eos_makes_exactly_the_tokens_asked(smollm2_path, capsys):
    argv = ["generate", "--model", str(smollm2_path), "--prompt", "Say yes.", "--max-new-tokens", "48", "--json"]
    assert main(argv) == 0
    stopped = json.loads(capsys.readouterr().out)
    assert main([*argv, "--ignore-eos"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert full["new_tokens"] == 48
    assert full["token_ids"][:stopped["new_tokens"]] == stopped["token_ids"]    # the same run, not stopped
    if stopped["new_tokens"] < 48:
        assert stopped["stop_reason"] != full["stop_reason"]
