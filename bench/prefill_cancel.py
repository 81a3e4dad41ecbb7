"""What cancellable prefill costs and what it buys (issue 42, part 3).

    python bench/prefill_cancel.py [--model smollm2-135m] [--rounds 5] [--disconnect-rounds 3]
                                   [--json docs/results/prefill_cancel.json]

Two measurements, on one model held in DRAM, with the threads lever uses:

1. chunk cost: seconds to prefill a prompt of N tokens (512, 2048, 7500) in
   chunks of `lever serve`'s 128 tokens against the 512 tokens of
   `lever generate` (lever.autoregressive.PREFILL_CHUNK), in interleaved rounds
   (128, 512, 128, 512, ...): median, min and max, and prompt tokens/s.
2. the reproducer: `lever serve` in a child process; a streamed completion of
   a 7,500-token prompt whose client leaves after 3 s, then a 2-token request,
   timed from the disconnect to its answer (the bar: 20 s).

Prints one line per setting and writes everything to --json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from lever.autoregressive import PREFILL_CHUNK, prefill
from lever.gguf.registry import resolve_model
from lever.model.native_loader import load_gguf_native
from lever.serve.generation import SERVE_PREFILL_CHUNK

LONG_PROMPT = 7500           # tokens: most of SmolLM2's context of 8192
LEAVE_AFTER_S = 3.0          # seconds the leaving client waits before closing


def spread(values: list[float]) -> dict:
    """Median, min and max of `values` (seconds)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def chunk_cost(path: Path, lengths: list[int], rounds: int) -> list[dict]:
    """For each prompt length: prefill seconds with serve's chunks and with
    generate's, in interleaved rounds over one loaded model."""
    model, _ = load_gguf_native(path)
    rng = np.random.default_rng(0)
    rows = []
    for n in lengths:
        ids = [int(x) for x in rng.integers(100, model.config.vocab_size - 100, n)]
        seconds = {SERVE_PREFILL_CHUNK: [], PREFILL_CHUNK: []}
        for _ in range(rounds):
            for chunk in seconds:
                cache = model.new_cache(n + 1)
                t0 = time.perf_counter()
                prefill(model, ids, cache, head="argmax", pace=chunk)
                seconds[chunk].append(time.perf_counter() - t0)
        for chunk, s in seconds.items():
            row = {"prompt_tokens": n, "chunk": chunk, "seconds": spread(s),
                   "tokens_per_s": n / statistics.median(s)}
            rows.append(row)
            print(f"prefill {n:5d} tokens in chunks of {chunk:3d}: median {row['seconds']['median']:7.2f} s "
                  f"(min {row['seconds']['min']:.2f}, max {row['seconds']['max']:.2f}), "
                  f"{row['tokens_per_s']:6.0f} tok/s", flush=True)
    return rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, body: dict, timeout_s: float) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())


def wait_health(port: int, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"lever serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("lever serve did not answer /health")


def disconnect_latency(model: str, rounds: int) -> list[float]:
    """Seconds from a mid-prefill disconnect to the answer of the next 2-token request."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from lever.cli import main; sys.exit(main())",
                             "serve", "--model", model, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_health(port, proc)
        ids = [int(x) for x in np.random.default_rng(1).integers(100, 40000, LONG_PROMPT)]   # token ids
        waits = []
        for k in range(rounds):
            body = json.dumps({"model": model, "prompt": ids, "max_tokens": 2, "stream": True}).encode()
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            sock.settimeout(LEAVE_AFTER_S)
            t_sent = time.monotonic()
            head = sock.recv(64)                 # the stream's headers come before its prefill
            assert head.startswith(b"HTTP/1.1 200"), head
            time.sleep(max(0.0, LEAVE_AFTER_S - (time.monotonic() - t_sent)))
            sock.close()
            t0 = time.monotonic()
            answer = post(port, {"model": model, "prompt": "Hi", "max_tokens": 2, "temperature": 0}, 600)
            waits.append(time.monotonic() - t0)
            assert answer["usage"]["completion_tokens"] == 2, answer
            print(f"disconnect round {k + 1}: next request answered {waits[-1]:.2f} s after the client left",
                  flush=True)
        return waits
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--disconnect-rounds", type=int, default=3)
    ap.add_argument("--lengths", type=int, nargs="*", default=[512, 2048, LONG_PROMPT],
                    help="prompt lengths of the chunk-cost part (none: skip it)")
    ap.add_argument("--json", type=Path, default=Path("docs/results/prefill_cancel.json"))
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    rows = chunk_cost(resolve_model(args.model), args.lengths, args.rounds)
    waits = disconnect_latency(args.model, args.disconnect_rounds)
    print(f"disconnect mid-prefill of {LONG_PROMPT} tokens: next request median {statistics.median(waits):.2f} s "
          f"(min {min(waits):.2f}, max {max(waits):.2f}); bar 20 s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"model": args.model, "chunk_cost": rows,
                                     "disconnect_next_answer_s": spread(waits), "rounds": waits}, indent=1) + "\n")


if __name__ == "__main__":
    main()
