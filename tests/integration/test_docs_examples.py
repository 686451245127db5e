"""The docs' examples, run as a reader would run them against a real broker: the
quickstart's command block (and its sample output, compared line by line) and every
complete Python program in quickstart.md and client.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, BrokerProcess

pytestmark = pytest.mark.integration

DOCS = REPO / "docs"


def _blocks(doc: str, lang: str) -> list[str]:
    """The fenced blocks of ``lang`` ("" for a plain block) in ``docs/doc``."""
    text = (DOCS / doc).read_text()
    return [m.group(2) for m in re.finditer(r"```(\w*)\n(.*?)```", text, re.S) if m.group(1) == lang]


def _shell(broker: BrokerProcess, line: str) -> subprocess.CompletedProcess[str]:
    """Run one doc line in bash, ``baton`` being this checkout's, pointed at ``broker``."""
    bin_dir = str(Path(sys.executable).parent)  # the venv's: its ``baton`` script
    env = {**os.environ, "BATON_BROKER": broker.address,
           "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=60)


def _shape(text: str) -> list[list[str]]:
    """Lines as lists of fields (tabs and runs of spaces alike), log lines left out."""
    return [re.split(r"\t| {2,}", line.strip()) for line in text.splitlines()
            if line.strip() and not re.match(r"\d{4}-\d\d-\d\d ", line)]


def test_the_quickstart_commands_and_their_sample_output(broker: BrokerProcess) -> None:
    (commands,) = [b for b in _blocks("quickstart.md", "sh") if "baton publish" in b]
    (sample,) = [b for b in _blocks("quickstart.md", "") if b.startswith("$ baton")]
    lines = [line for line in commands.splitlines() if line.strip()]
    publishes = [line for line in lines if line.lstrip().startswith(("baton publish", "printf"))]
    for line in publishes:
        r = _shell(broker, line)
        assert r.returncode == 0, (line, r.stderr)
    # The sample output is what those publishes leave: each "$ command" and what follows.
    for chunk in re.split(r"^\$ ", sample, flags=re.M)[1:]:
        command, _, expected = chunk.partition("\n")
        r = _shell(broker, command)
        assert r.returncode == 0, (command, r.stderr)
        assert _shape(r.stdout + r.stderr) == _shape(expected), (command, r.stdout, r.stderr)
    for line in lines:
        if line in publishes:
            continue
        r = _shell(broker, line)
        assert r.returncode == 0, (line, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr, (line, r.stderr)


@pytest.mark.parametrize(
    ("doc", "index"),
    [(doc, i) for doc in ("quickstart.md", "client.md")
     for i, b in enumerate(_blocks(doc, "python"))
     if "asyncio.run(" in b or "sync.connect(" in b],
)
def test_the_python_programs_in_the_docs_run(broker: BrokerProcess, doc: str, index: int) -> None:
    program = _blocks(doc, "python")[index].replace("127.0.0.1:5671", broker.address)
    r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    assert r.returncode == 0, (program, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
