#!/usr/bin/env python3
"""readme_output.py — regenerates the command output shown in README.md.

Run from the repository's root after `make` (`make readme-output` does both):

    python3 docs/readme_output.py [README.md [WORD...]]

With WORDs, only the blocks whose command contains one of them are run
(e.g. `plan` while working on the planner); the others stay as they are.

A block of README.md (indented by 4 spaces, or fenced by ```) whose output
is real rather than pasted is preceded by a marker comment:

    <!-- output -->                  the block starts with `$ CMD` (a trailing
                                     backslash continues it); the lines after
                                     the command become CMD's output
    <!-- output | FILTER -->         the same, the output piped through FILTER
                                     (a shell pipeline, e.g. to abridge it)
    <!-- output of: CMD -->          the whole block becomes CMD's output
                                     (a shell command line, pipes allowed)

Commands run with bash from the repository's root, `bin/` first on PATH,
an empty cache directory (no calibration: the FLOP rule, as on a fresh
machine), stdout and stderr together; a command that fails stops the script with its
output and README.md unchanged. The README is replaced in one rename, so it
is never half written. The examples that start with `$` also run in the
tests (tests/test_cli.c); this script only refreshes what they print.
"""
import os
import re
import subprocess
import sys
import tempfile

CACHE = tempfile.mkdtemp(prefix="bigbatch-readme-cache-")
ONLY = sys.argv[2:]
MARKER = re.compile(r"^<!-- output(?: of: (?P<of>.*?)| \| (?P<filter>.*?))? -->$")


def output_of(command):
    env = dict(os.environ, PATH=os.path.abspath("bin") + os.pathsep + os.environ.get("PATH", ""),
               BB_CACHE_DIR=CACHE)
    if os.geteuid() == 0:  # Open MPI refuses root unless told
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    print(f"readme-output: {command}", file=sys.stderr)
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"readme-output: exit {done.returncode} from: {command}\n{done.stdout}")
    return done.stdout.rstrip("\n").split("\n")


def block_end(lines, start, fenced):
    """Index after the block that starts at `start` (its first content line)."""
    i = start
    if fenced:
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        if i == len(lines):
            sys.exit(f"readme-output: line {start}: the fenced block does not end")
        return i
    while i < len(lines) and (lines[i].startswith("    ") or lines[i] == ""):
        i += 1
    while i > start and lines[i - 1] == "":  # blank lines after the block are not its own
        i -= 1
    return i


def refresh(lines, i, marker):
    """Rewrites the block after the marker at line i; returns the next line to scan."""
    j = i + 1
    while j < len(lines) and lines[j] == "":
        j += 1
    fenced = j < len(lines) and lines[j].startswith("```")
    start = j + 1 if fenced else j
    end = block_end(lines, start, fenced)
    if end == start:
        sys.exit(f"readme-output: line {i + 1}: no block follows the marker")
    indent = "" if fenced else "    "
    kept, command = [], None
    if marker.group("of"):
        command = marker.group("of")
    else:
        k = start
        if not lines[k].strip().startswith("$ "):
            sys.exit(f"readme-output: line {k + 1}: the block does not start with '$ COMMAND'")
        parts = []
        while True:
            text = lines[k].strip()
            parts.append(text[2:] if not parts else text)
            kept.append(lines[k])
            k += 1
            if not text.endswith("\\"):
                break
        command = " ".join(p[:-1].rstrip() if p.endswith("\\") else p for p in parts)
        command = re.sub(r"\s+# needs .*$", "", command)
        if marker.group("filter"):
            command = f"{{ {command}\n}} 2>&1 | {marker.group('filter')}"
    if ONLY and not any(word in command for word in ONLY):
        return -end  # left as it is
    output = [indent + line if line else "" for line in output_of(command)]
    lines[start:end] = kept + output
    return start + len(kept) + len(output)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "README.md"
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i, blocks = 0, 0
    while i < len(lines):
        marker = MARKER.match(lines[i])
        if marker:
            i = refresh(lines, i, marker)
            blocks += i > 0
            i = abs(i)
        else:
            i += 1
    fd, temp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".README.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    os.chmod(temp, 0o644)
    os.replace(temp, path)
    print(f"readme-output: {blocks} blocks of {path} refreshed", file=sys.stderr)


if __name__ == "__main__":
    main()
