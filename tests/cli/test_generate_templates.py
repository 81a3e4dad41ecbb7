"""`lever generate` with a hostile chat template in the model file: one
`lever: error:` line naming the template, well within 30 s (the render's
budget is 5 s; lever.model.chat_template)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hostile_templates import HOSTILE, hostile_gguf
from waiting import deadline


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_chat_template_is_one_error_line(name, smollm2_path, lever_cache):
    path = hostile_gguf(smollm2_path, name)
    out = subprocess.run([sys.executable, "-m", "lever.cli", "generate", "--model", str(path), "--cache-dir",
                          str(lever_cache), "--prompt", "Hi", "--max-new-tokens", "2"],
                         capture_output=True, text=True, timeout=deadline(30))
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"lever: error: the chat template of {path} ") and HOSTILE[name][1] in lines[0]
    assert out.stdout == ""


def test_no_chat_skips_the_template(smollm2_path, lever_cache):
    """--no-chat: the prompt as it is, so a broken template is no obstacle."""
    path = hostile_gguf(smollm2_path, "infinite_recursion")
    out = subprocess.run([sys.executable, "-m", "lever.cli", "generate", "--model", str(path), "--cache-dir",
                          str(lever_cache), "--prompt", "Hi", "--max-new-tokens", "2", "--no-chat"],
                         capture_output=True, text=True, timeout=deadline(60))
    assert out.returncode == 0, out.stderr
