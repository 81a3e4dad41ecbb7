"""The typed run configuration (lever.config) and the runtime that assembles a
run from it (lever.runtime): values resolved once with one-line errors, every
dtype spelling, the one KV sizing rule, parsed options never written, and the
store's manifest read once per run."""

import json
from argparse import Namespace
from dataclasses import replace
from pathlib import Path

import pytest

from lever import runtime
from lever.cli import build_parser, main
from lever.config import (DEFAULT_DRAM_BUDGET, DecodeConfig, DraftConfig, MemoryConfig, ReaderConfig, RunConfig,
                          TargetConfig)
from lever.errors import LeverError, UsageError
from lever.store.manifest import StoreManifest
from lever.values import DTYPE_NAMES

SPELLINGS = sorted({*DTYPE_NAMES, *(k.upper() for k in DTYPE_NAMES), "BFloat16", "Fp32"})


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_dtype_spelling_is_one_name(spelling):
    want = DTYPE_NAMES[spelling.lower()]
    assert TargetConfig(dtype=spelling).dtype == want
    for command in (["generate", "--prompt", "p"], ["bench"], ["profile", "--draft", "x"], ["serve"],
                    ["serve-verifier", "--model", "m"], ["probe", "record", "--draft", "x", "--out", "o"]):
        assert build_parser().parse_args([*command, "--dtype", spelling]).dtype == want


