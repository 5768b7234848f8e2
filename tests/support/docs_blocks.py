"""The marked code blocks of a docs page, as one bash script (used by
tests/docs/test_tutorial and tests/install/test_wheel_install).

A fenced block is preceded by a marker line:

- ``<!-- docs-test: run -->`` before a ```` ```bash ```` block: its commands run;
- ``<!-- docs-test: file PATH -->`` before any block: its text is written to PATH.

An unmarked fenced block is an error: every block of a tested page is run or written.
"""

from __future__ import annotations

import re

MARKER = re.compile(r"^<!--\s*docs-test:\s*(run|file\s+(\S+))\s*-->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")


def marked_blocks(text: str) -> list[tuple[str, str | None, str]]:
    """``(action, path, body)`` of every fenced block of `text`, in order.

    :raises ValueError: a fenced block without a marker, a ``run`` marker on a block that
        is not bash, or an unclosed block (the message names the line).
    """
    lines = text.splitlines()
    blocks: list[tuple[str, str | None, str]] = []
    pending: tuple[str, str | None] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = MARKER.match(line)
        if marker:
            pending = ("file", marker.group(2)) if marker.group(2) else ("run", None)
            i += 1
            continue
        fence = FENCE.match(line)
        if fence:
            start = i + 1
            end = next((j for j in range(start, len(lines)) if lines[j].strip() == "```"), None)
            if end is None:
                raise ValueError(f"line {i + 1}: the fenced block is not closed")
            if pending is None:
                raise ValueError(f"line {i + 1}: fenced block without a <!-- docs-test: "
                                 "run|file PATH --> marker")
            action, path = pending
            if action == "run" and fence.group(1) != "bash":
                raise ValueError(f"line {i + 1}: a run marker needs a ```bash block, not ```{fence.group(1)}")
            blocks.append((action, path, "\n".join(lines[start:end]) + "\n"))
            pending = None
            i = end + 1
            continue
        if line.strip() and pending is not None and not line.startswith("<!--"):
            raise ValueError(f"line {i + 1}: text between a docs-test marker and its block")
        i += 1
    return blocks


def tutorial_script(text: str) -> str:
    """One bash script (``set -euo pipefail``) that writes the file blocks and runs the
    run blocks of `text`, in page order.

    :raises ValueError: as `marked_blocks`, or a file block whose text holds the heredoc
        terminator.
    """
    parts = ["set -euo pipefail", "set -x"]
    for n, (action, path, body) in enumerate(marked_blocks(text)):
        if action == "run":
            parts.append(body)
            continue
        end = f"DOCS_TEST_EOF_{n}"
        if end in body:
            raise ValueError(f"block {n} contains {end}")
        parts.append(f"mkdir -p \"$(dirname '{path}')\"\ncat > {path} <<'{end}'\n{body}{end}")
    return "\n".join(parts) + "\n"
