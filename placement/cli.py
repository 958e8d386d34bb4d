"""`llmgw ctl` commands for models: apply, models, replicas, explain-placement, headroom, delete model."""

from __future__ import annotations

import argparse
from typing import Any

from llmgw.output import print_json, print_table, print_wrapped
from llmgw.remote import PAGE, lazy, listing, path_part, read, read_pages, write
from placement.planner import efficiency_text, gpus_text, profile_text

# Imported when first used: a remote command (llmgw.remote) never loads Django.
selectors = lazy("placement.selectors")
services = lazy("placement.services")

# How many node reasons explain-placement prints per replica; -o json has every kept one.
SHOWN_REJECTIONS = 5


def register(commands) -> None:
    from llmgw.ctl import output_option

    p = commands.add_parser(
        "apply",
        help="create or update models from a YAML file (kind: Model documents)",
        description=(
            "Create or update the models of a YAML file of kind: Model documents separated by ---.\n"
            "A file with any error is refused whole, naming the line and the field. Returns once the\n"
            "reconcile placed what fits (in the embedded default)."
        ),
        epilog="example: llmgw ctl apply -f models.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-f", "--file", required=True, help="the models.yaml")
    p.set_defaults(handler=apply)

    p = commands.add_parser(
        "models",
        help="list models: replicas placed, ready and pending, and the profile",
        description=(
            "List models: PLACED/WANTED replicas, READY and PENDING replicas, CLASS (critical, standard,\n"
            "batch), MIN (min_ready: what llmgw's own drains, shedding and capping keep ready), TOKENS/J (per\n"
            "GPU model: measured tokens per joule; -o wide adds tokens/s per replica) and PROFILE (what one\n"
            "replica needs; -o wide shows it whole)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    output_option(p)
    p.set_defaults(handler=models)

    p = commands.add_parser(
        "replicas",
        help="list replicas: state, nodes and GPUs, why pending",
        description="List replicas with STATE, NODES (node[GPUs], a CPU replica's node alone) and REASON (why "
        "it waits, or why it is being replaced).",
    )
    p.add_argument("--model", help="only this model's replicas")
    output_option(p)
    p.set_defaults(handler=replicas)

    p = commands.add_parser(
        "explain-placement",
        help="why each replica of a model is where it is, or why it waits",
        description=(
            "For each replica of MODEL: its node(s), which ordering keys chose them, and the rejections of\n"
            "the nodes ranked ahead, kept from the moment it was placed; for a pending replica, why no\n"
            "node fits, the most common reasons first."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model")
    output_option(p)
    p.set_defaults(handler=explain)

    p = commands.add_parser(
        "rules",
        help="the placement rules: every filter and scorer, built in and loaded, and whether the index keeps them",
        description=(
            "List the placement rules: each FILTER in the order it is asked (power last) and each SCORER in the\n"
            "order its key ranks (ORDER; the node's name last), with what it READS of a node (- : not said)\n"
            "and its words; a filter marked RECHECKED is asked again of the node's locked row at the commit.\n"
            "The first line says whether the index keeps its plans with them or every plan goes the plain\n"
            "way, and why (a loaded rule that does not say what it reads of a node)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    output_option(p)
    p.set_defaults(handler=rules)

    p = commands.add_parser(
        "headroom",
        help="how many more replicas of a model fit now, and why the next does not (a dry run)",
        description="How many more replicas of MODEL fit now, placed one after another as placement would, and "
        "why the next one does not (its refusal's figures are those after the ones that fit). Nothing is written.",
    )
    p.add_argument("model")
    output_option(p)
    p.set_defaults(handler=headroom)

    p = commands.add_parser("delete", help="delete a model (its replicas are stopped and their GPUs freed)")
    sub = p.add_subparsers(dest="delete_kind", metavar="KIND", required=True)
    m = sub.add_parser("model", help="delete a model and its replicas")
    m.add_argument("name")
    m.set_defaults(handler=delete_model)


def _state_counts(states: dict[str, int]) -> str:
    """``2 ready, 1 pending`` from a model's ``states`` (every replica, where its list holds the first few)."""
    return ", ".join(f"{n} {state}" for state, n in states.items()) or "no replicas"


def apply(args) -> int:
    """All the file's models or none, here or through the API (one request, one transaction there too)."""
    from llmgw.yamldoc import read_input

    filename = "<stdin>" if args.file == "-" else args.file
    text = read_input(args.file)

    def local() -> dict:
        applied = services.models_apply(text=text, filename=filename)
        return {"models": [
            {"name": a.name, "action": a.action, "warning": a.warning, "states": selectors.model_detail(a.name)["states"]}
            for a in applied
        ]}

    data = write(args, "POST", "apply", {"text": text, "filename": filename}, local)
    for m in data["models"]:
        print(f"model {m['name']} {m['action']}: {_state_counts(m['states'])}")
        if m.get("warning"):
            print(f"warning: {m['name']}: {m['warning']}")
    return 0


@listing
def models(args) -> int:
    rows = read(args, "models", lambda: selectors.model_rows())
    if args.output == "json":
        print_json(rows)
        return 0
    wide = args.output == "wide"
    print_table(
        ["NAME", "PLACED/WANTED", "READY", "PENDING", "CLASS", "MIN", "TOKENS/J", "PROFILE"],
        [
            [
                m["name"],
                f"{m['replicas']['placed']}/{m['replicas']['desired']}",
                m["replicas"]["ready"],
                m["replicas"]["pending"],
                m["class"],
                m["min_ready"],
                efficiency_text(m["efficiency"], short=not wide),
                profile_text(m["profile"]),
            ]
            for m in rows
        ],
        cut=("NAME", "TOKENS/J", "PROFILE"), wide=wide,
    )
    for m in rows:
        if m["error"]:  # under the table: its columns stay what scripts read
            print_wrapped(f"error: {m['name']}: reconcile failed at {m['error_at']}: {m['error']}")
    return 0


def shards_text(shards: list[dict[str, Any]]) -> str:
    """``gpu01[0-7] gpu02[0-7]``; a CPU shard is the node name alone."""
    return (
        " ".join(f"{s['node']}[{gpus_text(s['gpus'])}]" if s["gpus"] else s["node"] for s in shards)
        or "-"
    )


@listing
def replicas(args) -> int:
    rows = read_pages(args, "replicas", lambda: selectors.replica_rows(model=args.model), model=args.model)
    if args.output == "json":
        print_json(rows)
        return 0
    print_table(
        ["MODEL", "REPLICA", "STATE", "NODES", "REASON"],
        [[r["model"], f"#{r['ordinal']}", r["state"], shards_text(r["shards"]), r["reason"]] for r in rows],
        cut=("MODEL", "NODES", "REASON"), wide=args.output == "wide",
    )
    return 0


@listing
def explain(args) -> int:
    path = f"models/{path_part(args.model, 'model')}/explain"
    data = read(args, path, lambda: selectors.model_explain(args.model), limit=PAGE)
    # Remote, the API explains a page at a time: the rest of the replicas, page by page.
    while len(data["replicas"]) < data["replicas_total"]:
        more = read(args, path, lambda: None, limit=PAGE, offset=len(data["replicas"]))
        if not more["replicas"]:
            break  # replicas deleted meanwhile
        data["replicas"].extend(more["replicas"])
    if args.output == "json":
        print_json(data)
        return 0
    print_wrapped(
        f"{data['model']}: {data['desired']} wanted, {data['placed']} placed, {data['pending']} pending "
        f"({profile_text(data['profile'])})"
    )
    for r in data["replicas"]:
        head = f"#{r['ordinal']} {r['state']}"
        if r["state"] == "pending":
            print_wrapped(f"{head}: {r['summary']}")
        else:
            print_wrapped(f"{head} on {shards_text(r['shards'])}")
            if r.get("why"):
                print_wrapped(f"  why: {r['why']}")
            for note in r.get("notes") or []:
                print_wrapped(f"  {note}")
            if r.get("summary"):
                print_wrapped(f"  {r['summary']}")
        for c in r.get("conflicts") or []:
            print_wrapped(f"  lost a race: {c}")
        shown = r.get("rejections") or []
        for item in shown[:SHOWN_REJECTIONS]:
            print_wrapped(f"    {item['node']}: {item['reason']}")
        total = r.get("passed_over") if r["state"] != "pending" else r.get("nodes_checked")
        more = (total or len(shown)) - min(len(shown), SHOWN_REJECTIONS)
        if more > 0:
            print(f"    … and {more} more (-o json lists {max(len(shown) - SHOWN_REJECTIONS, 0)} of them)")
    return 0


def rules(args) -> int:
    data = read(args, "placement/rules", lambda: lazy("placement.explain").rules_listing())
    if args.output == "json":
        print_json(data)
        return 0
    print(f"index: {data['index']}")
    if data["loaded"]:
        print(f"plugins loaded: {', '.join(data['loaded'])}")
    for error in data["errors"]:
        print(f"plugin error: {error}")
    print_table(
        ["KIND", "ID", "ORDER", "FROM", "READS", "RECHECKED", "WORDS"],
        [
            [
                r["kind"], r["id"], "-" if r["order"] is None else str(r["order"]),
                "built in" if r["builtin"] else "loaded", ",".join(r["reads"]) if r["reads"] is not None else "-",
                "yes" if r["rechecked"] else "no", r["words"] or "-",
            ]
            for r in data["rules"]
        ],
    )
    return 0


@listing
def headroom(args) -> int:
    data = read(args, f"models/{path_part(args.model, 'model')}/headroom", lambda: selectors.model_headroom(args.model))
    if args.output == "json":
        print_json(data)
        return 0
    more = "replica fits" if data["fits"] == 1 else "replicas fit"
    bound = "at least " if data["why_not"] is None else ""
    print(f"{data['model']}: {bound}{data['fits']} more {more} (beside its {data['existing']} placed)")
    if data["why_not"]:
        print_wrapped(f"the next one does not: {data['why_not']}")
    return 0


def delete_model(args) -> int:
    def local() -> dict:
        return {"name": args.name, "replicas_removed": services.model_delete(name=args.name)}

    data = write(args, "DELETE", f"models/{path_part(args.name, 'name')}", None, local)
    removed = data["replicas_removed"]
    print(f"model {data['name']} deleted ({removed} replica{'' if removed == 1 else 's'} removed)")
    return 0
