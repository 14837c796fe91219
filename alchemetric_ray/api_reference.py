"""The Python API's reference, generated from the docstrings: the part of ``docs/python.md`` below its
marker line.

``python -m alchemetric_ray.api_reference`` prints that part; ``--out docs/python.md`` writes it into
the page below the marker, keeping the walk-through above it.  Everything here is read from the
package: every name in ``alchemetric_ray.__all__`` (each function's signature and docstring, each
error class's bases and the first sentence of its docstring) and the classes the functions return.
``tests/test_api_reference.py`` fails when the committed page is stale.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path

PAGE = "docs/python.md"
MARKER = ("<!-- The API reference below is generated from the docstrings by "
          "`python -m alchemetric_ray.api_reference --out docs/python.md`: do not edit it by hand. -->")
SIGNATURE_WIDTH = 100  # a longer signature is shown one parameter a line
ROLE = re.compile(r":(?:class|func|meth|attr|mod|exc|data):`(~?)([^`]+)`")


def public_names() -> list[str]:
    import alchemetric_ray as ar

    return list(ar.__all__)


def markdown(doc: str) -> str:
    """A docstring as Markdown: reST roles and double backquotes become code spans."""

    def role(match: re.Match) -> str:
        tilde, target = match.groups()
        return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"

    return re.sub(r"``(.+?)``", r"`\1`", ROLE.sub(role, doc), flags=re.DOTALL)


def _annotation(value) -> str:
    return value if isinstance(value, str) else inspect.formatannotation(value)


def signature(name: str, function) -> str:
    """``ar.name(param: type = default, *, ...) -> type``, one parameter a line where it is long."""
    sig = inspect.signature(function)
    params, star = [], False
    for p in sig.parameters.values():
        text = p.name
        if p.kind is p.VAR_POSITIONAL:
            text, star = f"*{text}", True
        elif p.kind is p.VAR_KEYWORD:
            text = f"**{text}"
        elif p.kind is p.KEYWORD_ONLY and not star:
            params.append("*")
            star = True
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {p.default!r}" if p.annotation is not p.empty else f"={p.default!r}"
        params.append(text)
    returns = "" if sig.return_annotation is sig.empty else f" -> {_annotation(sig.return_annotation)}"
    line = f"ar.{name}({', '.join(params)}){returns}"
    if len(line) <= SIGNATURE_WIDTH:
        return line
    return f"ar.{name}(\n" + "".join(f"    {p},\n" for p in params) + f"){returns}"


def _own_doc(obj) -> str | None:
    """The object's own docstring (a class without one does not inherit its base's here)."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    return inspect.cleandoc(doc) if doc else None


def first_sentence(doc: str) -> str:
    text = " ".join(doc.split("\n\n", 1)[0].split())
    end = re.search(r"\.(?:\s|$)", text)
    return text[: end.start() + 1] if end else text


def _function(name: str, function) -> list[str]:
    doc = _own_doc(function)
    if not doc:
        raise ValueError(f"ar.{name} has no docstring: the reference is made from it")
    return [f"### `ar.{name}`", "", "<!-- parse-only -->", "```python", signature(name, function), "```", "",
            markdown(doc), ""]


def _error_row(name: str, cls) -> str:
    bases = ", ".join(f"`{b.__name__}`" for b in cls.__bases__)
    doc = _own_doc(cls)
    says = markdown(first_sentence(doc)).replace("|", "\\|") if doc else ""
    return f"| `ar.{name}` | {bases} | {says} |"


def _returned() -> list[type]:
    """The classes the calls return, in the order of the calls."""
    from alchemetric_ray.api.evaluation import Evaluation
    from alchemetric_ray.api.jobs import Job
    from alchemetric_ray.api.model import Model
    from alchemetric_ray.api.results import Shards, SweepResult, TrainResult

    return [Shards, TrainResult, SweepResult, Model, Evaluation, Job]


