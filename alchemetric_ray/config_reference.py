"""The configuration reference, generated from the config's fields: ``docs/configuration.md``.

``python -m alchemetric_ray.config_reference`` prints it; ``--out docs/configuration.md`` writes it
(``make docs``).  Everything here is read from :mod:`alchemetric_ray.config`: each field's help text,
type, default and allowed values (its Literal type or its check), and the rules across fields.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alchemetric_ray.config import REFERENCE_DOC, RULES, reference, sections

HEADER = ("<!-- Generated from alchemetric_ray/config/ by `make docs` "
          "(python -m alchemetric_ray.config_reference --out docs/configuration.md): do not edit by hand. -->")

INTRO = """\
# Configuration reference

A run is configured by one typed config of the sections below.  Values come from the defaults, then a YAML file
(`--config run.yaml`, a mapping of sections to keys), then `section.key=value` overrides on the command line
(`train.lr=0.001`, `features.names=ret_1,ret_5`, `data.path=null`); later sources win.  Every value is checked
before anything runs, and a problem is reported in one line naming the key, the value and what is expected.
The named flags `--data`, `--device`, `--precision`, `--model`, `--workers` and `--resume` set the keys their
help names.

A saved model keeps the config it was trained with (`config.json` in its folder)."""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def render() -> str:
    """The whole reference as Markdown."""
    rows = reference()
    out = [HEADER, "", INTRO, "", "## Sections", ""]
    out += [f"- [`{name}`](#{name}): {summary}" for name, summary in sections()]
    for name, summary in sections():
        out += ["", f"## {name}", "", summary, "", "| Key | Type | Default | Allowed | Meaning |",
                "| --- | --- | --- | --- | --- |"]
        for row in rows:
            if row.section != name:
                continue
            if row.type == "choice":
                allowed = ", ".join(_code(value) for value in row.allowed.split(", "))
            else:
                allowed = _cell(row.allowed)
            out.append(f"| `{row.dotted}` | {row.type} | {_code(_cell(row.default))} | {allowed} | "
                       f"{_cell(row.help)} |")
    out += ["", "## Rules across keys", "",
            "Checked after every key's own check, in this order; the error names the first key of its rule.", "",
            "| Keys | Rule |", "| --- | --- |"]
    out += [f"| {', '.join(_code(key) for key in each.keys)} | {_cell(each.says)} |" for each in RULES]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alchemetric_ray.config_reference",
                                     description="Print the configuration reference (Markdown), or write it.")
    parser.add_argument("--out", type=Path, help=f"write it to this file (the repository's is {REFERENCE_DOC})")
    args = parser.parse_args(argv)
    text = render()
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}: {len(reference())} keys in {len(sections())} sections")
    return 0


if __name__ == "__main__":
    sys.exit(main())
