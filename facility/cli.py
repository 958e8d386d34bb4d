"""`llmgw ctl facility`: domains with power and holds; apply server.yaml; hold and release; budgets.

Kept in one module: `ctl facility` is one command tree; each command's handler sits beside its
parser, and every handler has its local (services) and remote (API) path in one place.
"""

from __future__ import annotations

import argparse
import sys

from facility.import_progress import ACTIVE_STATES, job_progress_text  # pure: a remote ctl loads no Django
from llmgw.errors import Conflict, InvalidInput
from llmgw.output import kw, print_json, print_table, print_wrapped
from llmgw.remote import lazy, listing, path_part, read, write

# Imported when first used: a remote command (llmgw.remote) never loads Django.
feed_selectors = lazy("facility.feed_selectors")
services = lazy("facility.services")
placement_selectors = lazy("placement.selectors")
placement_services = lazy("placement.services")


def register(commands) -> None:
    from llmgw.ctl import output_option

    p = commands.add_parser(
        "facility",
        help="domains with use, limit, condition, holds and where each cap comes from; apply, hold, release, budget",
        description=(
            "Without a subcommand: every domain with its nodes, use, limit, condition, hold and SOURCE (where its\n"
            "cap comes from); -o wide adds the reserved and measured draw and every reading of the condition.\n"
            "A domain's use is its other_watts plus, node by node, node_watts and the larger of what is placed\n"
            "there and the highest its sensors read in the measured window (server.yaml's\n"
            "facility.measured_window, else LLMGW_MEASURED_WINDOW_SECONDS; 15 minutes by default);\n"
            "its limit is cap × (1 − margin).\n"
            "RESERVED is the draw placed there; MEASURED PEAK what its nodes read, each without node_watts\n"
            "or other_watts (so they may sum to less than USE). A domain past its limit is named under the table."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    output_option(p)
    p.set_defaults(handler=overview)
    sub = p.add_subparsers(dest="facility_command", metavar="COMMAND")

    a = sub.add_parser(
        "apply",
        help="apply server.yaml's facility: block (margin, draws, budgets, feeds)",
        description="Apply a server.yaml's facility: block. Idempotent; the file owns the budgets it names. "
        "A file with any error is refused whole, naming the line and the field.",
    )
    a.add_argument("-f", "--file", required=True, help="the server.yaml (- reads standard input)")
    a.add_argument(
        "--yes", action="store_true",
        help="apply it even though it removes budgets or feeds an earlier file set (without it such a file is "
        "refused, naming every one)",
    )
    a.set_defaults(handler=apply)

    h = sub.add_parser(
        "hold",
        help="place nothing new in a domain (optionally drain it)",
        description="Hold a domain: nothing new is placed on its nodes, including nodes labelled into it later.",
        epilog='example: llmgw ctl facility hold rack:r12-07 --reason "PDU swap" --drain',
    )
    h.add_argument("domain", help="level:name, e.g. rack:r12-07, pdu:r12-07-a, row:12; or a bare name (r12-07)")
    h.add_argument("--reason", required=True, help="why; shown with every refusal it causes")
    h.add_argument(
        "--new", action="store_true",
        help="hold a domain nothing knows yet (no node, feed, budget or import names it), ahead of its nodes",
    )
    h.add_argument(
        "--drain", action="store_true", default=None, help="also move its replicas out, the replacement up first"
    )
    h.set_defaults(handler=hold)

    r = sub.add_parser(
        "release", help="undo a hold and its drain",
        description="Release a held domain: its nodes take new replicas again. A drain under way stops; the "
        "replicas it moved stay where they went.",
        epilog="example: llmgw ctl facility release rack:r12-07",
    )
    r.add_argument("domain", help="the held domain, level:name (rack:r12-07)")
    r.set_defaults(handler=release)

    c = sub.add_parser("condition", help="set a domain's thermal condition by hand (a known sensor fault), or clear it")
    csub = c.add_subparsers(dest="condition_command", metavar="COMMAND", required=True)
    cs = csub.add_parser(
        "set", help="set a domain's condition until cleared or for a while",
        epilog='example: llmgw ctl facility condition set rack:r12-07 ok --reason "probe fault" --for 2h',
    )
    cs.add_argument("domain", help="level:name (rack:r12-07, row:12)")
    cs.add_argument("condition", choices=("ok", "warm", "hot", "unknown"))
    cs.add_argument("--reason", required=True, help="why; kept in the events and shown with the condition")
    cs.add_argument("--for", dest="duration", default=None, help="how long: 120 (seconds), 90s, 30m, 2h (default: until cleared)")
    cs.set_defaults(handler=condition_set)
    cc = csub.add_parser("clear", help="clear a condition set by hand: the evaluated one counts again")
    cc.add_argument("domain", help="level:name (rack:r12-07)")
    cc.set_defaults(handler=condition_clear)

    sh = sub.add_parser(
        "shed",
        help="the moves shedding would make off hot or over-limit domains in the next intervals",
        description="The moves shedding would make off domains hot under enforce mode or past their power "
        "limit, interval by interval: batch models first, critical ones never. Shedding itself runs from the periodic "
        "evaluation when server.yaml's facility.shedding.enabled is true; this command only lists, so "
        "--dry-run is required. -o json answers as the API: {\"enabled\", \"moves\"}.",
        epilog="example: llmgw ctl facility shed --dry-run -o json",
    )
    sh.add_argument("--dry-run", action="store_true", required=True,
                    help="list the moves (shedding itself runs from the periodic evaluation)")
    sh.add_argument("--intervals", type=int, default=3, help="how many intervals ahead (default 3)")
    output_option(sh)
    sh.set_defaults(handler=shed)

    cp = sub.add_parser(
        "capping", help="GPU caps: the nodes capped (or, in observe mode, that would be) and why",
        description="The GPUs capping caps (server.yaml's facility.capping), or would in observe mode: each "
        "node's lever (power limit or locked clocks), its figures and the domain that asks it. -o json answers "
        "as the API: {\"enabled\", \"lever\", \"nodes\"}.",
    )
    output_option(cp)
    cp.set_defaults(handler=capping)

    e = sub.add_parser(
        "events", help="the timeline of condition changes, newest first (kept 30 days)",
        description="Every change of a domain's thermal condition (ok, warm, hot, unknown), newest first, with "
        "the reading that moved it; kept 30 days. Times are UTC.",
        epilog="example: llmgw ctl facility events --domain rack:r12-07 --limit 20",
    )
    e.add_argument("--domain", default=None, help="only this domain (rack:r12-07)")
    e.add_argument("--limit", type=int, default=200, help="at most this many, the newest (default 200)")
    output_option(e)
    e.set_defaults(handler=events)

    register_feeds(sub)

    b = sub.add_parser("budget", help="set or remove one domain's power budget")
    bsub = b.add_subparsers(dest="budget_command", metavar="COMMAND", required=True)
    s = bsub.add_parser(
        "set", help="set a domain's cap (what one feed carries alone, derated)",
        epilog="example: llmgw ctl facility budget set rack:r12-07 --cap-watts 18400 --other-watts 800",
    )
    s.add_argument("domain", help="level:name (rack:r12-07, pdu:r12-07-a)")
    s.add_argument("--cap-watts", type=watts_arg, required=True,
                   help="the cap in watts (18400, not 18.4kW); the limit is the cap less the margin")
    s.add_argument(
        "--other-watts", type=watts_arg, default=None,
        help="switches, storage: what llmgw does not see (not given: kept as it is)",
    )
    s.set_defaults(handler=budget_set)
    d = bsub.add_parser(
        "delete", help="remove a domain's budget",
        description="Remove a domain's written budget. Where its feeds give it a cap, that cap holds again; "
        "where none does, nothing refuses a replica there for power any more (said as a warning). A cap that "
        "comes from the feeds alone is no written budget: change the feeds to change it.",
    )
    d.add_argument("domain", help="level:name (rack:r12-07)")
    d.set_defaults(handler=budget_delete)


def watts_arg(text: str) -> float:
    """A finite number (nan and inf are no watts; the API's JSON could not carry them either)."""
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of watts")
    return value


@listing
def overview(args) -> int:
    data = read(args, "facility", lambda: placement_selectors.facility_overview())
    if args.output == "json":
        print_json(data)
        return 0
    wide = args.output == "wide"
    rows = []
    for d in data["domains"]:
        hold = d["hold"]
        hold_text = "-"
        if hold:
            drain = f" (drain: {hold['drain_text']})" if hold["drain"] else ""
            hold_text = f"held{drain}: {hold['reason']}"
        figures = [kw(d["reserved_watts"]), kw(d["measured_watts"])] if wide else []
        rows.append(
            [d["domain"], len(d["nodes"]), kw(d["use_watts"]), kw(d["limit_watts"]), *figures,
             rolled_condition_text(d, short=not wide), hold_text, d["cap_source"] or "-"]
        )
    window = f"{data['settings']['measured_window_seconds'] / 60:g}m"
    print_table(
        ["DOMAIN", "NODES", "USE", "LIMIT", *(["RESERVED", f"MEASURED PEAK {window}"] if wide else []), "CONDITION",
         "HOLD", "SOURCE"],
        rows, cut=("DOMAIN", "CONDITION", "HOLD", "SOURCE"), wide=wide,
    )
    for d in data["domains"]:
        if d["over_limit"]:  # the table's figures say it too, but only to whoever compares USE and LIMIT
            over = d["use_watts"] - d["limit_watts"]
            print_wrapped(f"{d['domain']}: over its limit by {over:,.0f} W ({kw(d['use_watts'])} in use of a "
                          f"{kw(d['limit_watts'])} limit)")
    for d in data["domains"]:
        if d.get("cap_warning"):
            print_wrapped(f"{d['domain']}: {d['cap_warning']}; the feed's cap holds")
    for source in data.get("sources") or []:
        if not source["up"]:
            print_wrapped(f"source {source['name']} down: {source['last_error']} "
                          f"(last success {source['last_success_at'] or 'never'})")
    for node, progress in sorted(data["node_drains"].items()):
        print_wrapped(f"node {node} draining: {progress['left']} left, {progress['moving']} moving"
                      + "".join(f"; {b['replica']} blocked: {b['reason']}" for b in progress["blocked"]))
    return 0


SHOWN_SIGNALS = (("inlet_temp_c", "inlet {:.1f} °C"), ("thermal_throttle_share", "{:.0%} throttling"),
                 ("cooling_alarm", "alarm {:g}"))


def rolled_condition_text(d: dict, *, short: bool = False) -> str:
    """A domain's condition as the console's facility page says it: a row, room or site at its worst rack's
    where that is worse (``hot from rack r1-01; its own: ok (inlet 24.5 °C, 20 s old)``; ``short``: ``hot
    from rack r1-01``)."""
    rolled = d.get("rolled_up")
    if not rolled or rolled["condition"] not in ("warm", "hot"):  # an ok rack under an unknown row: its own
        return condition_text(d["condition"], short=short)
    if short:
        return f"{rolled['condition']} from {rolled['from']}"
    return f"{rolled['condition']} from {rolled['from']}; its own: {condition_text(d['condition'])}"


def condition_text(c: dict, *, short: bool = False) -> str:
    """``hot (inlet 35.0 °C, 0% throttling, 20 s old)``: the condition, its readings and how old they are;
    ``short`` (the table's, -o wide has the rest): ``hot (inlet 35.0 °C)``, its main reading alone."""
    if c["condition"] == "unknown" and not c["readings"]:
        return "unknown"
    shown = [fmt.format(c["readings"][key]) for key, fmt in SHOWN_SIGNALS if key in c["readings"]][: 1 if short else None]
    if c["age_seconds"] is not None and not short:
        shown.append(f"{c['age_seconds']:.0f} s old")
    if c["overridden"]:
        shown.insert(0, "set by hand")
    mode = " observed" if c["mode"] == "observe" and c["condition"] in ("warm", "hot") else ""
    return f"{c['condition']}{mode}" + (f" ({', '.join(shown)})" if shown else "")


def condition_set(args) -> int:
    from datetime import datetime

    from facility.configuration import parse_duration  # pure: no Django

    seconds = None
    if args.duration is not None:
        try:
            seconds = parse_duration(args.duration)
        except ValueError as exc:
            raise InvalidInput(f"--for: {exc}", field="for") from exc
        if not 1 <= seconds <= MAX_CONDITION_SECONDS:  # the API's for_seconds bounds, checked here in both modes
            raise InvalidInput("--for: a duration of at least 1s, at most a year (366 days)", field="for")

    def local() -> dict:
        o = services.condition_override_set(
            domain=args.domain, condition=args.condition, reason=args.reason, seconds=seconds, created_by="ctl"
        )
        return {"domain": o.domain, "condition": o.condition, "reason": o.reason,
                "until": o.until.isoformat() if o.until else None}

    body = {"domain": args.domain, "condition": args.condition, "reason": args.reason, "for_seconds": seconds}
    o = write(args, "POST", "facility/conditions", body, local)
    until = f" until {datetime.fromisoformat(o['until']):%Y-%m-%d %H:%M} UTC" if o["until"] else " until cleared"
    print(f"{o['domain']} set {o['condition']}{until}: {o['reason']}")
    return 0


# facility.services.MAX_OVERRIDE_SECONDS (named here too: importing it would load Django in remote mode).
MAX_CONDITION_SECONDS = 366 * 86_400


def condition_clear(args) -> int:
    write(args, "DELETE", f"facility/conditions/{path_part(args.domain, 'domain', safe=':')}", None,
          lambda: services.condition_override_clear(domain=args.domain))
    print(f"{args.domain}: condition set by hand cleared")
    return 0


@listing
def events(args) -> int:
    if args.limit < 1:
        raise InvalidInput("--limit: a whole number from 1 up", field="limit")

    warnings: list[str] = []

    def local() -> list[dict]:
        from facility.selectors import MAX_EVENTS, condition_events

        if args.limit > MAX_EVENTS:  # the API's bound, which says so in remote mode
            raise InvalidInput(f"--limit: a whole number from 1 to {MAX_EVENTS}", field="limit")
        domain = services.clean_domain(args.domain) if args.domain else None
        rows = condition_events(domain=domain, limit=args.limit)
        typo = services.domain_warning(domain=domain) if domain and not rows else None
        if typo:  # a name no node is in: a typo, likely (said as `ctl facility hold` says it)
            warnings.append(typo)
        return rows

    rows = read(args, "facility/events", local, domain=args.domain or None, limit=args.limit)
    if args.output == "json":
        print_json(rows)
        return 0
    print_table(
        ["AT (UTC)", "DOMAIN", "FROM", "TO", "REASON"],
        [[e["at"][:19].replace("T", " "), e["domain"], e["from"], e["to"], e["reason"] or "-"] for e in rows],
        cut=("DOMAIN", "REASON"), wide=args.output == "wide",
    )
    for warning in warnings:
        print(f"warning: {warning}")
    return 0


@listing
def shed(args) -> int:
    intervals = max(1, min(args.intervals, MAX_SHED_INTERVALS))

    def local() -> dict:
        from placement.shedding import shed_listing

        return shed_listing(intervals=intervals)

    data = read(args, "facility/shed", local, intervals=intervals)
    rows = data["moves"]
    if args.output == "json":
        print_json(data)  # as the API answers it: `enabled` tells "off" from "nothing to move"
        return 0
    if not data["enabled"]:
        print("shedding is off (facility.shedding.enabled in server.yaml): nothing moves")
        return 0
    if not rows:
        print("nothing to shed: no domain is hot (enforce mode) or past its power limit")
        return 0
    print_table(
        ["AT (UTC)", "DOMAIN", "ACTION", "REPLICA", "CLASS", "TO", "REASON"],
        [[r["at"][:19].replace("T", " "), r["domain"], r["action"], r["replica"] or "-", r["class"] or "-",
          ",".join(r["to"]) or "-", r["reason"]] for r in rows],
        cut=("DOMAIN", "REPLICA", "TO", "REASON"), wide=args.output == "wide",
    )
    return 0


# placement.api's bound on ?intervals= (named here too: importing it would load Django in remote mode).
MAX_SHED_INTERVALS = 100


@listing
def capping(args) -> int:
    def local() -> dict:
        from placement.capping import capping_listing

        return capping_listing()

    data = read(args, "facility/capping", local)
    rows = data["nodes"]
    if args.output == "json":
        print_json(data)  # as the API answers it: `enabled` tells "off" from "nothing capped"
        return 0
    if not data["enabled"]:
        print("capping is off (facility.capping.enabled in server.yaml): every GPU holds its defaults")
        return 0
    if not rows:
        print("no GPU is capped: no domain is warm, hot or near its power limit")
        return 0
    for row in rows:
        print_wrapped(row["text"])
    return 0


def apply(args) -> int:
    """The file applied whole or refused whole, here or through the API (which reads nothing from its own
    disk: a scenario file the server.yaml names is read here and sent with it)."""
    from llmgw.yamldoc import read_input

    filename = "<stdin>" if args.file == "-" else args.file
    text = read_input(args.file)
    body = None
    if getattr(args, "remote", None) is not None:
        body = {"text": text, "filename": filename, "files": named_files(text=text, filename=filename),
                "confirm": args.yes}
    try:
        result = write(args, "POST", "facility/apply", body,
                       lambda: services.facility_apply(text=text, filename=filename, confirm=args.yes))
    except Conflict as exc:
        if exc.field != "confirm":
            raise
        print(f"error: {exc.message}\nnothing was applied: give --yes to apply it and remove them", file=sys.stderr)
        return 1
    print(
        f"{args.file}: applied ({result['created']} budgets created, {result['updated']} updated{_unchanged(result)}, "
        f"{result['removed']} removed{': ' + ', '.join(result['removed_domains']) if result['removed_domains'] else ''}"
        + _feeds_applied(result.get("feeds"))
        + ")"
    )
    for warning in result.get("warnings", []):
        print(f"warning: {warning}")
    return 0


def named_files(*, text: str, filename: str) -> dict[str, str]:
    """The files a server.yaml names, by the name it gives them, read as facility_apply reads them where
    the database is: the simulated source's scenario, relative to the server.yaml's folder."""
    from pathlib import Path

    from llmgw.yamldoc import load_documents, read_text

    docs = load_documents(text, filename)
    data = docs[0].data if len(docs) == 1 else None
    name: object = data
    for key in ("facility", "sources", "simulated", "file"):
        name = name.get(key) if isinstance(name, dict) else None
    if not isinstance(name, str) or not name.strip():
        return {}  # none, or a refusal the server words
    path = Path(name)
    if not path.is_absolute() and Path(filename).is_file():
        path = Path(filename).parent / path
    try:
        return {name: read_text(path)}
    except InvalidInput as exc:
        raise docs[0].error(("facility", "sources", "simulated", "file"), exc.message) from exc


def _feeds_applied(feeds: dict | None) -> str:
    if feeds is None:
        return ""
    removed = f": {', '.join(feeds['removed'])}" if feeds["removed"] else ""
    return (
        f"; {feeds['created']} feeds created, {feeds['updated']} updated{_unchanged(feeds)}, "
        f"{len(feeds['removed'])} removed{removed}"
    )


def _unchanged(counts: dict) -> str:
    """``, 8 unchanged`` where an apply named things as they were (an older server says nothing of it)."""
    return f", {counts['unchanged']} unchanged" if counts.get("unchanged") else ""


def hold(args) -> int:
    def local() -> dict:
        created = placement_services.hold_create(domain=args.domain, reason=args.reason, drain=args.drain,
                                                 created_by="ctl", new=args.new)
        h = created.hold
        return {"domain": h.domain, "reason": h.reason, "drain": h.drain, "warning": "; ".join(created.warnings) or None}

    body = {"domain": args.domain, "reason": args.reason, "drain": args.drain}
    if args.new:  # an older server knows no `new`: sent only when given
        body["new"] = True
    h = write(args, "POST", "facility/holds", body, local)
    print(f"{h['domain']} held{' and draining' if h['drain'] else ''}: {h['reason']}"
          + (f" ({h['warning']})" if h.get("warning") else ""))
    return 0


def release(args) -> int:
    body = write(args, "DELETE", f"facility/holds/{path_part(args.domain, 'domain', safe=':')}", None,
                 lambda: {"domain": _release(args.domain)})
    print(f"{(body or {}).get('domain') or args.domain} released")
    return 0


def _release(domain: str) -> str:
    from facility.services import held_domain

    domain = held_domain(domain)
    placement_services.hold_release(domain=domain)
    return domain


def budget_set(args) -> int:
    def local() -> dict:
        changed = placement_services.budget_change(
            domain=args.domain, cap_watts=args.cap_watts, other_watts=args.other_watts
        )
        b = changed.value
        return {"domain": b.domain, "cap_watts": b.cap_watts, "other_watts": b.other_watts,
                "warning": "; ".join(changed.warnings) or None}

    body = {"domain": args.domain, "cap_watts": args.cap_watts, "other_watts": args.other_watts}
    b = write(args, "POST", "facility/budgets", body, local)
    print(f"{b['domain']}: cap {kw(b['cap_watts'])}, other {kw(b['other_watts'])}")
    if b.get("warning"):
        print(f"warning: {b['warning']}")
    return 0


def budget_delete(args) -> int:
    def local() -> dict:
        changed = placement_services.budget_remove(domain=args.domain)
        return {"domain": args.domain, "warning": "; ".join(changed.warnings) or None}

    result = write(args, "DELETE", f"facility/budgets/{path_part(args.domain, 'domain', safe=':')}", None, local) or {}
    print(f"{args.domain}: budget removed")
    if result.get("warning"):  # an older server answers 204, without one
        print(f"warning: {result['warning']}")
    return 0


# -- feeds, N−1 -----------------------------------------------------------------------------------------


def register_feeds(sub) -> None:
    from llmgw.ctl import output_option

    f = sub.add_parser(
        "feeds",
        help="power feeds: capacity, the PDUs and racks they supply, their load",
        description="Each feed: RATING, STATUS, CAPACITY (|V| × A × max_utilization, × √3 three-phase), LOAD (what "
        "N−1 judges: node by node, node_watts plus the larger of placed and the measured peak, a node's split "
        "over its live feeds), RESERVED and MEASURED PEAK beside it (each with node_watts, unlike "
        "`llmgw ctl facility`'s), then each three-phase PDU's legs.",
    )
    output_option(f)
    f.set_defaults(handler=feeds)
    loss = sub.add_parser(
        "feed-loss",
        help="N−1: what passes its surviving feed's capacity if a feed is lost (0 violations is the state to keep)",
        description="For the loss of each live feed (or the one named): every rack, PDU, leg and surviving feed "
        "whose load would pass what carries it, by how much, and any node left with no feed. A load is the use "
        "`llmgw ctl facility` shows (node by node, node_watts plus the larger of placed and the measured peak); "
        "reserved and the measured peak are shown beside it. A PDU's or feed's load is what it would carry: "
        "a node on PDUs left splits over them, and so do a rack's other_watts. Exits 3 when it finds a "
        "violation (0: none; 1: an error), so a timer or a check can tell.",
    )
    loss.add_argument("feed", nargs="?", help="one feed's name (default: each feed in turn)")
    output_option(loss)
    loss.set_defaults(handler=feed_loss)

    imp = sub.add_parser("import", help="import feeds and node locations from a DCIM")
    isub = imp.add_subparsers(dest="import_source", metavar="SOURCE", required=True)
    nb = isub.add_parser(
        "netbox",
        help="NetBox: power feeds become facility.feeds (PDU and rack caps); devices named like nodes label them",
        description="Read NetBox's racks, power panels, power feeds and devices (pynetbox), or its CSV export of "
        "power feeds (--csv, offline sites). --dry-run prints the diff; without it the import is applied "
        "all-or-nothing, like facility apply.",
        epilog="example: llmgw ctl facility import netbox --url https://netbox.example.org --token-file nb.token --site sto1 --dry-run",
    )
    where = nb.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="NetBox's address")
    where.add_argument("--csv", help="a CSV export of NetBox power feeds (offline)")
    nb.add_argument("--token-file", help="a file holding the API token (with --url)")
    nb.add_argument("--site", help="only this site (its slug)")
    nb.add_argument(
        "--role", action="append", metavar="SLUG",
        help="label devices of this role as nodes, joined or not (repeat for more; default: the roles of the "
        "devices already known as nodes)",
    )
    nb.add_argument(
        "--row-from", choices=("location", "group", "none"), default="location",
        help="a rack's row: the location it stands in when nested in a room (default), its rack group, or none",
    )
    nb.add_argument(
        "--default-utilization", type=float, metavar="PERCENT",
        help="with --csv: the max utilization of feeds whose export has no such column (NetBox's current view)",
    )
    nb.add_argument("--dry-run", action="store_true", help="print what would change; write nothing")
    nb.add_argument(
        "--yes", action="store_true",
        help="apply what waits for a person too: caps that rise or vanish, feeds removed, nodes taken out of a rack "
        "or PDU (without it they are held back and listed, and the rest is applied)",
    )
    nb.add_argument(
        "--map", action="append", metavar="SITE/DEVICE=NODE",
        help="which node a device is whose name two sites share (repeat for more; with --url)",
    )
    no_wait_option(nb)
    output_option(nb)
    nb.set_defaults(handler=import_netbox)
    st = isub.add_parser(
        "status",
        help="each site's NetBox import as it last ran: when, what it applied, what waits for a yes and since when",
        description="What the last import of each site applied and what it held back for a person (caps that would "
        "rise or vanish, feeds removed, nodes leaving a rack or PDU), with the scheduled sync's interval "
        "(server.yaml facility.netbox.sync_every). Approve with `ctl facility import sync --yes` (or an import "
        "with --yes).",
    )
    output_option(st)
    st.set_defaults(handler=import_status)
    sy = isub.add_parser(
        "sync",
        help="run the configured NetBox sync now (server.yaml facility.netbox); --yes applies what waits too",
        description="Reads the NetBox server.yaml's facility.netbox names, as the scheduled sync does: what lowers a "
        "cap or adds an object is applied; what would raise or remove one waits, unless --yes.",
    )
    sy.add_argument("--yes", action="store_true", help="apply what waits for a person too")
    sy.add_argument("--dry-run", action="store_true", help="print what would change; write nothing")
    no_wait_option(sy)
    output_option(sy)
    sy.set_defaults(handler=import_sync)
    jb = isub.add_parser(
        "job",
        help="a NetBox import or sync job: its progress, then what it changed (or why it failed)",
        description="An import with --url, and a sync, run as a job on the server (a worker, or the embedded "
        "server's import thread): this follows one, printing each phase and the objects read, until it ends; "
        "then the diff, as the import prints it. Without an id: the newest jobs.",
        epilog="example: llmgw ctl facility import job 12",
    )
    jb.add_argument("job", nargs="?", type=int, help="the job's id (the import printed it); none: list the newest")
    no_wait_option(jb)
    output_option(jb)
    jb.set_defaults(handler=import_job)

    w = sub.add_parser(
        "what-if",
        help="dry run: hold a domain (--drain) or lose a feed; which replicas move where, which are blocked",
        description="A dry run on a copy of the state: nothing is written. Lists which replicas would move and "
        "where (planned as the drain plans them), which would be blocked and why, and the use before and after of "
        "each budgeted domain it changes or leaves past its limit (-o json: the same domains).",
    )
    wsub = w.add_subparsers(dest="what_if", metavar="SCENARIO", required=True)
    wh = wsub.add_parser("hold", help="hold a domain", epilog="example: llmgw ctl facility what-if hold rack:r12-07 --drain")
    wh.add_argument("domain")
    wh.add_argument("--drain", action="store_true", help="and move its replicas out")
    output_option(wh)
    wh.set_defaults(handler=what_if)
    wf = wsub.add_parser("feed-loss", help="lose a feed: the replicas of nodes left without power move")
    wf.add_argument("feed")
    output_option(wf)
    wf.set_defaults(handler=what_if)


@listing
def feeds(args) -> int:
    data = read(args, "facility/feeds", lambda: feed_selectors.feeds_overview())
    if args.output == "json":
        print_json(data)
        return 0
    from facility.feeds import rating_text  # pure: a remote ctl loads no Django

    rows = [
        [
            f["name"],
            rating_text(f),
            f["status"],
            kw(f["capacity_watts"]),
            kw(f["load_watts"]),
            kw(f["reserved_watts"]),
            kw(f["measured_watts"]),
            ",".join(f["pdus"]) or "-",
            ",".join(f["racks"]) or "-",
        ]
        for f in data["feeds"]
    ]
    print_table(["FEED", "RATING", "STATUS", "CAPACITY", "LOAD", "RESERVED", "MEASURED PEAK", "PDUS", "RACKS"], rows,
                cut=("FEED", "PDUS", "RACKS"), wide=args.output == "wide")
    legs = [
        [
            pdu["pdu"],
            leg["leg"],
            kw(leg["use_watts"]),
            "-" if leg["limit_watts"] is None else kw(leg["limit_watts"]),
            "-" if pdu["imbalance"] is None else f"{pdu['imbalance'] * 100:.0f} %",
        ]
        for f in data["feeds"]
        for pdu in f["legs"]
        for leg in pdu["legs"]
    ]
    if legs:
        print()
        print_table(["PDU", "LEG", "LOAD", "LIMIT", "IMBALANCE"], legs, cut=("PDU",), wide=args.output == "wide")
    unfed = data.get("unfed_pdus") or []  # an older server sends none
    if unfed:
        print()
        for row in unfed:
            print_wrapped(f"! {row['text']}")
    return 0


# feed-loss's status when a lost feed would leave something past what carries it (1 is an error's).
VIOLATIONS_EXIT = 3


@listing
def feed_loss(args) -> int:
    data = read(args, "facility/feed-loss", lambda: feed_selectors.feed_loss_report(feed=args.feed), feed=args.feed)
    if args.output == "json":
        print_json(data)
        return VIOLATIONS_EXIT if data["violations"] else 0
    for item in data["feeds"]:
        count = len(item["violations"])
        head = f"feed {item['feed']} FAILED, now" if item.get("failed") else f"without feed {item['feed']}"
        print(f"{head}: {count} violation{'s' if count != 1 else ''}")
        for v in item["violations"]:
            print_wrapped(f"  {v['text']}")
        for c in item.get("carried") or ():  # an older server answers without it
            share = f" ({100 * c['load_watts'] / c['capacity_watts']:.0f} %)" if c["capacity_watts"] else ""
            verb = "carries" if item.get("failed") else "would carry"
            print(f"  {c['feed']} {verb} {kw(c['load_watts'])} of {kw(c['capacity_watts'])}{share}")
    print_wrapped(data["text"])
    return VIOLATIONS_EXIT if data["violations"] else 0


@listing
def what_if(args) -> int:
    def local() -> dict:
        from placement.whatif import what_if as run

        return run(hold=args.domain, drain=args.drain) if args.what_if == "hold" else run(feed=args.feed)

    body = {"target": args.domain, "drain": args.drain} if args.what_if == "hold" else {"target": args.feed}
    data = write(args, "POST", "facility/what-if", body, local)
    if args.output == "json":
        print_json(data)
        return 0
    for line in what_if_lines(data):
        print_wrapped(line)
    return 0


def what_if_lines(data: dict) -> list[str]:
    """A what-if as ctl prints it (the console shows the same parts)."""
    lines = [f"what if: {data['scenario']}", f"nodes leaving: {', '.join(data['nodes']) or 'none'}"]
    lines.append(f"moves ({len(data['moves'])}):")
    lines += [f"  {m['replica']}: {','.join(m['from'])} -> {','.join(m['to'])}" for m in data["moves"]]
    if data["blocked"]:
        lines.append(f"blocked ({len(data['blocked'])}):")
        lines += [f"  {b['replica']} on {','.join(b['from'])}: {b['reason']}" for b in data["blocked"]]
    if data["stay"]:
        lines.append(f"stay, held (no --drain) ({len(data['stay'])}):")
        lines += [f"  {s['replica']} on {','.join(s['on'])}" for s in data["stay"]]
    if data["feed_loss"]:
        lines.append(f"feed loss ({len(data['feed_loss'])} violations):")
        lines += [f"  {v['text']}" for v in data["feed_loss"]]
    if data.get("feed_carried"):  # an older server sends none
        lines.append("feeds left (load after, of capacity):")
        lines += [f"  {c['feed']}: {kw(c['load_watts'])} of {kw(c['capacity_watts'])}" for c in data["feed_carried"]]
    lines.append("domains (use before -> after, of limit):")
    lines += [
        f"  {d['domain']}: {kw(d['use_watts_before'])} -> {kw(d['use_watts_after'])} of {kw(d['limit_watts'])}"
        for d in data["domains"]  # those it changes, or past their limit after (placement.whatif)
    ] or ["  (no domain's use changes)"]
    lines += [f"warning: {w}" for w in data.get("warnings") or ()]  # an older server sends none
    return lines


def import_netbox(args) -> int:
    if args.csv:
        if args.role or args.site or args.map:
            raise InvalidInput("--role, --site, --map: only with --url (a CSV export of feeds names no device)", field="role")
        from facility.feeds import utilization_problem  # pure: a remote ctl loads no Django

        problem = utilization_problem(args.default_utilization)  # before the file is read, as the server would
        if problem:
            raise InvalidInput(f"--default-utilization: {problem}", field="default_utilization")
        text = _read_utf8(args.csv, "csv")
        body = {"csv": text, "dry_run": args.dry_run, "default_utilization": args.default_utilization,
                "confirm": args.yes}
    else:
        if not args.token_file:
            raise InvalidInput("--token-file: required with --url (a file holding the NetBox API token)", field="token_file")
        if args.default_utilization is not None:
            raise InvalidInput("--default-utilization: only with --csv (the API gives every feed's)", field="default_utilization")
        token = _read_utf8(args.token_file, "token_file").strip()
        body = {"url": args.url, "token": token, "site": args.site, "dry_run": args.dry_run,
                "roles": args.role or [], "row_from": args.row_from, "confirm": args.yes, "map": args.map or []}

    def local() -> dict:
        from facility import import_jobs, netbox_import

        if args.csv:
            plan = netbox_import.plan_from_export(text, default_utilization=args.default_utilization)
            return netbox_import.netbox_import(plan=plan, dry_run=args.dry_run, confirm=args.yes)
        netbox_import.device_map_parse(args.map)
        job = import_jobs.import_job_create(
            url=args.url.rstrip("/"), token=token, site=args.site, dry_run=args.dry_run, confirm=args.yes,
            options={"roles": args.role or [], "row_from": args.row_from, "map": args.map or []}, requested_by="ctl",
        )
        return _job_data(job.pk)

    answer = write(args, "POST", "facility/import/netbox", body, local)
    # A CSV is applied at once; a NetBox is read by a job on the server, followed here until it ends.
    return _diff_printed(args, answer if args.csv else _job_followed(args, answer))


def no_wait_option(parser) -> None:
    parser.add_argument(
        "--no-wait", action="store_true",
        help="print the job's id and return; follow it later with `llmgw ctl facility import job ID` (where no "
        "worker runs jobs — the embedded default without a server — it runs before ctl returns)",
    )


def _job_data(job_id: int) -> dict:
    from facility.import_jobs import import_job_get
    from facility.serializers import ImportJobSerializer

    return ImportJobSerializer(import_job_get(job_id)).data


# How long ctl follows a job (a run's hard limit is 660 s), and how often it asks.
JOB_WAIT_SECONDS = 700
JOB_POLL_SECONDS = 1.0


def _job_followed(args, job: dict) -> dict | None:
    """Follow a job until it ends, each new phase on stderr: its diff, or its failure raised as the error it
    was (InvalidInput naming its field). None with --no-wait (the job printed)."""
    import time

    if getattr(args, "no_wait", False):
        if args.output == "json":
            print_json(job)
        else:
            print(f"{job_progress_text(job)}; follow it: llmgw ctl facility import job {job['id']}")
        return None
    ends_at = time.monotonic() + JOB_WAIT_SECONDS
    said = None
    while job["state"] in ACTIVE_STATES:
        text = job_progress_text(job)
        if text != said:
            print(text, file=sys.stderr)
            said = text
        if time.monotonic() > ends_at:
            raise Conflict(f"job: NetBox {job['kind']} {job['id']} is still {job['state']} after {JOB_WAIT_SECONDS} s; "
                           f"follow it: llmgw ctl facility import job {job['id']}", field="job")
        time.sleep(JOB_POLL_SECONDS)
        job = read(args, f"facility/import/jobs/{job['id']}", lambda jid=job["id"]: _job_data(jid))
    if job["state"] == "failed":
        raise InvalidInput(job["error"], field=job.get("error_field"))
    return job["result"]


def _diff_printed(args, result: dict | None) -> int:
    if result is None:
        return 0
    if args.output == "json":
        print_json(result)
        return 0
    for line in netbox_diff_lines(result):
        print(line)
    return 0


def import_status(args) -> int:
    def local() -> list:
        from facility.netbox_sync import sync_status
        from facility.serializers import NetboxSyncStatusSerializer

        return NetboxSyncStatusSerializer(sync_status(), many=True).data

    rows = read(args, "facility/import/status", local)
    if args.output == "json":
        print_json(rows)
        return 0
    if not rows:
        print("no NetBox import has run (llmgw ctl facility import netbox --help)")
        return 0
    for row in rows:
        when = _utc(row["last_run_at"]) or "never"
        every = f", every {row['scheduled_every_seconds']:g} s" if row.get("scheduled_every_seconds") else ""
        print(f"{row['source']} {row['site'] or 'every site'}: last run {when}{every}; last applied "
              f"{_utc(row['last_applied_at']) or 'never'}")
        if row.get("last_error"):
            print(f"  error: {row['last_error']}")
        if row["pending"]:
            print(f"  {len(row['pending'])} waiting for a yes since {_utc(row['differs_since'])} "
                  "(ctl facility import sync --yes):")
            for text in row["pending"][:20]:
                print(f"    {text}")
            if len(row["pending"]) > 20:
                print(f"    … {len(row['pending']) - 20} more (-o json)")
        else:
            print("  nothing waits: NetBox and llmgw agree")
    return 0


def _utc(value) -> str | None:
    if not value:
        return None
    text = value if isinstance(value, str) else value.isoformat()
    return text.replace("T", " ")[:19] + " UTC"


def import_sync(args) -> int:
    def local() -> dict:
        from facility.import_jobs import import_job_create
        from facility.models import ImportJob
        from facility.netbox_sync import configured

        if configured() is None:
            raise Conflict("facility.netbox: no NetBox is configured (server.yaml facility.netbox)", field="netbox")
        job = import_job_create(kind=ImportJob.Kind.SYNC, confirm=args.yes, dry_run=args.dry_run, requested_by="ctl")
        return _job_data(job.pk)

    job = write(args, "POST", "facility/import/sync", {"confirm": args.yes, "dry_run": args.dry_run}, local)
    return _diff_printed(args, _job_followed(args, job))


def import_job(args) -> int:
    if args.job is None:
        def local() -> list:
            from facility.import_jobs import jobs_recent
            from facility.serializers import ImportJobSerializer

            return ImportJobSerializer(jobs_recent(), many=True).data

        jobs = read(args, "facility/import/jobs", local)
        if args.output == "json":
            print_json(jobs)
            return 0
        if not jobs:
            print("no NetBox import job has run (llmgw ctl facility import netbox --help)")
        for job in jobs:
            print(f"{_utc(job['created_at'])}  {job_progress_text(job)}")
        return 0
    job = read(args, f"facility/import/jobs/{args.job}", lambda: _job_data(args.job))
    return _diff_printed(args, _job_followed(args, job))


def netbox_diff_lines(result: dict) -> list[str]:
    """An import's diff as ctl prints it: what matters first, then feeds, labels, caps, then what was
    skipped or kept, and what waits for --yes."""
    lines = [f"! {text}" for text in result.get("first", [])]
    for f in result["feeds_added"]:
        lines.append(f"+ {f['text']} -> {', '.join(f['pdus'] + f['racks'])}")
    for f in result["feeds_changed"]:
        lines.append(f"~ {f['from']['text']} => {f['to']['text']}")
    for r in result.get("feeds_renamed", []):
        lines.append(f"~ feed {r['from']} => {r['to']}")
    for name in result["feeds_removed"]:
        lines.append(f"- feed {name}")
    for node, changes in result["labels"].items():
        parts = [f"{k}={v}" if v is not None else f"{k}-" for k, v in sorted(changes.items())]
        lines.append(f"~ node {node}: " + " ".join(parts))
    for cap in result.get("caps", []):
        lines.append(f"~ {cap['text']}")
    for text in result.get("labels_kept", []):
        lines.append(f"= {text}")
    for text in result.get("skipped", []):
        lines.append(f"! skipped {text}")
    for text in result.get("notes", []):
        lines.append(f"note: {text}")
    changed = sum(len(result.get(k, [])) for k in (
        "feeds_added", "feeds_changed", "feeds_renamed", "feeds_removed", "labels", "renamed", "caps"))
    held = result.get("held_back", [])
    if result.get("dry_run", not result["applied"] and not held):
        lines.append(f"{changed} change{'s' if changed != 1 else ''} (dry run: nothing written)")
        waiting = result.get("needs_yes", [])
        if waiting:
            lines.append(f"{len(waiting)} of them wait for a yes (--yes): " + "; ".join(waiting[:5])
                         + (" …" if len(waiting) > 5 else ""))
    elif not result["applied"]:
        lines.append(f"nothing applied: every change waits for a yes ({len(held)}); give --yes to apply them")
    else:
        lines.append(f"{changed} change{'s' if changed != 1 else ''} applied")
        if held:
            lines.append(f"{len(held)} held back, waiting for --yes: " + "; ".join(held[:5]) + (" …" if len(held) > 5 else ""))
    return lines



def _read_utf8(path: str, field: str) -> str:
    from llmgw.yamldoc import read_text

    try:
        return read_text(path)  # within a file's bound: --csv /dev/zero is refused, not read until memory runs out
    except InvalidInput as exc:
        raise InvalidInput(exc.message, field=field) from exc
