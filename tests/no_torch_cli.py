"""Run one `lever` command in this process, then fail if torch was imported.

    python tests/no_torch_cli.py generate --model smollm2 ...
    python tests/no_torch_cli.py serve-verifier --model smollm2 ...

`serve-verifier` is served on the main thread (a free port is added when none is
given) while a second thread waits until the port accepts connections,
verifies one tree through the Python client and interrupts the server
(SIGINT, as Ctrl-C would). Exit status: the
command's, or 3 when torch (or any torch.* module) ended up in sys.modules.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time


def torch_modules() -> list[str]:
    return sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_remote_round(url: str, port: int, outcome: dict, main_done: threading.Event) -> None:
    """Wait until the server at `url` accepts connections (its Ctrl-C handling is in
    place by then), verify one two-node tree, then SIGINT this process.  The wait
    is for the port, with a safety net (waiting.deadline); should the server never
    come up, this process ends with status 4 instead of being interrupted at an
    arbitrary point of its start-up."""
    from lever.remote.client import RemoteVerifier
    from lever.tree import TokenTree
    from waiting import accepts, deadline
    stop = time.monotonic() + deadline(120)
    while not accepts("127.0.0.1", port):
        if main_done.is_set():
            return                          # the command ended (an error): nothing to interrupt
        if time.monotonic() > stop:
            print(f"no_torch_cli: the server did not listen within {deadline(120):g} s", file=sys.stderr, flush=True)
            os._exit(4)
        time.sleep(0.05)
    try:
        client = RemoteVerifier(url, retry_deadline_s=deadline(10), timeout_s=deadline(30))
        client.start([1, 2, 3, 4])
        tree = TokenTree(4)
        tree.add(0, 5, 0.0)
        verdict = client.verify(tree)
        client.close()
        outcome["next_token"] = int(verdict.next_token)
    except BaseException as e:          # reported by the main thread
        outcome["error"] = repr(e)
    finally:
        os.kill(os.getpid(), signal.SIGINT)


def main(argv: list[str]) -> int:
    from lever.cli import main as lever_main
    outcome: dict = {}
    main_done = threading.Event()
    if argv and argv[0] == "serve-verifier":
        if "--port" not in argv:
            argv = [*argv, "--port", str(free_port())]
        port = int(argv[argv.index("--port") + 1])
        threading.Thread(target=one_remote_round, args=(f"http://127.0.0.1:{port}", port, outcome, main_done),
                         daemon=True).start()
    try:
        rc = lever_main(argv)
    finally:
        main_done.set()
    if "error" in outcome:
        print(f"no_torch_cli: the remote round failed: {outcome['error']}", file=sys.stderr)
        return 4
    if argv and argv[0] == "serve-verifier" and "next_token" not in outcome:
        print("no_torch_cli: the server stopped before the remote round", file=sys.stderr)
        return 4
    loaded = torch_modules()
    if loaded:
        print(f"no_torch_cli: torch was imported: {loaded[:5]}", file=sys.stderr)
        return 3
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