# How a result is built, saved and shown (``result.json``, the repr): the package's own business.
MACHINERY = {"of", "record", "from_record", "from_live", "shown", "line", "lines"}


def _members(cls) -> list[str]:
    """The result's fields, then its public properties and methods, each with the first sentence of its
    docstring (inherited ones included, the saving and display machinery left out)."""
    import dataclasses

    fields = dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ()
    rows = [f"- `.{f.name}`: `{_annotation(f.type)}`" for f in fields if not f.name.startswith("_")]
    seen = {f.name for f in fields}
    for klass in cls.__mro__[:-1]:
        for name, member in vars(klass).items():
            if name.startswith("_") or name in MACHINERY or name in seen:
                continue
            seen.add(name)
            target = member.fget if isinstance(member, property) else member
            target = target.__func__ if isinstance(target, (classmethod, staticmethod)) else target
            if not callable(target):
                continue
            doc = _own_doc(target)
            call = name if isinstance(member, property) else f"{name}()"
            rows.append(f"- `.{call}`" + (f": {markdown(first_sentence(doc))}" if doc else ""))
    return rows


def render() -> str:
    """The generated part of the page, from its marker line to the end."""
    import alchemetric_ray as ar

    names = public_names()
    functions = [n for n in names if inspect.isfunction(getattr(ar, n))]
    errors = [n for n in names if inspect.isclass(getattr(ar, n)) and issubclass(getattr(ar, n), BaseException)]
    others = [n for n in names if n not in functions and n not in errors]
    out = [MARKER, "", "## Reference", "",
           f"Every name in `alchemetric_ray.__all__`: {len(functions)} functions and {len(errors)} error classes"
           f"{' and ' + ', '.join(f'`{n}`' for n in others) if others else ''}.  These are the stable surface; "
           "every other module and name of the package is internal and may change.", "",
           "### Functions", ""]
    out += [f"- [`ar.{n}`](#ar{n.replace('_', '')})" for n in functions]
    out.append("")
    for name in functions:
        out += _function(name, getattr(ar, name))
    out += ["### What the calls return", "",
            "Not importable names: the objects the calls above return (and `ar.load_result` rebuilds from a saved "
            "`result.json`).  Each shows itself in one screen of text and as an HTML table in a notebook.", ""]
    for cls in _returned():
        doc = _own_doc(cls)
        out += [f"#### `{cls.__name__}`", "", markdown(doc) if doc else "", "", *_members(cls), ""]
    out += ["### Errors", "",
            "Every error that is the user's to fix is an `ar.UserError` whose message is one line (the line the "
            "command line prints), except `ar.Interrupted`, a `KeyboardInterrupt` so that an `except Exception` "
            "does not swallow it.", "",
            "| class | bases | what it means |", "| --- | --- | --- |"]
    out += [_error_row(name, getattr(ar, name)) for name in errors]
    if "__version__" in others:
        out += ["", f"`ar.__version__`: the package's version (`{ar.__version__}` here)."]
    return "\n".join(out).rstrip("\n") + "\n"


def page(current: str) -> str:
    """``current`` (the page) with everything from its marker line on replaced by :func:`render`."""
    head, found, _ = current.partition(MARKER)
    if not found:
        raise SystemExit(f"{PAGE}: no marker line; the generated reference goes below this line:\n{MARKER}")
    return head + render()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alchemetric_ray.api_reference",
                                     description="Print the Python API reference (Markdown), or write it into "
                                                 "the page below its marker line.")
    parser.add_argument("--out", type=Path, help=f"the page to write it into (the repository's is {PAGE})")
    args = parser.parse_args(argv)
    if args.out is None:
        sys.stdout.write(render())
        return 0
    args.out.write_text(page(args.out.read_text() if args.out.exists() else ""))
    print(f"wrote {args.out}: {len(public_names())} public names")
    return 0


if __name__ == "__main__":
    sys.exit(main())
