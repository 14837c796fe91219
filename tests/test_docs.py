"""The README and docs/ hold what they claim: every fenced block is marked runnable or parse-only,
every ``alchemetric-ray`` command line in them parses with the CLI's own parser (options, and the
config keys of its ``section.key=value`` overrides), the runnable blocks run here and exit 0, and
every relative link points at a file of the repository."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from alchemetric_ray.cli import build_parser
from alchemetric_ray.config import load_config

REPO = Path(__file__).resolve().parents[1]
# docs/configuration.md is generated on another branch; links to it may point ahead of it.
GENERATED = {"docs/configuration.md"}
MARKERS = {"<!-- runnable -->": "runnable", "<!-- parse-only -->": "parse-only"}
FENCE = re.compile(r"^(\s*)```")
SHELL_STOPS = {"|", "||", "&&", ";", ">", ">>", "2>", "&"}
# Shell variables and placeholders, as a reader would fill them in.
SUBSTITUTE = {"$PWD": "/tmp/alchemetric-docs", "${PWD}": "/tmp/alchemetric-docs", "$HOME": "/tmp/home"}
# Narration that belongs in commit messages, and the machines the project was developed on.
NARRATION = re.compile(r"\bthe (?:morning|afternoon|evening|night)(?:'s)? (?:rows?|runs?)\b|\bworkspace\b|\bworktree\b"
                       r"|/work/|lab notebook", re.IGNORECASE)


def documents() -> list[str]:
    docs = sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))
    return ["README.md", *(d for d in docs if d not in GENERATED)]


@dataclass
class Block:
    doc: str
    line: int  # of the opening fence, 1-based
    marker: str | None
    lines: list[tuple[int, str]]


def blocks(doc: str) -> list[Block]:
    found, current = [], None
    lines = (REPO / doc).read_text().splitlines()
    for i, line in enumerate(lines, 1):
        if FENCE.match(line):
            if current is None:
                above = lines[i - 2].strip() if i >= 2 else ""
                current = Block(doc, i, MARKERS.get(above), [])
            else:
                found.append(current)
                current = None
        elif current is not None:
            current.lines.append((i, line))
    assert current is None, f"{doc}: the block opened at line {current.line} is never closed"
    return found


def logical_lines(numbered: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Shell lines with their continuations joined, each with the number of its first line."""
    out, start, buf = [], None, ""
    for i, line in numbered:
        if start is None:
            start = i
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        out.append((start, buf + line))
        start, buf = None, ""
    if buf:
        out.append((start, buf))
    return out


def _words(text: str) -> list[str] | None:
    for var, value in SUBSTITUTE.items():
        text = text.replace(var, value)
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return None


def cli_calls(text: str) -> list[list[str]]:
    """Every ``alchemetric-ray ARGS`` (any path to it) and ``python jobs/NAME.py ARGS`` in one shell
    line, as the argv the CLI's parser gets."""
    words = _words(text)
    calls = []
    for k, word in enumerate(words or []):
        if Path(word).name == "alchemetric-ray":
            argv = words[k + 1:]
        elif re.fullmatch(r"(?:\S*/)?python3?", word) and k + 1 < len(words) and \
                re.fullmatch(r"jobs/[a-z_]+\.py", words[k + 1]):
            argv = [Path(words[k + 1]).stem, *words[k + 2:]]
        else:
            continue
        cut = next((j for j, w in enumerate(argv) if w in SHELL_STOPS), len(argv))
        calls.append(argv[:cut])
    return calls


def inline_calls(doc: str) -> list[tuple[int, str]]:
    """``alchemetric-ray ...`` in inline code spans outside the fenced blocks (a span may wrap a line)."""
    text, kept = (REPO / doc).read_text(), []
    inside = False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            kept.append("")
        else:
            kept.append("" if inside else line)
    prose = "\n".join(kept)
    out = []
    for m in re.finditer(r"`([^`]+)`", prose):
        span = " ".join(m.group(1).split())
        command = re.match(r"(?:\S*/)?(?:alchemetric-ray [a-z]|python3? jobs/[a-z_]+\.py)", span)
        if command and not re.search(r"<\w+>|: error:", span):
            out.append((prose.count("\n", 0, m.start()) + 1, span))
    return out


def parse_problem(argv: list[str]) -> str | None:
    """None if the CLI's parser takes argv and its overrides name config keys; else why not."""
    parser = build_parser()
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            args = parser.parse_args(argv)
    except SystemExit as exit_:
        if exit_.code == 0 and ("-h" in argv or "--help" in argv):
            return None
        wrong = [w for w in argv if w.startswith("-")]
        why = (said.getvalue().strip().splitlines() or [""])[-1]
        return f"the CLI's parser refuses it (options given: {' '.join(wrong) or 'none'}): {why}"
    overrides = [o for o in args.overrides if re.fullmatch(r"[a-z_]+\.[a-z_.]+=.*", o, re.DOTALL)]
    if len(overrides) != len([o for o in args.overrides if o != "..."]):
        return f"a positional argument is not section.key=value: {args.overrides}"
    for override in overrides:
        try:
            load_config(None, [override])
        except Exception as exc:  # placeholders (YOUR-BUCKET) may fail validation; unknown keys may not
            if "unknown config key" in str(exc):
                return f"{override}: {exc}"
    return None