@pytest.mark.parametrize("bad", ["float16", "fp16", "int8", "", "bfloat"])
def test_a_bad_dtype_is_one_line(bad, capsys):
    with pytest.raises(UsageError) as e:
        TargetConfig(dtype=bad)
    assert "\n" not in str(e.value) and "float32" in str(e.value)
    assert main(["generate", "--dtype", bad, "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("lever: error:") and "dtype" in err


def test_configs_resolve_values_once():
    reader = ReaderConfig(prefetch_depth="4", read_limit="200MB/s")
    assert reader.prefetch_depth == 4 and reader.read_limit == 200e6 and not reader.auto_depth
    assert ReaderConfig().auto_depth
    assert MemoryConfig(limit="868MB").limit == 868_000_000
    assert MemoryConfig(dram_budget="1.5GiB").dram_budget == int(1.5 * 2**30)
    with pytest.raises(UsageError, match="exclusive"):
        MemoryConfig(limit=1, dram_budget=2)
    with pytest.raises(LeverError, match="cannot read the size"):
        MemoryConfig(limit="lots")
    with pytest.raises(LeverError):
        ReaderConfig(prefetch_depth=99)
    with pytest.raises(UsageError, match="--reader"):
        ReaderConfig(backend="mmap")
    with pytest.raises(UsageError, match="in-memory models only"):
        TargetConfig(store=Path("s"), kernels="torch")
    with pytest.raises(UsageError, match="--draft-head"):
        DraftConfig("d", head="q8")
    assert TargetConfig(store="s").store == Path("s") and TargetConfig(store="s").streamed
    assert DraftConfig("ngram").is_model is False and DraftConfig("m").is_model


def test_decode_mode_is_resolved_and_checked():
    args = build_parser().parse_args(["generate", "--prompt", "p", "--draft", "m", "--target-store", "."])
    assert DecodeConfig.from_args(args, draft="m", streamed=True).mode == "lever"
    assert DecodeConfig.from_args(args, draft="ngram", streamed=True).mode == "tree"
    assert DecodeConfig.from_args(args, draft=None, streamed=True).mode == "ar"
    args = build_parser().parse_args(["generate", "--prompt", "p", "--mode", "lever", "--draft", "ngram"])
    with pytest.raises(LeverError, match="needs a draft model"):
        DecodeConfig.from_args(args, draft="ngram", streamed=False)
    decode = DecodeConfig(mode="chain", draft_len=6)
    assert decode.tree_rows == 7 and DecodeConfig(mode="lever", lever_max_nodes=31).tree_rows == 32


def test_kv_sizing_rule():
    kv = runtime.kv_tokens
    assert kv(prompt_tokens=1024, new_tokens=128, floor=2048) == 2048
    assert kv(prompt_tokens=1024, new_tokens=4096, floor=2048) == 5120
    assert kv(prompt_tokens=1024, new_tokens=4096, floor=2048, context=4096) == 4096
    assert kv(prompt_tokens=10, new_tokens=20, extra=5) == 35
    assert kv(prompt_tokens=0, new_tokens=300, sequences=4) == 1200
    rule = runtime.kv_rule(new_tokens=100, floor=2048, in_memory=1124)
    assert rule(None, None) == 1124 and rule(object(), 1000) == 1000 and rule(object(), 8192) == 2048


def test_default_budget_and_memory_plan(tmp_path):
    config = RunConfig(target=TargetConfig(store=tmp_path))
    assert runtime.plan_memory(config, manifest=None, kv_tokens=1, tree_rows=1, sampling=False) == \
        (None, DEFAULT_DRAM_BUDGET, runtime.Headers())
    config = RunConfig(memory=MemoryConfig(dram_budget="300MB"))
    assert runtime.plan_memory(config, manifest=None, kv_tokens=1, tree_rows=1, sampling=False)[1] == 300_000_000


@pytest.mark.real
def test_build_reads_the_manifest_once(smol_store, monkeypatch):
    store = smol_store
    loads = []
    real_load = StoreManifest.load.__func__

    def counting_load(cls, path, *a, **kw):
        loads.append(Path(path))
        return real_load(cls, path, *a, **kw)

    monkeypatch.setattr(StoreManifest, "load", classmethod(counting_load))
    config = RunConfig(target=TargetConfig(store=store, dtype="bf16"), memory=MemoryConfig(dram_budget="200MB"),
                       progress=False)
    run = runtime.build(config, tree_rows=9, sampling=False, kv=runtime.kv_rule(new_tokens=16, floor=64))
    try:
        assert loads == [store]
        assert run.streamed and run.dram_budget == 200_000_000 and run.kv_tokens == 1024 + 16
        assert run.target.manifest is run.manifest and run.drafter is None and run.memory is None
    finally:
        run.close()


@pytest.mark.real
def test_generate_never_writes_the_parsed_options(smol_store, monkeypatch, capsys):
    store = smol_store
    argv = ["generate", "--target-store", str(store), "--dram-budget", "200MB", "--draft", "ngram",
            "--prompt", "ab", "--max-new-tokens", "4", "--no-chat", "--json", "--dtype", "BF16"]
    seen = {}
    real_build = runtime.build

    def spy(config, **kw):
        seen["config"] = config
        return real_build(config, **kw)

    parser_parse = build_parser().parse_args(argv)
    before = dict(vars(parser_parse))
    monkeypatch.setattr("lever.commands.generate.build", spy)
    assert parser_parse.run(parser_parse) == 0
    assert vars(parser_parse) == before                # nothing written back into the Namespace
    out = json.loads(capsys.readouterr().out)
    assert out["dtype"] == "bfloat16" and out["mode"] == "tree"
    assert seen["config"].memory.dram_budget == 200_000_000 and seen["config"].target.dtype == "bfloat16"


def test_run_config_from_args_reads_every_part():
    args = Namespace(target_store=None, model="m", dtype="fp32", kernels="native", draft="d", draft_head="q4_0",
                     reader="pread", prefetch_depth="3", read_queue_depth=8, read_limit=5e8, memory_limit=None,
                     dram_budget=None, context=None, backend="native", buckets=None, contexts=None, soc=None,
                     cache_dir="/c", no_progress=True)
    config = RunConfig.from_args(args)
    assert config.target == TargetConfig(model="m", dtype="float32")
    assert config.draft == DraftConfig("d", "q4_0")
    assert config.reader == ReaderConfig("pread", 3, 8, 5e8)
    assert config.cache_dir == "/c" and config.progress is False
    assert RunConfig.from_args(args, draft=None).draft.name is None


@pytest.mark.real
def test_each_gguf_is_parsed_once_under_a_memory_limit(smollm2_path, monkeypatch, capsys):
    """--memory-limit sizes the target and the draft from their headers; the
    loaders get those parses instead of reading the files again."""
    from lever.gguf import file as gguf_file
    parses = []
    real_init = gguf_file.GGUFFile.__init__

    def counting_init(self, path, *a, **kw):
        parses.append(Path(path))
        real_init(self, path, *a, **kw)

    monkeypatch.setattr(gguf_file.GGUFFile, "__init__", counting_init)
    assert main(["generate", "--model", str(smollm2_path), "--draft", str(smollm2_path), "--mode", "chain",
                 "--memory-limit", "2GB", "--prompt", "Hi", "--max-new-tokens", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["memory"]["plan"]
    assert parses.count(Path(smollm2_path)) == 2          # once as the target, once as the draft


# -- the verifiers the runtime makes ---------------------------------------------------

def test_connect_makes_the_verifier_of_each_engine(monkeypatch):
    """runtime.connect hands each engine's client the RemoteConfig's values
    (the clients connect on construction: recorded here, not run)."""
    from lever.config import RemoteConfig
    from lever.sampling import SamplingParams
    made = []
    monkeypatch.setattr("lever.remote.client.RemoteVerifier",
                        lambda url, params, **kw: made.append(("lever", url, kw)))
    monkeypatch.setattr("lever.remote.vllm_verifier.VllmVerifier",
                        lambda url, params, **kw: made.append(("vllm", url, kw)))
    runtime.connect(RemoteConfig("http://h:1", token="t", timeout_s=2.0, retry_deadline_s=3.0, tls_ca="ca.pem"),
                    SamplingParams(), vocab_size=50)
    runtime.connect(RemoteConfig("https://h:2", engine="vllm", model="m", branches=2), SamplingParams(),
                    vocab_size=50)
    assert made == [
        ("lever", "http://h:1", dict(token="t", retry_deadline_s=3.0, timeout_s=2.0, tls_ca="ca.pem")),
        ("vllm", "https://h:2", dict(vocab_size=50, model="m", branches=2, token=None, retry_deadline_s=30.0,
                                     timeout_s=120.0, tls_ca=None))]


@pytest.mark.parametrize("kw, message", [
    (dict(engine="sglang"), "unknown remote engine 'sglang' (choose from lever, vllm)"),
    (dict(model="m"), "--remote-model and --vllm-branches apply to --remote-engine vllm only"),
    (dict(branches=3), "--remote-model and --vllm-branches apply to --remote-engine vllm only"),
    (dict(call_cost_s=float("nan")), "the cost of a target call must be >= 0 seconds, got nan"),
])
def test_remote_config_refuses_in_one_line(kw, message):
    from lever.config import RemoteConfig
    with pytest.raises(LeverError) as e:
        RemoteConfig("http://127.0.0.1:9", **kw)
    assert str(e.value) == message


@pytest.mark.real
def test_the_run_is_where_local_verifiers_come_from(smollm2_path):
    """Run.generate and Run.speculate decode through Run.verifier (the target
    in this process), and their tokens are the target's alone."""
    from lever.engine import SpecConfig
    from lever.verify.target_pass import TargetVerifier
    config = RunConfig(target=TargetConfig(model=str(smollm2_path)), draft=DraftConfig("ngram"), progress=False)
    run = runtime.build(config, tree_rows=5, sampling=False, kv=runtime.kv_rule(new_tokens=12))
    made = []
    real = run.verifier

    def spy(params, **kw):
        made.append(real(params, **kw))
        return made[-1]

    run.verifier = spy
    decode = DecodeConfig(mode="chain", draft_len=4, max_new_tokens=12, chat=False, ignore_eos=True)
    spec = SpecConfig("chain", 4)
    out = run.generate("ab", decode, spec=spec)
    plain = run.generate("ab", replace(decode, mode="ar"))
    assert len(made) == 1 and type(made[0]) is TargetVerifier
    assert out.token_ids == plain.token_ids and len(out.token_ids) == 12
    result, stats = run.speculate(plain.result.prompt_ids, 6, decode.sampling, spec)
    assert result.token_ids == plain.token_ids[:6] and len(made) == 2 and stats.iterations >= 1


@pytest.mark.real
def test_context_sizes_the_kv_reserve_and_refuses_more(smol_store):
    from lever.errors import ContextOverflowError
    config = RunConfig(target=TargetConfig(store=smol_store), memory=MemoryConfig(dram_budget="200MB", context=40),
                       progress=False)
    run = runtime.build(config, tree_rows=1, sampling=False, kv=runtime.kv_rule(new_tokens=16, floor=2048))
    try:
        assert run.kv_tokens == 40 and run.target.kv_tokens == 40
        out = run.generate("ab", DecodeConfig(max_new_tokens=8, chat=False, ignore_eos=True))
        assert len(out.token_ids) == 8
        with pytest.raises(ContextOverflowError) as e:
            run.generate("ab", DecodeConfig(max_new_tokens=80, chat=False))
        assert str(e.value).startswith("--context 40: the prompt of ")
        assert str(e.value).endswith("; pass a larger --context or fewer new tokens")
    finally:
        run.close()


@pytest.mark.real
def test_generate_prints_the_seed_of_a_sampled_run(smollm2_path, capsys):
    argv = ["generate", "--model", str(smollm2_path), "--prompt", "Hi", "--max-new-tokens", "3", "--temperature",
            "0.8"]
    assert main(argv) == 0
    footer = capsys.readouterr().err
    seed = int(footer.split(", seed ")[1].split("]")[0])
    assert main(argv + ["--seed", str(seed), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["seed"] == seed
    assert main(["generate", "--model", str(smollm2_path), "--prompt", "Hi", "--max-new-tokens", "2"]) == 0
    assert ", seed " not in capsys.readouterr().err                   # greedy: no seed to repeat


@pytest.mark.real
def test_generate_context_option_reaches_the_kv_reserve(smol_store, capsys):
    base = ["generate", "--target-store", str(smol_store), "--dram-budget", "200MB", "--prompt", "ab", "--no-chat"]
    assert main(base + ["--context", "48", "-n", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) <= 4
    assert main(base + ["--max-context", "48", "--max-new-tokens", "60"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--context 48: the prompt of " in err[0] and "60 new tokens" in err[0]


def test_one_mode_registry_drives_the_configuration_the_loop_and_the_options():
    """lever.modes.MODES is the one list of modes: --mode's choices, the
    configuration's rows and checks, and the loop's policy all come from it."""
    import argparse

    from lever.commands.options import add_spec_options
    from lever.draft.policies import ChainPolicy, NoDraft, StaticTreePolicy
    from lever.engine import SpecConfig
    from lever.modes import MODES
    from lever.shapes import LeverLimits, TreeShape

    args = build_parser().parse_args(["generate", "--prompt", "p"])
    parser = argparse.ArgumentParser()
    add_spec_options(parser, "the mode")
    mode = next(a for a in parser._actions if a.dest == "mode")
    assert list(mode.choices) == list(MODES) == ["ar", "chain", "tree", "lever"]
    assert (args.lever_max_nodes, args.lever_max_depth, args.lever_topk) == \
        (LeverLimits.max_nodes, LeverLimits.max_depth, LeverLimits.topk)
    assert DecodeConfig().lever_limits == LeverLimits()
    assert DecodeConfig(mode="tree", tree=TreeShape(9, 2, 3)).tree_rows == 10 and DecodeConfig().tree_rows == 1
    spec = DecodeConfig(mode="chain", draft_len=3, draft_ahead=True).spec()
    assert spec == SpecConfig("chain", 3, draft_ahead=True) and isinstance(spec.tree_policy(), ChainPolicy)
    assert isinstance(DecodeConfig(mode="tree").spec().tree_policy(), StaticTreePolicy)
    assert isinstance(DecodeConfig().spec().tree_policy(), NoDraft)
    assert DecodeConfig(mode="lever").spec(mode="tree").mode == "tree"
    for name, m in MODES.items():
        if m.needs_draft:
            with pytest.raises(LeverError, match="needs --draft"):
                DecodeConfig.from_args(build_parser().parse_args(["generate", "--prompt", "p", "--mode", name]),
                                       draft=None, streamed=False)


def test_the_backend_is_part_of_the_run_configuration():
    from lever.config import BackendConfig

    args = build_parser().parse_args(["generate", "--prompt", "p", "--backend", "cpu-static", "--buckets", "1,8"])
    backend = RunConfig.from_args(args).backend
    assert backend.name == "cpu-static" and backend.buckets == "1,8" and backend.static and backend.soc is None
    assert not RunConfig().backend.static
    with pytest.raises(UsageError, match="--backend"):
        BackendConfig("npu")


@pytest.mark.parametrize("argv", [["generate", "--prompt", "p"], ["serve"], ["serve-verifier", "--model", "m"],
                                  ["bench"], ["profile", "--draft", "d"], ["probe", "record", "--draft", "d", "--out", "o"]])
def test_every_command_that_builds_a_run_has_every_run_option(argv):
    """A command that does not offer an option gets its value through the
    option's helper (commands.options, offered=False): from_args reads the
    parsed options as they are, with no fallback of its own."""
    config = RunConfig.from_args(build_parser().parse_args(argv))
    assert config.progress and config.memory.context is None and config.target.kernels == "native"
    assert config.backend.name == "native"


def test_no_fallback_default_for_a_parsed_option():
    import re

    package = Path(runtime.__file__).parent
    found = [f"{p.relative_to(package)}:{i}" for p in sorted(package.rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"getattr\(args, [^)]*,", line)]
    assert not found, "an option's default is written in commands.options only: " + ", ".join(found)
