"""The `lever` options: one definition per option (the same type and help in
every command that has it), one name per idea (old spellings parse as hidden
aliases for one release), every numeric option bounded, generate's
--ignore-eos, the short options llama.cpp users type (-p, -n), --context and
`lever --version`."""

import argparse
import json
import math

import pytest

from lever.cli import build_parser, main

SHARED = ("--dtype", "--kernels", "--target-store", "--max-new-tokens", "--cache-dir", "--dram-budget",
          "--memory-limit", "--reader", "--prefetch-depth", "--read-queue-depth", "--read-limit", "--draft-head",
          "--temperature", "--seed", "--draft", "--probes", "--no-progress", "--reprofile", "--host", "--port",
          "--token-file", "--model", "--context")

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


def test_version_prints_the_package_version(capsys):
    from lever.values import __version__
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"lever {__version__}\n"


def test_version_from_the_command_line():
    import subprocess
    import sys
    from lever.values import __version__
    out = subprocess.run([sys.executable, "-m", "lever.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"lever {__version__}\n", "")


# short option -> the one long option it stands for, in every command that has it (as llama.cpp spells them)
SHORT = {"-p": "--prompt", "-n": "--max-new-tokens", "-h": "--help"}


def test_short_options_mean_one_thing_everywhere():
    seen = set()
    for name, parser in command_parsers().items():
        for action in parser._actions:
            for option in action.option_strings:
                if len(option) == 2:
                    assert option in SHORT and SHORT[option] in action.option_strings, (name, option,
                                                                                         action.option_strings)
                    seen.add((name, option))
            if "--max-new-tokens" in action.option_strings:
                assert "-n" in action.option_strings, name          # -n wherever --max-new-tokens is
    assert {("generate", "-p"), ("generate", "-n"), ("bench", "-n"), ("serve", "-n")} <= seen


@pytest.mark.parametrize("before,short,long,value", [
    (["generate"], "-p", "--prompt", "Say yes."),
    (["generate", "-p", "x"], "-n", "--max-new-tokens", "7"),
    (["bench"], "-n", "--max-new-tokens", "9"),
    (["serve"], "-n", "--max-new-tokens", "9"),
    (["probe", "record", "--draft", "d", "--out", "o"], "-n", "--max-new-tokens", "9"),
])
def test_short_options_parse_as_their_long_ones(before, short, long, value):
    parser = build_parser()
    dest = long.lstrip("-").replace("-", "_")
    got = getattr(parser.parse_args([*before, short, value]), dest)
    assert got == getattr(parser.parse_args([*before, long, value]), dest) and str(got) == value


def test_short_options_are_checked_like_the_long_ones():
    from lever.errors import UsageError
    with pytest.raises(UsageError, match="--max-new-tokens/-n: expected an integer"):
        build_parser().parse_args(["generate", "-p", "x", "-n", "many"])
    with pytest.raises(UsageError, match="one of the arguments --prompt/-p --prompt-file is required"):
        build_parser().parse_args(["generate", "-n", "5"])


@pytest.mark.parametrize("command", [["generate", "-p", "x"], ["serve"]])
def test_context_sizes_the_kv_cache_in_tokens(command):
    from lever.commands.limits import MAX_CONTEXT_TOKENS
    from lever.errors import UsageError
    parser = build_parser()
    assert parser.parse_args(command).context is None                     # the usual KV rule
    assert parser.parse_args([*command, "--context", "512"]).context == 512
    assert parser.parse_args([*command, "--max-context", "512"]).context == 512
    assert parser.parse_args([*command, "--context", str(MAX_CONTEXT_TOKENS)]).context == MAX_CONTEXT_TOKENS
    for bad in ("0", "-5", str(MAX_CONTEXT_TOKENS + 1), "2k", "inf"):
        with pytest.raises(UsageError, match="--context"):
            parser.parse_args([*command, "--context", bad])


def test_context_is_not_the_static_backend_contexts():
    """--context N and a static backend's --contexts LIST are two options, each parsed as itself."""
    args = build_parser().parse_args(["generate", "-p", "x", "--context", "512", "--contexts", "256,1024"])
    assert args.context == 512 and args.contexts != 512


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


NON_FINITE = ["inf", "-inf", "+inf", "nan", "-nan", "NaN", "Infinity", "-Infinity", "INF", " inf ", "1e999",
              "-1e999", "1e400MB", "infMB/s", "nanGiB"]
NUMBER_PROBES = ["0", "1", "2", "8", "64", "0.5", "1.5", "600MB", "200MB/s", "1,8"]


def parses(kind, text: str):
    """(True, value) when the option type `kind` accepts `text`, else (False, None)."""
    from lever.errors import UsageError
    try:
        return True, kind(text)
    except (argparse.ArgumentTypeError, UsageError, ValueError, TypeError):
        return False, None


def test_no_option_takes_an_infinite_or_nan_number():
    """Walk every option of every (sub)command: one whose value is a number
    (its type turns a number's text into an int or float, or keeps a list of
    them) refuses inf and NaN in every spelling; no other option turns them
    into a number that is not finite (names and paths may be spelled 'inf')."""
    numeric, checked = [], 0
    for name, parser in command_parsers().items():
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0 or action.type is None:
                continue
            checked += 1
            probes = [parses(action.type, t) for t in NUMBER_PROBES]
            is_number = any(ok and isinstance(v, (int, float)) and not isinstance(v, bool) for ok, v in probes)
            is_list = not parses(action.type, "x")[0] and parses(action.type, "1,8") == (True, "1,8")
            for text in NON_FINITE:
                ok, value = parses(action.type, text)
                where = (name, action.option_strings[0], text, value)
                if is_number or is_list:
                    assert not ok, where
                elif ok and isinstance(value, float):
                    assert math.isfinite(value), where
                else:
                    assert not ok or isinstance(value, (str, int)), where
            if is_number or is_list:
                numeric.append((name, action.option_strings[0]))
    assert checked > 100
    for expected in [("serve-verifier", "--batch-window-ms"), ("serve-verifier", "--idle-ttl"),
                     ("generate", "--temperature"), ("generate", "--top-p"), ("generate", "--timeout"),
                     ("generate", "--retry-deadline"), ("generate", "--call-cost-ms"), ("generate", "--read-limit"),
                     ("generate", "--dram-budget"), ("serve", "--header-timeout"), ("serve", "--body-timeout"),
                     ("generate", "--contexts"), ("compile-npu", "--buckets")]:
        assert expected in numeric, expected


def test_the_batch_window_is_finite(capsys):
    """Issue 35: `serve-verifier --batch-window-ms inf` was accepted ("batching rounds within inf ms")."""
    assert main(["serve-verifier", "--model", "m", "--batch-window-ms", "inf"]) == 2
    err = capsys.readouterr().err
    assert err == ("lever: error: argument --batch-window-ms: expected a number from 0 to 10000, got 'inf' "
                   "(see `lever serve-verifier --help`)\n")
