"""The README and docs/ hold to the code: commands that exist, links that resolve, generated
references that match their generators, and a README that fits in five minutes' reading.

Commands are checked, not run: each ``agentpark ...`` through the real CLI parser, each
``make X`` against the Makefile's targets, each ``curl`` against the OpenAPI spec's paths
and methods, each ``pip install -e '.[X]'`` against pyproject's extras. (The README's
OpenAI SDK example runs against a real vLLM in tests/vllm_real/test_vllm_serve.py.)
"""

from __future__ import annotations

import argparse
import re
import shlex
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from agentpark.api.reference import slug
from agentpark.app import create_app
from agentpark.cli import build_parser, parse_args
from agentpark.cli.docs import generated, main
from agentpark.config import Settings

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_README_LINES = 250

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*$", re.M)


# --- reading markdown ----------------------------------------------------------------------


def code_blocks(text: str, *languages: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(text) if lang in languages]


def prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return _FENCE.sub("", text)


def commands(text: str) -> Iterator[list[str]]:
    """Every simple command of the shell blocks, as words: continuations joined, comments
    dropped, split at ``&&``, ``;``, ``|`` and ``&``, leading ``NAME=value`` dropped."""
    yield from _simple_commands(block.replace("\\\n", " ") for block in code_blocks(text, "sh"))


def mentions(text: str) -> Iterator[list[str]]:
    """Inline code spans outside blocks that name an ``agentpark`` command (a synopsis like
    ``agentpark bench resume [--contexts 1024]`` or a flag like ``agentpark serve --host``)."""
    spans = re.findall(r"`([^`\n]+)`", prose(text))
    yield from _simple_commands(s for s in spans if re.match(r"(\S*/)?agentpark ", s))


def _simple_commands(sources: Iterator[str]) -> Iterator[list[str]]:
    for source in sources:
        for line in source.splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            words: list[str] = []
            for token in [*lexer, ";"]:
                if token and set(token) <= set(";&|<>"):
                    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                        words.pop(0)
                    if words:
                        yield words
                    words = []
                else:
                    words.append(token)


