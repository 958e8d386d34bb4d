"""`llmgw ctl` commands for nodes: nodes, label, node token, cordon, uncordon."""

from __future__ import annotations

import argparse

from agents import services
from facility import nodes as facility_nodes
from facility import services as facility_services
from facility.domains import DomainError, parse_domain
from llmgw.errors import InvalidInput
from llmgw.output import print_json, print_table


def register(commands) -> None:
    from llmgw.ctl import output_option

    p = commands.add_parser(
        "nodes",
        help="list nodes: state, free GPUs, location",
        description="List nodes with STATE (ready, not-ready, cordoned, held), GPUS (free/total) and LOCATION.",
    )
    p.add_argument("--domain", help="only nodes in this domain, e.g. rack:r12-07 or pdu:r12-07-a")
    output_option(p)
    p.set_defaults(handler=nodes)

    p = commands.add_parser(
        "label",
        help="set or remove a node's store labels",
        description=(
            "Set labels in the store (they win over the node's agent.yaml), or remove the store's value with KEY-.\n"
            "Location keys: llmgw.io/site, room, row, rack, pdu (a comma separated list for a dual-fed rack).\n"
            "Labels may be set before the node joins."
        ),
        epilog="example: llmgw ctl label gpu01 llmgw.io/rack=r12-07 llmgw.io/pdu=r12-07-a,r12-07-b",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("node")
    p.add_argument("labels", nargs="+", metavar="KEY=VALUE|KEY-")
    p.set_defaults(handler=label)

    p = commands.add_parser("node", help="node credentials: llmgw ctl node token NODE")
    sub = p.add_subparsers(dest="node_command", metavar="COMMAND", required=True)
    t = sub.add_parser(
        "token",
        help="make a new token for a node's agent (the old one stops working)",
        description="Print a new token for NODE's agent; put it in agent.yaml (token:) or a token_file.",
    )
    t.add_argument("node")
    t.set_defaults(handler=node_token)

    for name, cordoned, drain, text in (
        ("cordon", True, False, "nothing new is placed on the node"),
        ("drain", True, True, "cordon the node and move its replicas out, one at a time, the replacement up first"),
        ("uncordon", False, False, "place on the node again (stops a drain; moved replicas stay where they are)"),
    ):
        p = commands.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        p.add_argument("node")
        if cordoned:
            p.add_argument("--reason", default="", help="why, shown with the node")
        p.set_defaults(handler=cordon, cordoned=cordoned, drain=drain)


def nodes(args) -> int:
    domain = None
    if args.domain:
        try:
            domain = str(parse_domain(args.domain))
        except DomainError as exc:
            raise InvalidInput(f"--domain: {exc}", field="domain") from exc
    rows = facility_nodes.node_rows(domain=domain)
    if args.output == "json":
        print_json([r.as_dict() for r in rows])
        return 0
    print_table(
        ["NAME", "STATE", "GPUS", "CONDITION", "LOCATION"],
        [[r.name, r.state, f"{r.gpus_free}/{r.gpus_total}", r.condition, r.location_text] for r in rows],
    )
    return 0


def label(args) -> int:
    changes = services.parse_label_args(args.labels)
    warnings = facility_services.location_warnings(node_name=args.node, changes=changes)
    labels = services.labels_set(node_name=args.node, changes=changes, set_by="ctl")
    shown = " ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "(no labels)"
    print(f"{args.node}: {shown}")
    for warning in warnings:
        print(f"warning: {warning}")
    return 0


def node_token(args) -> int:
    print(services.node_token_create(node_name=args.node))
    return 0


def cordon(args) -> int:
    node = services.node_cordon(
        node_name=args.node, cordoned=args.cordoned, reason=getattr(args, "reason", ""), drain=args.drain
    )
    print(f"{node.name} {'draining' if node.draining else 'cordoned' if node.cordoned else 'uncordoned'}")
    return 0
