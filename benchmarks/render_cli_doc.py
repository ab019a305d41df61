"""Regenerate docs/cli.md from the parser (tests/test_docs.py checks it is current).

.venv/bin/python benchmarks/render_cli_doc.py
"""

from __future__ import annotations

from pathlib import Path

from memfit.cli.entry import build_parser

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
INTRO = """# memfit command line

Exit codes: 0 ok, 1 a valid "does not fit" (with `--gpu`), 2 bad input. Errors are one line on
stderr starting with `memfit: error:`. Every data command takes `--json`.

"""


def render() -> str:
    parser = build_parser()
    parts = [INTRO, "## memfit\n\n```\n" + parser.format_help()]
    parts.append("```\n")
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, sp in sub.choices.items():  # type: ignore[union-attr]
        parts.append(f"\n## memfit {name}\n\n```\n{sp.format_help()}```\n")
    return "".join(parts)


if __name__ == "__main__":
    DOC.write_text(render())
    print(f"wrote {DOC}")
