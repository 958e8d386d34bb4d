"""The NetBox import's own work at a real site's size: planning, the diff and the apply, without NetBox.

    .venv/bin/python bench/netbox_import.py [--racks 500 2000] [--servers 8] [--sites 2]

Builds NetBox's objects in its API's shapes (sites, a location per site, racks, two panels, two feeds and
two PDUs per rack cabled feed → PDU input → outlets → each server's two PSUs, a role `gpu-server`), then
times, on a fresh embedded database (SQLite in a temporary LLMGW_DATA_DIR, or DATABASE_URL's server):

- plan: facility.netbox.plan_from_objects (pure);
- diff: the dry run (facility.netbox_import.netbox_import, dry_run) against an empty facility;
- apply: the first import, written (every server's labels waiting for it to join, every feed and cap);
- again: the same NetBox imported a second time (nothing to change).

NetBox's own answer time is not in these figures: the objects are in memory.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def netbox_objects(racks: int, servers: int, sites: int) -> dict[str, list[dict]]:
    data: dict[str, list[dict]] = {k: [] for k in (
        "sites", "locations", "racks", "power-panels", "power-feeds", "power-ports", "power-outlets", "devices")}
    ids = itertools.count(1)
    per_site = max(1, racks // sites)
    rack_no = 0
    for s in range(sites):
        site = {"id": next(ids), "name": f"Site {s}", "slug": f"site{s}"}
        data["sites"].append(site)
        location = {"id": next(ids), "name": "Hall 1", "slug": "hall-1", "site": site, "parent": None}
        data["locations"].append(location)
        panels = {side: {"id": next(ids), "name": f"PP-{side}", "site": site} for side in "AB"}
        data["power-panels"].extend(panels.values())
        for r in range(per_site if s < sites - 1 else racks - rack_no):
            rack_no += 1
            rack = {"id": next(ids), "name": f"R{r:04d}", "site": site, "location": location, "status": {"value": "active"}}
            data["racks"].append(rack)
            outlets = {}
            for side in "AB":
                feed = {"id": next(ids), "name": f"R{r:04d}-{side}", "power_panel": panels[side],
                        "rack": {"id": rack["id"]}, "status": {"value": "active"}, "voltage": 415, "amperage": 32,
                        "phase": {"value": "three-phase"}, "supply": {"value": "ac"}, "max_utilization": 80}
                pdu = {"id": next(ids), "name": f"R{r:04d}-PDU-{side}", "site": site, "rack": {"id": rack["id"]},
                       "role": {"slug": "pdu"}}
                port = {"id": next(ids), "device": {"id": pdu["id"]}, "name": "input",
                        "link_peers_type": "dcim.powerfeed", "link_peers": [{"id": feed["id"]}]}
                feed["link_peers_type"], feed["link_peers"] = "dcim.powerport", [{"id": port["id"]}]
                data["power-feeds"].append(feed)
                data["devices"].append(pdu)
                data["power-ports"].append(port)
                outlets[side] = []
                for n in range(servers):
                    outlet = {"id": next(ids), "device": {"id": pdu["id"]}, "name": str(n + 1),
                              "feed_leg": {"value": "ABC"[n % 3]}}
                    data["power-outlets"].append(outlet)
                    outlets[side].append(outlet)
            for n in range(servers):
                device = {"id": next(ids), "name": f"s{s}r{r:04d}n{n}", "site": site, "location": location,
                          "rack": {"id": rack["id"]}, "role": {"slug": "gpu-server"}}
                data["devices"].append(device)
                for side, psu in (("A", "PSU1"), ("B", "PSU2")):
                    data["power-ports"].append({
                        "id": next(ids), "device": {"id": device["id"]}, "name": psu, "maximum_draw": 5000,
                        "link_peers_type": "dcim.poweroutlet", "link_peers": [{"id": outlets[side][n]["id"]}]})
    return data


def timed(what: str, fn):
    start = time.perf_counter()
    result = fn()
    print(f"  {what:<8} {time.perf_counter() - start:7.2f} s")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--racks", type=int, nargs="+", default=[500, 2000])
    parser.add_argument("--servers", type=int, default=8, help="servers per rack (default 8)")
    parser.add_argument("--sites", type=int, default=2)
    args = parser.parse_args()
    if min(args.racks) < 1 or args.servers < 1 or args.sites < 1:
        parser.error("--racks, --servers and --sites take counts of at least 1")
    os.environ.setdefault("LLMGW_DATA_DIR", tempfile.mkdtemp(prefix="llmgw-bench-netbox-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from facility.netbox import plan_from_objects
    from facility.netbox_import import netbox_import

    db = os.environ.get("DATABASE_URL", "SQLite in " + os.environ["LLMGW_DATA_DIR"])
    print(f"NetBox import, {args.servers} servers and 2 feeds/PDUs a rack, {args.sites} sites; database: {db}")
    for racks in args.racks:
        call_command("flush", interactive=False, verbosity=0) if _migrated() else call_command("migrate", verbosity=0)
        objects = netbox_objects(racks, args.servers, args.sites)
        count = sum(len(v) for v in objects.values())
        print(f"{racks} racks ({count:,} NetBox objects, {racks * args.servers:,} servers, {2 * racks:,} feeds):")
        plan = timed("plan", lambda o=objects: plan_from_objects(o, nodes=set(), roles={"gpu-server"}))
        timed("diff", lambda p=plan: netbox_import(plan=p, dry_run=True))
        timed("apply", lambda p=plan: netbox_import(plan=p, confirm=True))
        again = timed("again", lambda o=objects: netbox_import(plan=plan_from_objects(o, nodes=set(), roles={"gpu-server"})))
        assert not again["feeds_added"] and not again["labels"], "a second import of the same NetBox changed something"


def _migrated() -> bool:
    from django.db import connection

    return "facility_feed" in connection.introspection.table_names()


if __name__ == "__main__":
    main()