def anchors(text: str) -> set[str]:
    """The anchors GitHub makes for a file's headings (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for _, title in _HEADING.findall(prose(text)):
        base = slug(title)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


# --- what the code accepts ---------------------------------------------------------------


@cache
def make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text()
    return frozenset(re.findall(r"^([A-Za-z0-9_.\-/$()]+):(?!=)", text, re.M))


@cache
def spec_routes() -> frozenset[tuple[str, str]]:
    spec: dict[str, Any] = create_app(Settings.model_construct(), anonymous=True).openapi()
    return frozenset(
        (method.upper(), path) for path, item in spec["paths"].items() for method in item
    )


@cache
def extras() -> frozenset[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return frozenset(project.get("optional-dependencies", {}))


def check_command(words: list[str]) -> str | None:
    """Why a documented command does not exist, or None when it does (or is not ours)."""
    program = words[0].rsplit("/", 1)[-1]
    if program == "agentpark":
        return _check_agentpark(words[1:])
    if program == "make":
        targets = [word for word in words[1:] if "=" not in word and not word.startswith("-")]
        missing = [target for target in targets if target not in make_targets()]
        return f"no make target {missing}" if missing else None
    if program == "curl":
        return _check_curl(words[1:])
    if program == "pip" and words[1:3] == ["install", "-e"]:
        wanted = re.fullmatch(r"\.\[([\w,]+)\]", words[3]) if len(words) > 3 else None
        names = set(wanted.group(1).split(",")) if wanted else set()
        return f"no extra {sorted(names - extras())}" if names - extras() else None
    return None


def check_mention(words: list[str]) -> str | None:
    """Why an inline mention names a sub-command or a flag the CLI lacks, or None."""
    node = build_parser()
    top = dict(node._option_string_actions)  # --config, -h: before or after the command
    rest = iter(words[1:])
    for raw in rest:
        word = raw.strip("[]")
        if word == "--":
            break
        if word.startswith("-"):
            flag = word.split("=", 1)[0]
            action = node._option_string_actions.get(flag) or top.get(flag)
            if action is None:
                return f"`{' '.join(words)}`: no flag {flag}"
            if action.nargs != 0 and "=" not in word:
                next(rest, None)  # its value
            continue
        groups = [a for a in node._actions if isinstance(a, argparse._SubParsersAction)]
        if groups and word in groups[0].choices:
            node = groups[0].choices[word]
        elif groups:
            return f"`{' '.join(words)}`: no command {word!r}"
    return None


def _check_agentpark(args: list[str]) -> str | None:
    try:
        parsed = parse_args(build_parser(), args)
    except SystemExit:
        return f"the CLI refuses `agentpark {' '.join(args)}`"
    if not hasattr(parsed, "run"):
        return f"`agentpark {' '.join(args)}` names no command"
    return None


def _check_curl(args: list[str]) -> str | None:
    method = "GET"
    url = None
    words = iter(args)
    for word in words:
        if word in ("-X", "--request"):
            method = next(words).upper()
        elif word.startswith("-X") and len(word) > 2:
            method = word[2:].upper()
        elif word in ("-H", "-d", "--data", "--header", "-o"):
            next(words)
            if word in ("-d", "--data") and method == "GET":
                method = "POST"
        elif not word.startswith("-"):
            url = word
    if url is None:
        return "curl without a URL"
    path = "/" + url.split("://", 1)[-1].split("/", 1)[1] if "/" in url else "/"
    path = path.split("?", 1)[0].split("#", 1)[0]
    for known_method, template in spec_routes():
        pattern = re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape(template))
        if known_method == method and re.fullmatch(pattern, path):
            return None
    return f"no route {method} {path} in the OpenAPI spec"


def broken_links(path: Path) -> list[str]:
    text = path.read_text()
    broken = []
    for target in _LINK.findall(prose(text)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        if not destination.exists():
            broken.append(f"{target}: no file {destination}")
        elif (
            anchor
            and destination.suffix == ".md"
            and anchor not in anchors(destination.read_text())
        ):
            broken.append(f"{target}: no heading #{anchor} in {destination.name}")
    return broken


# --- the README --------------------------------------------------------------------------


def test_readme_fits_in_five_minutes() -> None:
    lines = README.read_text().count("\n")
    assert lines < MAX_README_LINES, f"README.md has {lines} lines"


def test_readme_has_the_two_setup_commands_and_the_quick_starts() -> None:
    text = README.read_text()
    found = [" ".join(words) for words in commands(text)]
    assert "make serve" in found and "make test" in found
    assert any(line.startswith("agentpark vllm serve") for line in found)
    assert any(line.startswith("curl") for line in found)
    assert any(line.startswith("pip install -e .[vllm]") for line in found)
    # The Agents SDK's tools are answered 400 without these vLLM flags.
    serve = next(line for line in found if line.startswith("agentpark vllm serve"))
    assert "--enable-auto-tool-choice --tool-call-parser hermes" in serve


def test_every_documented_command_exists() -> None:
    checked = 0
    problems = []
    for path in [README, *DOCS]:
        for words in commands(path.read_text()):
            problem = check_command(words)
            checked += words[0].rsplit("/", 1)[-1] in ("agentpark", "make", "curl")
            if problem:
                problems.append(f"{path.name}: {' '.join(words)}: {problem}")
        for words in mentions(path.read_text()):
            problem = check_mention(words)
            checked += 1
            if problem:
                problems.append(f"{path.name}: {problem}")
    assert problems == []
    assert checked >= 20, f"only {checked} commands found: is the parser still reading them?"


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("agentpark serve --no-such-flag", "refuses"),
        ("agentpark vllm start ./m", "refuses"),
        ("agentpark serve -- --port 1", "refuses"),
        ("make no-such-target", "no make target"),
        ("curl -s -XPOST localhost:8470/v1/sessions/a/sleep", "no route POST"),
        ("curl -s localhost:8470/v1/sessions/a/pause", "no route GET"),
        ("pip install -e '.[nothing]'", "no extra"),
    ],
)
def test_a_command_that_does_not_exist_is_caught(line: str, why: str) -> None:
    (words,) = list(commands(f"```sh\n{line}\n```\n"))
    problem = check_command(words)
    assert problem is not None and why in problem


@pytest.mark.parametrize(
    ("span", "why"),
    [
        ("`agentpark serve --hots`", "no flag --hots"),
        ("`agentpark bench resume [--context 1024]`", "no flag --context"),
        ("`agentpark db vacuum`", "no command 'vacuum'"),
    ],
)
def test_a_mention_that_does_not_exist_is_caught(span: str, why: str) -> None:
    (words,) = list(mentions(f"See {span}.\n"))
    problem = check_mention(words)
    assert problem is not None and why in problem


def test_commands_are_read_like_a_shell() -> None:
    text = "```sh\nA=1 B=2 agentpark serve &   # comment\nmake a && make b \\\n  c\n```\n"
    assert list(commands(text)) == [["agentpark", "serve"], ["make", "a"], ["make", "b", "c"]]


def test_python_examples_compile() -> None:
    for path in [README, *DOCS]:
        for n, block in enumerate(code_blocks(path.read_text(), "python")):
            compile(block, f"{path.name} python block {n}", "exec")


# --- links and generated references --------------------------------------------------------


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_a_broken_link_or_anchor_is_caught(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Title\n\n## A section: with (punctuation)\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-section-with-punctuation) [self](#here) [web](https://x.org/y)\n"
        "## Here\n[gone](missing.md) [bad](other.md#nowhere)\n```\n[code](not-a-link.md)\n```\n"
    )
    assert [line.split(":")[0] for line in broken_links(page)] == [
        "missing.md",
        "other.md#nowhere",
    ]


def test_generated_references_are_up_to_date() -> None:
    stale = [
        str(path.relative_to(ROOT))
        for path, text in generated(ROOT).items()
        if not path.exists() or path.read_text() != text
    ]
    assert stale == [], f"run `make docs`: {stale} differ from their generators"


def test_docs_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    (tmp_path / "deploy").mkdir()
    (tmp_path / "docs").mkdir()
    example = ROOT / "deploy" / "agentpark.example.toml"
    (tmp_path / "deploy" / "agentpark.example.toml").write_text(example.read_text())
    assert main(["--root", str(tmp_path), "--check"]) == 1  # nothing written yet
    assert main(["--root", str(tmp_path)]) == 0
    assert main(["--root", str(tmp_path), "--check"]) == 0
    api = tmp_path / "docs" / "api.md"
    api.write_text(api.read_text().replace("/v1/sessions", "/v1/session", 1))
    assert main(["--root", str(tmp_path), "--check"]) == 1


def test_configuration_reference_names_every_key() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    for name, field in Settings.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            assert f"## [{name}]" in text
            continue
        assert f"`AGENTPARK_{name.upper()}`" in text
    assert "`AGENTPARK_POOL__NUM_BLOCKS`" in text
    assert "`AGENTPARK_TIERS__SHM__CAPACITY`" in text


def test_api_reference_names_every_route() -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    for method, path in spec_routes():
        assert f"### `{method} {path}`" in text
