"""`llmgw ctl facility`: domains with power and holds; apply server.yaml; hold and release; budgets."""

from __future__ import annotations

import argparse
import sys

from agents.models import measured_window_seconds
from facility import services
from llmgw.output import kw, print_json, print_table
from placement import selectors as placement_selectors


def register(commands) -> None:
    from llmgw.ctl import output_option

    p = commands.add_parser(
        "facility",
        help="domains with use, limit, reserved and measured draw, and holds; apply, hold, release, budget",
        description=(
            "Without a subcommand: every domain with its nodes, use, limit, reserved and measured draw, and its hold.\n"
            "A domain's use is its other_watts plus, node by node, node_watts and the larger of what is placed\n"
            "there and what its sensors read in the last two minutes; its limit is cap × (1 − margin)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    output_option(p)
    p.set_defaults(handler=overview)
    sub = p.add_subparsers(dest="facility_command", metavar="COMMAND")

    a = sub.add_parser(
        "apply",
        help="apply server.yaml's facility: block (margin, draws, budgets)",
        description="Apply a server.yaml's facility: block. Idempotent; the file owns the budgets it names. "
        "A file with any error is refused whole, naming the line and the field.",
    )
    a.add_argument("-f", "--file", required=True, help="the server.yaml (- reads standard input)")
    a.set_defaults(handler=apply)

    h = sub.add_parser(
        "hold",
        help="place nothing new in a domain (optionally drain it)",
        description="Hold a domain: nothing new is placed on its nodes, including nodes labelled into it later.",
        epilog='example: llmgw ctl facility hold rack:r12-07 --reason "PDU swap" --drain',
    )
    h.add_argument("domain", help="level:name, e.g. rack:r12-07, pdu:r12-07-a, row:12")
    h.add_argument("--reason", required=True, help="why; shown with every refusal it causes")
    h.add_argument(
        "--drain", action="store_true", default=None, help="also move its replicas out, the replacement up first"
    )
    h.set_defaults(handler=hold)

    r = sub.add_parser("release", help="undo a hold and its drain")
    r.add_argument("domain")
    r.set_defaults(handler=release)

    c = sub.add_parser("condition", help="set a domain's thermal condition by hand (a known sensor fault), or clear it")
    csub = c.add_subparsers(dest="condition_command", metavar="COMMAND", required=True)
    cs = csub.add_parser(
        "set", help="set a domain's condition until cleared or for a while",
        epilog='example: llmgw ctl facility condition set rack:r12-07 ok --reason "probe fault" --for 2h',
    )
    cs.add_argument("domain")
    cs.add_argument("condition", choices=("ok", "warm", "hot", "unknown"))
    cs.add_argument("--reason", required=True, help="why; kept in the events and shown with the condition")
    cs.add_argument("--for", dest="duration", default=None, help="how long: 90s, 30m, 2h (default: until cleared)")
    cs.set_defaults(handler=condition_set)
    cc = csub.add_parser("clear", help="clear a condition set by hand: the evaluated one counts again")
    cc.add_argument("domain")
    cc.set_defaults(handler=condition_clear)

    e = sub.add_parser("events", help="the timeline of condition changes, newest first (kept 30 days)")
    e.add_argument("--domain", default=None, help="only this domain (rack:r12-07)")
    output_option(e)
    e.set_defaults(handler=events)

    b = sub.add_parser("budget", help="set or remove one domain's power budget")
    bsub = b.add_subparsers(dest="budget_command", metavar="COMMAND", required=True)
    s = bsub.add_parser("set", help="set a domain's cap (what one feed carries alone, derated)")
    s.add_argument("domain")
    s.add_argument("--cap-watts", type=float, required=True)
    s.add_argument(
        "--other-watts", type=float, default=None,
        help="switches, storage: what llmgw does not see (not given: kept as it is)",
    )
    s.set_defaults(handler=budget_set)
    d = bsub.add_parser("delete", help="remove a domain's budget")
    d.add_argument("domain")
    d.set_defaults(handler=budget_delete)


def overview(args) -> int:
    data = placement_selectors.facility_overview()
    if args.output == "json":
        print_json(data)
        return 0
    rows = []
    for d in data["domains"]:
        hold = d["hold"]
        hold_text = "-"
        if hold:
            drain = f" (drain: {hold['drain_text']})" if hold["drain"] else ""
            hold_text = f"held{drain}: {hold['reason']}"
        rows.append(
            [
                d["domain"],
                len(d["nodes"]),
                kw(d["use_watts"]),
                kw(d["limit_watts"]),
                kw(d["reserved_watts"]),
                kw(d["measured_watts"]),
                condition_text(d["condition"]),
                hold_text,
            ]
        )
    window = f"{measured_window_seconds() / 60:g}m"
    print_table(["DOMAIN", "NODES", "USE", "LIMIT", "RESERVED", f"MEASURED PEAK {window}", "CONDITION", "HOLD"], rows)
    for source in data.get("sources") or []:
        if not source["up"]:
            print(f"source {source['name']} down: {source['last_error']} (last success {source['last_success_at'] or 'never'})")
    for node, progress in sorted(data["node_drains"].items()):
        print(f"node {node} draining: {progress['left']} left, {progress['moving']} moving"
              + "".join(f"; {b['replica']} blocked: {b['reason']}" for b in progress["blocked"]))
    return 0


SHOWN_SIGNALS = (("inlet_temp_c", "inlet {:.1f} °C"), ("thermal_throttle_share", "{:.0%} throttling"),
                 ("cooling_alarm", "alarm {:g}"))


def condition_text(c: dict) -> str:
    """``hot (inlet 35.0 °C, 20 s old)``: the condition, its main reading and how old it is."""
    if c["condition"] == "unknown" and not c["readings"]:
        return "unknown"
    shown = [fmt.format(c["readings"][key]) for key, fmt in SHOWN_SIGNALS if key in c["readings"]]
    if c["age_seconds"] is not None:
        shown.append(f"{c['age_seconds']:.0f} s old")
    if c["overridden"]:
        shown.insert(0, "set by hand")
    mode = " observed" if c["mode"] == "observe" and c["condition"] in ("warm", "hot") else ""
    return f"{c['condition']}{mode}" + (f" ({', '.join(shown)})" if shown else "")


def condition_set(args) -> int:
    from facility.sources import parse_duration
    from llmgw.errors import InvalidInput

    seconds = None
    if args.duration is not None:
        try:
            seconds = parse_duration(args.duration)
        except ValueError as exc:
            raise InvalidInput(f"--for: {exc}", field="for") from exc
    o = services.condition_override_set(
        domain=args.domain, condition=args.condition, reason=args.reason, seconds=seconds, created_by="ctl"
    )
    until = f" until {o.until:%Y-%m-%d %H:%M}" if o.until else " until cleared"
    print(f"{o.domain} set {o.condition}{until}: {o.reason}")
    return 0


def condition_clear(args) -> int:
    services.condition_override_clear(domain=args.domain)
    print(f"{args.domain}: condition set by hand cleared")
    return 0


def events(args) -> int:
    from facility.selectors import condition_events

    domain = services.clean_domain(args.domain) if args.domain else None
    rows = condition_events(domain=domain)
    if args.output == "json":
        print_json(rows)
        return 0
    print_table(
        ["AT", "DOMAIN", "FROM", "TO", "REASON"],
        [[e["at"][:19].replace("T", " "), e["domain"], e["from"], e["to"], e["reason"] or "-"] for e in rows],
    )
    return 0


def apply(args) -> int:
    if args.file == "-":
        result = services.facility_apply(text=sys.stdin.read(), filename="<stdin>")
    else:
        result = services.facility_apply_file(path=args.file)
    print(
        f"{args.file}: applied ({result['created']} budgets created, {result['updated']} updated, "
        f"{result['removed']} removed{': ' + ', '.join(result['removed_domains']) if result['removed_domains'] else ''})"
    )
    return 0


def hold(args) -> int:
    warning = services.domain_warning(domain=args.domain)
    h = services.hold_create(domain=args.domain, reason=args.reason, drain=args.drain, created_by="ctl")
    print(f"{h.domain} held{' and draining' if h.drain else ''}: {h.reason}" + (f" ({warning})" if warning else ""))
    return 0


def release(args) -> int:
    services.hold_release(domain=args.domain)
    print(f"{args.domain} released")
    return 0


def budget_set(args) -> int:
    b = services.budget_set(domain=args.domain, cap_watts=args.cap_watts, other_watts=args.other_watts)
    print(f"{b.domain}: cap {kw(b.cap_watts)}, other {kw(b.other_watts)}")
    return 0


def budget_delete(args) -> int:
    services.budget_delete(domain=args.domain)
    print(f"{args.domain}: budget removed")
    return 0
