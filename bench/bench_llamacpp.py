"""llama.cpp's speculative decoding on the GGUF pair and prompts Lever is benchmarked on.

llama.cpp comes from the llama-cpp-python source distribution (its vendored
llama.cpp): `--build` downloads the sdist into the cache directory when it is
absent (`pip download --no-deps --no-binary llama-cpp-python`), then builds
only `llama-speculative`, `llama-simple` (plain greedy decoding),
`llama-bench` (kernel speed: bench/rows_vs_llamacpp.py), and the reference
tools bench/llamacpp_peer.py drives (`llama-completion`, `llama-tokenize`,
`llama-quantize`) with
-DGGML_NATIVE=ON -DLLAMA_CURL=OFF into CACHE/build. Each run is one prompt of
the bench prompt set (lever/bench_prompts.py), formatted with the target's
chat template as `lever bench` does, decoded greedily (--temp 0 --top-k 1).
`--memory-cap SIZE` runs each one inside a memory cgroup (RAM + page cache,
no swap, cold page cache; needs root: see lever/memory/cgroup.py). Prints one
line per run, writes JSON.

    python bench/bench_llamacpp.py --build [--cache-dir ~/.cache/lever/llamacpp]
    python bench/bench_llamacpp.py [--target qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b]
                                   [--prompts 6] [--new-tokens 64] [--draft-max 8] [--threads 2]
                                   [--memory-cap 1.2GB] [--plain] [--out bench/results]

Memory: llama.cpp mmaps both GGUFs (file pages, reclaimable under a cap, read
back as major faults) and by default repacks Q4_0-family weights into
anonymous buffers for its CPU kernels (not reclaimable): add `--extra
--no-repack` (--extra takes the rest of the command line) to compare against
weights used in place.

Figures per run: decode tokens/s as llama.cpp reports it (prefill excluded),
n_drafted / n_accept (speculative), the child's wall time (s), peak memory
(bytes: the cgroup's peak with a cap, the child's peak RSS without) and
major page faults.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lever.bench_prompts import load_prompts
from lever.commands.bench_report import machine_info
from lever.errors import LeverError
from lever.memory import cgroup
from lever.values import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from llamacpp_source import DEFAULT_CACHE, SDIST, SDIST_VERSION, llama_source  # noqa: E402,F401  (the sdist: download, unpack)

TARGETS = ("llama-speculative", "llama-simple", "llama-bench", "llama-completion", "llama-tokenize",
           "llama-quantize")
# GGML_NATIVE compiles for this CPU (AVX2 / AVX-512 VNNI / its own repacked
# int8 GEMM), except AMX: on CPUs with AMX (Sapphire Rapids guests) ggml's AMX
# matmul segfaulted in llama-bench at pp >= 4 (2026-12-05), and Lever has no
# AMX kernels, so both engines use the same vector instructions.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CMAKE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_TOOLS=ON",
                 f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}")


# -- build -------------------------------------------------------------------

def build(cache: Path, jobs: int) -> dict[str, Path]:
    """Configure and build TARGETS into cache/build (nice'd), printing one
    progress line; returns the binaries."""
    src, out = llama_source(cache), cache / "build"
    nice = ["nice", "-n", "10"]
    subprocess.run(nice + ["cmake", "-S", str(src), "-B", str(out), *CMAKE_OPTIONS], check=True,
                   stdout=subprocess.DEVNULL)
    cmd = nice + ["cmake", "--build", str(out), "--config", "Release", "-j", str(jobs), "--target", *TARGETS]
    log = out / "build.log"
    t0 = time.perf_counter()
    with open(log, "w") as f, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                               text=True, errors="replace") as p:
        for line in p.stdout:
            f.write(line)
            m = re.match(r"\[\s*(\d+)%\]", line)
            if m:
                print(f"\rbuilding llama.cpp: {m.group(1):>3}% ({time.perf_counter() - t0:,.0f} s)",
                      end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    if p.returncode:
        raise LeverError(f"the llama.cpp build failed (exit {p.returncode}); see {log}")
    found = binaries(out)
    missing = [t for t in TARGETS if found[t] is None]
    if missing:
        raise LeverError(f"the build finished but {', '.join(missing)} is missing under {out}/bin")
    return found


def binaries(build_dir: Path) -> dict[str, Path | None]:
    """Each of TARGETS under build_dir/bin, None when absent."""
    return {t: (build_dir / "bin" / t) if os.access(build_dir / "bin" / t, os.X_OK) else None for t in TARGETS}


# -- parsing llama.cpp's output ---------------------------------------------------

_SPEC = {"n_draft": r"n_draft\s*=\s*(\d+)", "n_predict": r"n_predict\s*=\s*(\d+)",
         "n_drafted": r"n_drafted\s*=\s*(\d+)", "n_accept": r"n_accept\s*=\s*(\d+)"}
_DECODED = r"decoded\s+(\d+)\s+tokens in\s+([0-9.]+)\s+s(?:econds)?, speed:\s+([0-9.]+|inf|nan) t/s"
_ENCODED = r"encoded\s+(\d+)\s+tokens in\s+([0-9.]+)\s+seconds, speed:\s+([0-9.]+|inf|nan) t/s"


def parse_timings(text: str) -> dict:
    """The figures llama-speculative / llama-simple print: decoded tokens,
    decode seconds and tokens/s, prompt tokens and seconds (speculative), and
    n_draft, n_predict, n_drafted, n_accept (speculative). Missing ones are absent."""
    out: dict = {}
    m = re.search(_DECODED, text)
    if m:
        out.update(decoded_tokens=int(m.group(1)), decode_s=float(m.group(2)), tokens_per_s=float(m.group(3)))
    m = re.search(_ENCODED, text)
    if m:
        out.update(prompt_tokens=int(m.group(1)), prefill_s=float(m.group(2)))
    for key, pattern in _SPEC.items():
        m = re.search(pattern, text)
        if m:
            out[key] = int(m.group(1))
    if out.get("n_drafted"):
        out["accept_rate"] = out["n_accept"] / out["n_drafted"]
    return out


# -- runs --------------------------------------------------------------------

def commands(bins: dict, target: Path, draft: Path, prompt_file: Path, args) -> dict[str, list[str]]:
    """argv of each mode for one prompt (greedy)."""
    out = {"speculative": [str(bins["llama-speculative"]), "-m", str(target), "-md", str(draft),
                           "-f", str(prompt_file), "-n", str(args.new_tokens), "-c", str(args.context),
                           "--temp", "0", "--top-k", "1", "-s", "0", "--spec-draft-n-max", str(args.draft_max),
                           "-t", str(args.threads), "-td", str(args.threads), "-ngl", "0", "-ngld", "0",
                           *args.extra]}
    if args.plain:
        # llama-simple takes the prompt as argv and uses its own greedy sampler and thread default
        out["plain"] = [str(bins["llama-simple"]), "-m", str(target), "-n", str(args.new_tokens), "-ngl", "0",
                        prompt_file.read_text(encoding="utf-8")]
    return out


def run(cmd: list[str], cap: int | None, timeout_s: float) -> cgroup.RunResult:
    if cap:
        return cgroup.run_capped(cmd, cap, timeout_s=timeout_s)
    return cgroup.run_uncapped(cmd, timeout_s=timeout_s)


def formatted_prompts(target: Path, prompts: list[dict], chat: bool) -> list[str]:
    """Each prompt's text as the target sees it (its chat template unless `chat` is False)."""
    if not chat:
        return [p["text"] for p in prompts]
    from lever.gguf.file import GGUFFile
    from lever.model.tokenizer import Tokenizer
    tok = Tokenizer.from_gguf(GGUFFile(target))
    return [tok.format_prompt(p["text"], chat=True) for p in prompts]


def line(mode: str, prompt: dict, r: cgroup.RunResult, t: dict) -> str:
    speed = f"{t['tokens_per_s']:7.2f} tok/s" if "tokens_per_s" in t else "      - tok/s"
    spec = (f"  drafted {t['n_drafted']:4d} accepted {t['n_accept']:4d} ({100 * t.get('accept_rate', 0):5.1f}%)"
            if "n_drafted" in t else "")
    flags = (" OOM-KILLED" if r.oom_killed else "") + (" TIMED-OUT" if r.timed_out else "")
    if r.rc and not flags:
        last = [x for x in r.stderr_tail.splitlines() if x.strip()]
        flags = f"  ({last[0] if last and 'error' in last[0].lower() else (last[-1] if last else 'no output')})"
    return (f"{mode:<11} {prompt['id']:<22} {t.get('decoded_tokens', 0):4d} tok {speed}{spec}  "
            f"wall {r.wall_s:7.2f} s  peak {r.peak_bytes / 1e6:8,.1f} MB  majflt {r.major_faults:7d}  "
            f"rc {r.rc}{flags}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="store_true", help="download (if needed) and build llama.cpp, then exit "
                                                         "unless --run is given too")
    ap.add_argument("--run", action="store_true", help="with --build: run the benchmark after building")
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE,
                    help="where the sdist and CACHE/build live ($LEVER_LLAMACPP_DIR)")
    ap.add_argument("--jobs", type=int, default=max(1, os.cpu_count() or 1))
    ap.add_argument("--target", default="qwen2.5-coder-1.5b", help="registered model name or GGUF path")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", help="registered model name or GGUF path")
    ap.add_argument("--prompt-set", default="v1")
    ap.add_argument("--prompts", type=int, default=6, help="first N prompts of the set")
    ap.add_argument("--categories", nargs="*", default=None)
    ap.add_argument("--raw", action="store_true", help="no chat template")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--draft-max", type=int, default=8, help="llama.cpp --spec-draft-n-max (tokens per draft)")
    ap.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1))
    ap.add_argument("--plain", action="store_true", help="also run llama-simple (plain greedy decoding)")
    ap.add_argument("--memory-cap", default=None, help="run each in a memory cgroup of SIZE (e.g. 1.2GB)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                    help="further llama-speculative arguments (e.g. --extra --no-mmap)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument("--stem", default="llamacpp_speculative")
    args = ap.parse_args(argv)

    build_dir = args.cache_dir / "build"
    if args.build:
        bins = build(args.cache_dir, args.jobs)
        print("built: " + ", ".join(str(p) for p in bins.values()))
        if not args.run:
            return 0
    bins = binaries(build_dir)
    needed = ["llama-speculative"] + (["llama-simple"] if args.plain else [])
    missing = [t for t in needed if bins[t] is None]
    if missing:
        print(f"llama.cpp binaries not built: {', '.join(missing)} absent from {build_dir}/bin "
              f"(build them with: python {sys.argv[0]} --build --cache-dir {args.cache_dir})", file=sys.stderr)
        return 1
    cap = parse_size(args.memory_cap) if args.memory_cap else None
    if cap:
        cgroup.find_controller()                  # fail now, with the reason, not after the first prompt

    from lever.gguf.registry import resolve_model
    target, draft = resolve_model(args.target), resolve_model(args.draft)
    prompts = load_prompts(args.prompt_set, args.categories, args.prompts)
    texts = formatted_prompts(target, prompts, chat=not args.raw)
    runs = []
    with tempfile.TemporaryDirectory(prefix="lever-llamacpp-") as tmp:
        for prompt, text in zip(prompts, texts):
            pf = Path(tmp) / f"{prompt['id'].replace('/', '_')}.txt"
            pf.write_text(text, encoding="utf-8")
            for mode, cmd in commands(bins, target, draft, pf, args).items():
                r = run(cmd, cap, args.timeout)
                t = parse_timings(r.stdout_tail + "\n" + r.stderr_tail)
                print(line(mode, prompt, r, t), flush=True)
                result = r.to_dict()
                result["cmd"] = [a if a != text else "<prompt text>" for a in result["cmd"]]
                runs.append({"mode": mode, "prompt_id": prompt["id"], "category": prompt["category"],
                             **t, **{k: v for k, v in result.items() if k not in ("stdout_tail",)},
                             "stderr_tail": r.stderr_tail[-2000:]})
    report = {"tool": "llama.cpp", "llama_cpp_python_sdist": SDIST_VERSION, "build_dir": str(build_dir),
              "target": str(target), "draft": str(draft), "prompt_set": args.prompt_set,
              "chat_template": not args.raw, "new_tokens": args.new_tokens, "draft_max": args.draft_max,
              "threads": args.threads, "memory_cap_bytes": cap, "greedy": True,
              "machine": machine_info(), "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.stem}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LeverError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