def test_every_fenced_block_is_marked():
    unmarked = [f"{b.doc}:{b.line}" for doc in documents() for b in blocks(doc) if b.marker is None]
    assert unmarked == [], "a fenced block needs <!-- runnable --> or <!-- parse-only --> on the line above"


def test_every_command_line_parses_with_the_cli():
    problems, checked = [], 0
    for doc in documents():
        found = []
        for b in blocks(doc):
            lines = logical_lines(b.lines)
            for k, (i, line) in enumerate(lines):
                # a line followed by the refusal it prints (`# alchemetric-ray env: error: ...`) must be refused so
                shown = lines[k + 1][1].strip() if k + 1 < len(lines) else ""
                shows_refusal = shown.startswith("# alchemetric-ray") and ": error: " in shown
                refusal = shown.split(": error: ", 1)[1] if shows_refusal else None
                found += [(i, call, refusal) for call in cli_calls(line)]
        found += [(i, call, None) for i, span in inline_calls(doc) for call in cli_calls(span)]
        for i, argv, refusal in found:
            checked += 1
            problem = parse_problem(argv)
            if refusal is not None and (problem is None or refusal not in problem):
                problems.append(f"{doc}:{i}: alchemetric-ray {shlex.join(argv)}: shows '{refusal}', got {problem}")
            elif refusal is None and problem:
                problems.append(f"{doc}:{i}: alchemetric-ray {shlex.join(argv)}: {problem}")
    assert problems == []
    assert checked >= 30  # the scan sees the command lines at all


def test_the_checker_catches_a_wrong_option_and_an_unknown_key():
    assert parse_problem(["train", "--workers", "2", "train.epochs=3"]) is None
    assert "refuses" in parse_problem(["train", "--wokers", "2"])
    assert "refuses" in parse_problem(["predict", "--resume"])
    assert "unknown config key" in parse_problem(["env", "train.btach_size=64"])
    assert cli_calls(".venv/bin/alchemetric-ray env --json | head") == [["env", "--json"]]
    assert cli_calls("ray job submit --working-dir . -- python jobs/tune.py --data s3://b/x 'tune.space={a: [1]}'") == \
        [["tune", "--data", "s3://b/x", "tune.space={a: [1]}"]]


def _runnable() -> list[tuple[str, int, str]]:
    return [(b.doc, i, line) for doc in documents() for b in blocks(doc) if b.marker == "runnable"
            for i, line in logical_lines(b.lines) if _words(line)]


def test_runnable_blocks_are_few_and_call_the_cli():
    runnable = _runnable()
    assert 1 <= len(runnable) <= 6, runnable  # the test below stays quick
    for doc, i, line in runnable:
        assert cli_calls(line), f"{doc}:{i}: a runnable line must be an alchemetric-ray command: {line}"


@pytest.mark.parametrize("doc,line,text", _runnable(), ids=lambda v: str(v)[:40])
def test_runnable_blocks_run_and_exit_0(doc, line, text, tmp_path):
    (argv,) = cli_calls(text)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "alchemetric_ray.cli", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # a loaded 2-core CI box: 3-20 s
    assert done.returncode == 0, f"{doc}:{line}: {text}\n{done.stderr[-2000:]}"
    assert list(tmp_path.iterdir()) == [], "a runnable block writes nothing"


def test_relative_links_resolve():
    broken = []
    for doc in [*documents(), *(d for d in GENERATED if (REPO / d).exists())]:
        text = (REPO / doc).read_text()
        for m in re.finditer(r"\[[^\]]*\]\(([^)\s]+)\)", text):
            target = m.group(1).split("#")[0]
            if not target or re.match(r"[a-z]+:", target):
                continue
            path = ((REPO / doc).parent / target).resolve()
            if str(path.relative_to(REPO)) in GENERATED:
                continue
            if not path.exists():
                broken.append(f"{doc}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(1)}")
    assert broken == []


def test_readme_is_the_front_door():
    readme = (REPO / "README.md").read_text().splitlines()
    assert len(readme) <= 200
    commands = [line.split("#")[0].strip() for line in readme[3:5]]
    assert readme[2] == "```bash" and commands == ["make demo", "make test"]
    assert "make test" in (REPO / ".ci" / "run").read_text()
    assert "(docs/configuration.md)" in "\n".join(readme)
    index = (REPO / "docs" / "README.md").read_text()
    for doc in documents()[1:]:
        assert f"({doc})" in "\n".join(readme), f"the README links {doc}"
        assert doc == "docs/README.md" or f"({Path(doc).name})" in index, f"docs/README.md links {doc}"


def test_no_document_narrates_or_speaks_of_the_workspace():
    hits = [f"{doc}:{i}: {line.strip()[:100]}" for doc in documents()
            for i, line in enumerate((REPO / doc).read_text().splitlines(), 1) if NARRATION.search(line)]
    assert hits == []
