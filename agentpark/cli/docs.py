"""``python -m agentpark.cli.docs [--check]``: write (or check) the generated references,
docs/configuration.md from the settings models and docs/api.md from the app's OpenAPI spec.

Run from a checkout (``make docs``): the configuration reference also reads
deploy/agentpark.example.toml for the prose of keys whose model has no description.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from agentpark.api.reference import render_api
from agentpark.app import create_app
from agentpark.config import Settings
from agentpark.config.reference import render_configuration

__all__ = ["generated", "main"]

EXAMPLE = Path("deploy") / "agentpark.example.toml"


def generated(root: Path) -> dict[Path, str]:
    """Each generated file under ``root`` (a checkout) and the text it must hold."""
    example = (root / EXAMPLE).read_text()
    # The spec of a loopback daemon with defaults: the one `make serve` serves.
    spec = create_app(Settings.model_construct(), anonymous=True).openapi()
    return {
        root / "docs" / "configuration.md": render_configuration(example),
        root / "docs" / "api.md": render_api(spec),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentpark.cli.docs", description=__doc__)
    parser.add_argument("--root", type=Path, default=Path(), help="the checkout (default .)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a file differs")
    args = parser.parse_args(argv)
    stale = []
    for path, text in generated(args.root).items():
        if path.exists() and path.read_text() == text:
            continue
        if args.check:
            stale.append(str(path))
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date (run make docs): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
