"""The reference pages of the docs, written from the code (docs/hooks.py calls :func:`pages` before a build).

Each page is made from what the program itself uses: the argument parsers, the OpenAPI schema, the
bound constants the readers check and the metric families and alert rules it ships — so the docs say
what the code does, whatever changed.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Where the bounds on input live; every module-level NAME = value whose name says it is a bound.
LIMIT_MODULES = (
    "agents.node.protocol",
    "placement.documents",
    "llmgw.yamldoc",
    "llmgw.jsonguard",
    "llmgw.outbound",
    "facility.services",
    "facility.serializers",
    "facility.feed_services",
    "facility.sources",
    "facility.netbox_import",
    "llmgw.plugin_names",
)
_BOUND = re.compile(r"^(MAX|MIN)_|_(MAX|MIN|BYTES|SECONDS|CHARS|DIGITS|LIMIT|DEPTH|VALUES)$|^[A-Z_]*TIMEOUT[A-Z_]*$")
METRIC_MODULES = ("facility/metrics.py", "agents/metrics.py", "placement/metrics.py")


def pages() -> dict[str, str]:
    return {"cli.md": cli_page(), "api.md": api_page(), "limits.md": limits_page(), "metrics.md": metrics_page()}


# -- CLI -----------------------------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser, prog: str) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(prog, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _subcommands(sub, f"{prog} {name}")
    return found


def cli_page() -> str:
    from django.core.management import load_command_class

    from agents.node.daemon import build_parser as agent_parser
    from llmgw.ctl import build_parser as ctl_parser

    out = [
        "# CLI reference",
        "",
        "Every command's `--help`, as the program prints it (written from its argument parsers at each "
        "docs build). Every listing takes `-o json`.",
        "",
    ]
    parsers = [("llmgw ctl", ctl_parser()), ("llmgw agent", agent_parser())]
    # The control plane's own commands are Django management commands: their parsers as `llmgw NAME --help`
    # prints them.
    for command in ("demo", "serve", "sim"):
        parsers.append((f"llmgw {command}", load_command_class("llmgw", command).create_parser("llmgw", command)))
    for prog, parser in parsers:
        for name, sub in _subcommands(parser, prog):
            sub.prog = name
            out += [f"## `{name}`", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(out)


# -- API -----------------------------------------------------------------------------------------------


def api_page() -> str:
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    out = [
        "# API reference",
        "",
        f"{schema['info']['title']} {schema['info'].get('version', '')}: every endpoint of the OpenAPI schema "
        "the server serves at `/api/v1/schema` (and `/api/v1/docs`), written from it at each docs build. "
        "Every endpoint needs a token (`Authorization: Token …`); a node's token writes only its node's "
        "heartbeat.",
        "",
        "| method | path | what | answers |",
        "| --- | --- | --- | --- |",
    ]
    for path, methods in sorted(schema["paths"].items()):
        for method, op in methods.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            codes = ", ".join(sorted(op.get("responses", {})))
            summary = (op.get("summary") or op.get("description") or "").replace("|", "\\|").replace("\n", " ")
            out.append(f"| {method.upper()} | `{path}` | {summary} | {codes} |")
    return "\n".join(out) + "\n"


# -- limits --------------------------------------------------------------------------------------------


def _comment_above(lines: list[str], lineno: int) -> str:
    words: list[str] = []
    i = lineno - 2
    while i >= 0 and lines[i].lstrip().startswith("#"):
        words.insert(0, lines[i].strip().lstrip("#").strip())
        i -= 1
    return " ".join(words)


def _shown(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"`{value!r}`"
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def limits_page() -> str:
    out = [
        "# Input limits",
        "",
        "Every bound the readers check, as the code holds it (written from the constants at each docs build), "
        "with the reason its code gives. Past one, the input is refused with a 4xx naming the field (or "
        "`error: …` and a non-zero exit in the CLI), before it costs anyone else anything.",
        "",
    ]
    for name in LIMIT_MODULES:
        module = importlib.import_module(name)
        source = Path(module.__file__).read_text()
        lines = source.splitlines()
        rows = []
        for node in ast.parse(source).body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(
                node, "target", None)
            if not isinstance(target, ast.Name) or not _BOUND.search(target.id):
                continue
            value = getattr(module, target.id, None)
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            why = _comment_above(lines, node.lineno).replace("|", "\\|")
            rows.append(f"| `{target.id}` | {_shown(value)} | {why} |")
        if rows:
            out += [f"## `{name}`", "", "| bound | value | why |", "| --- | --- | --- |", *rows, ""]
    return "\n".join(out)


# -- metrics and alert rules ---------------------------------------------------------------------------

def metric_families() -> dict[str, str]:
    """Every ``llmgw_*`` family the collectors' code names, with its help text, read from their syntax: a
    call or tuple naming the family, then its help as a string or a module constant (``THROTTLED_DOC``).
    A counter is listed as served, ``_total`` added."""
    import ast

    families: dict[str, str] = {}
    for path in METRIC_MODULES:
        tree = ast.parse((ROOT / path).read_text())
        constants = {
            target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Name)
        }

        def text(node: ast.AST, constants=constants) -> str | None:
            if isinstance(node, ast.Name) and node.id in constants:
                node = constants[node.id]
            try:
                value = ast.literal_eval(node)
            except ValueError:
                return None
            return value if isinstance(value, str) else None

        for node in ast.walk(tree):
            items = node.args if isinstance(node, ast.Call) else node.elts if isinstance(node, ast.Tuple) else []
            if not items or not isinstance(items[0], ast.Constant) or not str(items[0].value).startswith("llmgw_"):
                continue
            name = items[0].value
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "CounterMetricFamily":
                name += "_total"
            # The help: the first text after the name that is words, not a field's key (`cap_watts`).
            doc = next((t for t in map(text, items[1:]) if t and not re.fullmatch(r"[a-z_]+", t)), "")
            if doc or name not in families:
                families[name] = families.get(name) or doc
    return families


def metrics_page() -> str:
    import yaml

    families = metric_families()
    out = [
        "# Metrics and alert rules",
        "",
        "What `/metrics` serves (beside django-prometheus's own), from the collectors' code, and the alert "
        "rules shipped in `deploy/prometheus/alerts.yaml` (each unit-tested by promtool in `make test`), "
        "written from them at each docs build.",
        "",
        "## Metric families",
        "",
        "| family | what it measures |",
        "| --- | --- |",
    ]
    out += [f"| `{name}` | {doc} |" for name, doc in sorted(families.items())]
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yaml").read_text())
    out += ["", "## Alert rules", "", "| alert | severity | for | when | summary |", "| --- | --- | --- | --- | --- |"]
    for group in rules["groups"]:
        for rule in group["rules"]:
            expr = rule["expr"].replace("|", "\\|")
            summary = rule.get("annotations", {}).get("summary", "").replace("|", "\\|")
            out.append(
                f"| `{rule['alert']}` | {rule.get('labels', {}).get('severity', '')} | {rule.get('for', '0s')} "
                f"| `{expr}` | {summary} |"
            )
    return "\n".join(out) + "\n"
