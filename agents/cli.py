"""`llmgw ctl` commands for nodes: nodes, label, node token, cordon, uncordon."""

from __future__ import annotations

import argparse
import io
import json

from agents.node.protocol import value_shown
from facility.domains import parse_label_args
from llmgw.output import print_json, print_table, print_wrapped
from llmgw.remote import SUGGESTIONS_HEADER, lazy, listing, path_part, read, write

# A node's states, as the API's filter takes them (agents.filtersets.STATES: not imported by ctl's parser).
NODE_STATES = ("ready", "not-ready", "cordoned", "held")
# At most this many "did you mean" lines from a remote answer (a filter has at most agents.filtersets.MAX_TERMS
# terms, each one line).
MAX_SUGGESTIONS_SHOWN = 64

# Imported when first used: a remote command (llmgw.remote) never loads Django.
services = lazy("agents.services")
facility_nodes = lazy("facility.nodes")
placement_services = lazy("placement.services")
agents_filtersets = lazy("agents.filtersets")


def register(commands) -> None:
    from llmgw.ctl import output_option

    p = commands.add_parser(
        "nodes",
        help="list nodes: state, free GPUs, location; accept a change of a node's GPUs",
        description=(
            "llmgw ctl nodes                          list nodes with STATE (ready, not-ready, cordoned, held),\n"
            "                                         GPUS FREE/TOTAL and LOCATION (-o wide: its legs too)\n"
            "llmgw ctl nodes accept-inventory NODE    take the change of GPUs NODE's agent reports as its\n"
            "                                         inventory (until then placement keeps its known GPUs and\n"
            "                                         only their readings count)"
        ),
        usage="llmgw ctl nodes [--domain FILTER] [--state STATE] [-o {table,wide,json}]\n"
        "       llmgw ctl nodes accept-inventory NODE",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("words", nargs="*", metavar="accept-inventory NODE", action=NodesWords, help=argparse.SUPPRESS)
    p.add_argument(
        "--domain", metavar="FILTER",
        help="only nodes in this domain (rack:r12-07, pdu:r12-07-a), in the rack of this name (r12-07) or with "
        "this label (gpu.model=H200); several in one quoted argument: those of one level or key are any of "
        "them, different ones all hold (the console's filter)",
    )
    p.add_argument("--state", choices=NODE_STATES, help="only nodes in this state")
    output_option(p)
    p.set_defaults(handler=nodes)

    p = commands.add_parser(
        "label",
        help="set or remove a node's store labels",
        description=(
            "Set labels in the store (they win over the node's agent.yaml), or remove the store's value with KEY-.\n"
            "Location keys: llmgw.io/site, room, row, rack, pdu (a comma separated list for a dual-fed rack),\n"
            "leg (the three-phase legs drawn from, PDU.A, comma separated).\n"
            "Labels may be set before the node joins."
        ),
        epilog="example: llmgw ctl label gpu01 llmgw.io/rack=r12-07 llmgw.io/pdu=r12-07-a,r12-07-b",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("node")
    p.add_argument("labels", nargs="+", metavar="KEY=VALUE|KEY-")
    p.set_defaults(handler=label)

    p = commands.add_parser(
        "node",
        help="one node: its GPUs, how they are wired, its power; or a new token for its agent",
        description=(
            "llmgw ctl node NODE         the node: state, location, GPUs, GPU topology (as nvidia-smi topo -m\n"
            "                            shows it), measured draw and where it comes from (the BMC or GPUs + CPUs)\n"
            "llmgw ctl node token NODE   print a new token for NODE's agent (the old one stops working); put it\n"
            "                            in agent.yaml (token:) or a token_file\n"
            "llmgw ctl node show NODE    the node, for one named 'token'"
        ),
        usage="llmgw ctl node [-o {table,wide,json}] NODE\n       llmgw ctl node token NODE",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("words", nargs="+", metavar="NODE | token NODE", action=NodeWords)
    output_option(p)

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


@listing
def nodes(args) -> int:
    suggestions: list[dict] = []

    def local() -> list[dict]:
        # The filter the API and the console read (a domain, a rack's name, a label; several), read alike.
        filterset = agents_filtersets.nodes_filtered({"domain": args.domain or "", "state": args.state or ""})
        rows = [r.as_dict() for r in facility_nodes.node_rows(filterset.qs)]
        if not rows:
            suggestions.extend(filterset.suggestions())  # a term no node has: a typo, likely
        return rows

    rows = read(args, "nodes", local, domain=args.domain, state=args.state)
    remote = getattr(args, "remote", None)
    if remote is not None and not rows:
        suggestions.extend(_suggestions_read(remote.headers.get(SUGGESTIONS_HEADER.lower())))
    if args.state:  # the API's answer is filtered already; the rows read here are not
        rows = [r for r in rows if r["state"] == args.state]
    if args.output == "json":
        print_json(rows)
        return 0
    wide = args.output == "wide"
    print_table(
        ["NAME", "STATE", "GPUS FREE/TOTAL", "CONDITION", "LOCATION"],
        [[r["name"], r["state"], f"{r['gpus']['free']}/{r['gpus']['total']}", r["condition"],
          location_words(r["location"] if wide else {k: v for k, v in r["location"].items() if k != "leg"})]
         for r in rows],
        cut=("NAME", "LOCATION"), wide=wide,
    )
    for r in rows:
        for warning in r.get("warnings") or ():  # an older server's rows have none
            print_wrapped(f"warning: {r['name']}: {warning}")
    for said in suggestions:  # as the console's Nodes page says it
        matches = f" Did you mean {', '.join(said['matches'])}?" if said["matches"] else " No name is close to it."
        print_wrapped(f"warning: {said['text']}{matches}")
    return 0


def _suggestions_read(header: str | None) -> list[dict]:
    """The suggestions a remote GET /nodes sent (SUGGESTIONS_HEADER); none when absent or not their shape."""
    try:
        said = json.loads(header or "[]")
        return [
            {"text": str(s["text"]), "matches": [str(m) for m in s["matches"]]}
            for s in said if isinstance(s, dict) and isinstance(s.get("matches"), list)
        ][:MAX_SUGGESTIONS_SHOWN]
    except (ValueError, KeyError, TypeError):
        return []


def location_words(location: dict[str, str]) -> str:
    """``site=sto1 rack=r12-07`` from a node row's location (levels in order), ``-`` when nowhere."""
    return " ".join(f"{level}={value}" for level, value in location.items()) or "-"


def label(args) -> int:
    changes = parse_label_args(args.labels)

    def local() -> dict:
        changed = placement_services.labels_change(node_name=args.node, changes=changes, set_by="ctl")
        return {"node": args.node, "labels": changed.value, "warning": "; ".join(changed.warnings) or None}

    result = write(args, "POST", f"nodes/{path_part(args.node, 'node')}/labels", {"labels": changes}, local)
    shown = " ".join(f"{k}={v}" for k, v in sorted(result["labels"].items())) or "(no labels)"
    print(f"{args.node}: {shown}")
    if result.get("warning"):
        print(f"warning: {result['warning']}")
    return 0


class NodesWords(argparse.Action):
    """`nodes` (the list) or `nodes accept-inventory NODE`: sets the node and the handler as parsed."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        words = list(values or ())
        if not words:
            return
        if words[0] == "accept-inventory" and len(words) == 2:
            namespace.node, namespace.handler = words[1], inventory_accept
        else:
            namespace.usage_error = (parser, "llmgw ctl nodes lists nodes; llmgw ctl nodes accept-inventory NODE accepts one's GPUs")


def inventory_accept(args) -> int:
    def local() -> dict:
        node = services.node_inventory_accept(node_name=args.node)
        return {"node": node.name, "gpus": node.gpus.filter(present=True).count()}

    result = write(args, "POST", f"nodes/{path_part(args.node, 'node')}/inventory/accept", None, local)
    print(f"{result['node']}: its inventory of {result['gpus']} GPUs is accepted")
    return 0


class NodeWords(argparse.Action):
    """`node NODE`, `node show NODE` or `node token NODE`: sets the node and the handler as parsed, so a
    read (llmgw.remote.listing) starts as a read does."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        words = list(values)
        if words[0] in ("token", "show") and len(words) == 2:
            namespace.node, namespace.handler = words[1], node_token if words[0] == "token" else node_show
        elif len(words) == 1 and words[0] != "token":
            namespace.node, namespace.handler = words[0], node_show
        else:
            # Refused once every word is read (llmgw.ctl.parse), so `node token --help` shows the help.
            namespace.usage_error = (parser, "give a node: llmgw ctl node NODE, or llmgw ctl node token NODE")


@listing
def node_show(args) -> int:
    def local() -> dict:
        from agents.api import node_detail
        from agents.models import Node
        from llmgw.errors import NotFound

        node = Node.objects.filter(name=args.node).first()
        if node is None:
            raise NotFound(f"node {value_shown(args.node)} is not known", field="name")
        return node_detail(node)

    detail = read(args, f"nodes/{path_part(args.node, 'node')}", local)
    if args.output == "json":
        print_json(detail)
        return 0
    for line in node_lines(detail):
        print_wrapped(line)
    return 0


def node_lines(detail: dict) -> list[str]:
    """A node's detail as `llmgw ctl node NODE` prints it."""
    from llmgw.output import kw

    gpus = detail.get("gpus") or {}
    lines = [
        f"{detail['name']}  {detail['state']}  GPUs {gpus.get('free', 0)}/{gpus.get('total', 0)} free  "
        f"{location_words(detail.get('location') or {})}"
    ]
    source = detail.get("power_source")
    bmc = detail.get("bmc") or {}
    if source == "bmc":
        lines.append(f"power: {kw(detail.get('bmc_watts'))} measured by the BMC ({bmc.get('resource', 'Redfish')})")
    elif source == "gpu+cpu":
        lines.append(f"power: {kw(detail.get('measured_watts'))} measured (GPUs + CPUs)")
    else:
        lines.append("power: nothing measured")
    if bmc.get("state") == "down":
        lines.append(f"BMC down: {bmc.get('reason', '')}; the measured draw is the GPUs' and CPUs' readings")
    for warning in detail.get("warnings") or ():
        lines.append(f"warning: {warning}")
    pending = detail.get("inventory_pending") or {}
    for change in pending.get("changes") or ():
        lines.append(f"  {change}")
    topology = detail.get("gpu_topology") or {}
    links, numa = topology.get("links") or [], topology.get("numa") or []
    if links:
        lines.append("")
        headers = ["", *(f"GPU{i}" for i in range(len(links))), "NUMA"]
        rows = [
            [f"GPU{i}", *(link or "?" for link in row), "N/A" if i >= len(numa) or numa[i] is None or numa[i] < 0 else numa[i]]
            for i, row in enumerate(links)
        ]
        buffer = io.StringIO()
        print_table(headers, rows, out=buffer)
        lines += buffer.getvalue().rstrip("\n").split("\n")
    gpu_list = detail.get("gpu_list") or []
    if gpu_list:
        lines.append("")
        buffer = io.StringIO()
        print_table(
            ["GPU", "MODEL", "MEMORY", "REPLICA"],
            [
                [g["index"], g.get("model") or "-", f"{g['memory_gib']:g} GiB" if g.get("memory_gib") else "-",
                 g.get("replica_name") or g.get("replica") or ("gone" if not g.get("present", True) else "free")]
                for g in gpu_list
            ],
            out=buffer,
        )
        lines += buffer.getvalue().rstrip("\n").split("\n")
    return lines


def node_token(args) -> int:
    def local() -> dict:
        return {"node": args.node, "token": services.node_token_create(node_name=args.node)}

    data = write(args, "POST", f"nodes/{path_part(args.node, 'node')}/token", None, local)
    print(data["token"])
    return 0


def cordon(args) -> int:
    reason = getattr(args, "reason", "")

    def local() -> dict:
        changed = placement_services.cordon_change(
            node_name=args.node, cordoned=args.cordoned, reason=reason, drain=args.drain
        )
        node = changed.value
        return {"node": node.name, "cordoned": node.cordoned, "draining": node.draining,
                "warning": "; ".join(changed.warnings) or None}

    body = {"cordoned": args.cordoned, "drain": args.drain, "reason": reason}
    result = write(args, "POST", f"nodes/{path_part(args.node, 'node')}/cordon", body, local)
    state = "draining" if result["draining"] else "cordoned" if result["cordoned"] else "uncordoned"
    print(f"{result['node']} {state}")
    if result.get("warning"):  # an older server's answer has none
        print(f"warning: {result['warning']}")
    return 0
