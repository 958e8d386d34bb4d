#!/usr/bin/env python3
"""Build two sites in a real NetBox, change them step by step, and record NetBox's answers after each step.

Standalone: needs only the standard library and `requests` (it shares netbox_record.py's helpers); no test
imports it. Run it against a NetBox with a fresh database (the ids in the fixtures are the ones a fresh
NetBox hands out; the script refuses to run where site sto1 or got1 exists already). It records into
tests/fixtures/netbox/<version>/sites/:

    s1-two-sites          sto1 and got1, built with the same location slug, rack, panel, feed and PDU names
    s2-feed-deleted       sto1's feed A02-B deleted (its PDU R-A02-PDU-B stays)
    s3-rack-renamed       sto1's rack R-B01 renamed R-B01-NEW (same id)
    s4-panel-renamed      got1's panel PP-B renamed PP-B2 (same id)
    s5-utilization-edited got1's A01-A max utilization 80 -> 60 %; sto1's A01-A amperage 16 -> 20 A

Each step holds every object of the endpoints the importer reads and the power feeds' CSV exports;
meta.json holds the steps, the ids touched, what NetBox refused, and each feed's available power per step.

    python scripts/netbox_record_sites.py --url http://127.0.0.1:8800 --token-file ~/.netbox-token
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from netbox_record import REPO, NetBox, NetBoxError, dump, ensure_cable, record, record_csv_exports, ref  # noqa: E402

# The endpoints llmgw's importer filters by ?site=<slug> (facility.netbox.ENDPOINTS but sites).
SITE_FILTERED = ["locations", "racks", "power-panels", "power-feeds", "power-ports", "power-outlets", "devices"]
RACKS = ["R-A01", "R-A02", "R-B01"]
NODE_U_HEIGHT = 4

# site slug: name, (volts, amps, phase, max utilization) per rack, servers per rack, PSU (maximum, allocated) W
SITES = {
    "sto1": {
        "name": "STO1",
        # NetBox's amperage is a whole number: R-A02's 12.5 A is refused (recorded), 13 A is built instead.
        "feeds": {"R-A01": (230, 16, "single-phase", 80), "R-A02": (230, 13, "single-phase", 80),
                  "R-B01": (230, 16, "single-phase", 80)},
        "servers": {"R-A01": ["gpu01", "gpu02"], "R-A02": ["gpu03", "gpu04"], "R-B01": ["gpu05", "gpu06"]},
        "psu": (5000, 4000),
    },
    "got1": {
        "name": "GOT1",
        "feeds": {rack: (415, 32, "three-phase", 80) for rack in RACKS},
        "servers": {"R-A01": ["gpu01", "gpu11"], "R-B01": ["gpu12"]},
        "psu": (6000, 4800),
    },
}


def feed_name(rack: str, side: str) -> str:
    return f"{rack.removeprefix('R-')}-{side}"  # R-A01, A -> A01-A


class Built:
    """Ids of what was built, by natural key (site slug, name)."""

    def __init__(self):
        self.sites: dict[str, dict] = {}
        self.locations: dict[str, dict] = {}
        self.racks: dict[tuple[str, str], dict] = {}
        self.panels: dict[tuple[str, str], dict] = {}
        self.feeds: dict[tuple[str, str], dict] = {}
        self.devices: dict[tuple[str, str], dict] = {}


def attempt(nb: NetBox, meta: dict, what: str, endpoint: str, data: dict, *, keep: bool = False) -> dict | None:
    """POST `data`; record NetBox's answer under meta["refused"] or meta["accepted_odd"]. An accepted object
    is deleted again unless `keep`."""
    resp = nb.request("POST", f"api/{endpoint}/", json=data, ok=(201, 400, 409))
    entry = {"what": what, "endpoint": endpoint, "request": data, "status": resp.status_code}
    if resp.status_code == 201:
        obj = resp.json()
        entry["id"] = obj["id"]
        meta["accepted_odd"].append(entry)
        print(f"  accepted: {what} (id {obj['id']})")
        if not keep:
            nb.delete(endpoint, obj["id"])
            entry["deleted_again"] = True
        return obj
    entry["body"] = resp.json()
    meta["refused"].append(entry)
    print(f"  refused: {what}: {resp.status_code} {resp.text[:200]}")
    return None


def types_and_roles(nb: NetBox) -> tuple[dict, dict]:
    mfr = nb.ensure("dcim/manufacturers", {"slug": "acme"}, {"name": "Acme", "slug": "acme"})
    roles = {
        slug: nb.ensure("dcim/device-roles", {"slug": slug}, {"name": name, "slug": slug, "color": color})
        for slug, name, color in [("pdu", "PDU", "ff9800"), ("gpu-server", "GPU server", "2196f3")]
    }
    types = {}
    for model, u_height in [("PDU-3P", 0), ("PDU-1P", 0), ("PDU-DC", 0), ("GPU-8x", NODE_U_HEIGHT)]:
        slug = model.lower()
        types[model] = nb.ensure("dcim/device-types", {"slug": slug}, {
            "manufacturer": mfr["id"], "model": model, "slug": slug, "u_height": u_height,
            "is_full_depth": u_height > 0,
        })
    for model, legs in [("PDU-3P", "ABCABC"), ("PDU-1P", [None] * 6), ("PDU-DC", [None] * 4)]:
        dt = types[model]["id"]
        inlet = nb.ensure("dcim/power-port-templates", {"device_type_id": dt, "name": "input"},
                          {"device_type": dt, "name": "input"})
        for n, leg in enumerate(legs, start=1):
            nb.ensure("dcim/power-outlet-templates", {"device_type_id": dt, "name": str(n)},
                      {"device_type": dt, "name": str(n), "power_port": inlet["id"], "feed_leg": leg or ""})
    for psu in ("PSU1", "PSU2"):
        dt = types["GPU-8x"]["id"]
        nb.ensure("dcim/power-port-templates", {"device_type_id": dt, "name": psu}, {"device_type": dt, "name": psu})
    return roles, types


def pdu(nb: NetBox, b: Built, roles, types, slug: str, rack: str, name: str, model: str, feed: dict) -> dict:
    sid, lid, rid = b.sites[slug]["id"], b.locations[slug]["id"], b.racks[(slug, rack)]["id"]
    dev = nb.create("dcim/devices", {
        "name": name, "device_type": types[model]["id"], "role": roles["pdu"]["id"],
        "site": sid, "location": lid, "rack": rid, "status": "active",
    })
    b.devices[(slug, name)] = dev
    inlet = nb.find("dcim/power-ports", device_id=dev["id"], name="input")
    ensure_cable(nb, "powerfeed", feed, "powerport", inlet)
    return dev


def build(nb: NetBox, meta: dict) -> Built:
    print("building sto1 and got1")
    for slug in SITES:
        if nb.find("dcim/sites", slug=slug):
            raise NetBoxError(f"site {slug} exists already: record into a NetBox with a fresh database")
    roles, types = types_and_roles(nb)
    b = Built()
    for slug, spec in SITES.items():
        site = b.sites[slug] = nb.create("dcim/sites", {"name": spec["name"], "slug": slug, "status": "active"})
        sid = site["id"]
        loc = b.locations[slug] = nb.create("dcim/locations", {
            "site": sid, "name": "Hall 1", "slug": "hall-1", "status": "active"})
        for rack in RACKS:
            b.racks[(slug, rack)] = nb.create("dcim/racks", {
                "site": sid, "location": loc["id"], "name": rack, "status": "active", "u_height": 42})
        for panel in ("PP-A", "PP-B"):
            b.panels[(slug, panel)] = nb.create("dcim/power-panels", {"site": sid, "location": loc["id"], "name": panel})

    # What NetBox refuses (recorded), tried where the objects they name exist.
    sto, got = "sto1", "got1"
    feed_base = {"status": "active", "type": "primary", "supply": "ac", "phase": "single-phase",
                 "voltage": 230, "amperage": 16, "max_utilization": 80}
    attempt(nb, meta, "sto1 R-A02's feed at 12.5 A (amperage is a whole number)", "dcim/power-feeds", {
        **feed_base, "power_panel": b.panels[(sto, "PP-A")]["id"], "name": "A02-A",
        "rack": b.racks[(sto, "R-A02")]["id"], "amperage": 12.5})
    attempt(nb, meta, "a got1 panel's feed to sto1's rack R-A01 (another site)", "dcim/power-feeds", {
        **feed_base, "power_panel": b.panels[(got, "PP-A")]["id"], "name": "X-SITE",
        "rack": b.racks[(sto, "R-A01")]["id"]})
    attempt(nb, meta, "an AC feed at -230 V", "dcim/power-feeds", {
        **feed_base, "power_panel": b.panels[(sto, "PP-A")]["id"], "name": "X-NEG", "voltage": -230})
    attempt(nb, meta, "a feed at 0 V", "dcim/power-feeds", {
        **feed_base, "power_panel": b.panels[(sto, "PP-A")]["id"], "name": "X-0V", "voltage": 0})
    attempt(nb, meta, "a feed at 0 A", "dcim/power-feeds", {
        **feed_base, "power_panel": b.panels[(sto, "PP-A")]["id"], "name": "X-0A", "amperage": 0})
    for util in (0, 101):
        attempt(nb, meta, f"a feed at {util} % max utilization", "dcim/power-feeds", {
            **feed_base, "power_panel": b.panels[(sto, "PP-A")]["id"], "name": f"X-U{util}", "max_utilization": util})

    for slug, spec in SITES.items():
        for rack in RACKS:
            volts, amps, phase, util = spec["feeds"][rack]
            for side, panel, ftype in [("A", "PP-A", "primary"), ("B", "PP-B", "redundant")]:
                name = feed_name(rack, side)
                b.feeds[(slug, name)] = nb.create("dcim/power-feeds", {
                    "power_panel": b.panels[(slug, panel)]["id"], "name": name, "rack": b.racks[(slug, rack)]["id"],
                    "status": "active", "type": ftype, "supply": "ac", "phase": phase, "voltage": volts,
                    "amperage": amps, "max_utilization": util,
                })
    b.feeds[(got, "DC-1")] = nb.create("dcim/power-feeds", {
        "power_panel": b.panels[(got, "PP-A")]["id"], "name": "DC-1", "rack": b.racks[(got, "R-B01")]["id"],
        "status": "active", "type": "primary", "supply": "dc", "phase": "single-phase", "voltage": -48,
        "amperage": 50, "max_utilization": 80,
    })
    # Feeds NetBox stores that llmgw cannot use well: none is cabled, so none reaches a PDU.
    b.feeds[(got, "A02-F")] = attempt(nb, meta, "got1 failed feed A02-F on PP-B to rack R-A02, no cable",
                                      "dcim/power-feeds", {
        **feed_base, "power_panel": b.panels[(got, "PP-B")]["id"], "name": "A02-F",
        "rack": b.racks[(got, "R-A02")]["id"], "status": "failed", "phase": "three-phase", "voltage": 415,
        "amperage": 32}, keep=True)
    b.feeds[(got, "P-1")] = attempt(nb, meta, "got1 planned feed P-1 on PP-A, no rack, no cable",
                                    "dcim/power-feeds", {
        **feed_base, "power_panel": b.panels[(got, "PP-A")]["id"], "name": "P-1", "status": "planned"}, keep=True)
    b.feeds[(got, "DC-3P")] = attempt(nb, meta, "got1 three-phase DC feed DC-3P on PP-B, no rack",
                                      "dcim/power-feeds", {
        **feed_base, "power_panel": b.panels[(got, "PP-B")]["id"], "name": "DC-3P", "supply": "dc",
        "phase": "three-phase", "voltage": -48, "amperage": 100}, keep=True)
    attempt(nb, meta, "a second feed named A01-A on sto1's PP-A", "dcim/power-feeds", {
        **feed_base, "power_panel": b.panels[(sto, "PP-A")]["id"], "name": "A01-A"})
    attempt(nb, meta, "a second rack named R-A01 in sto1's hall-1", "dcim/racks", {
        "site": b.sites[sto]["id"], "location": b.locations[sto]["id"], "name": "R-A01", "status": "active"})

    for slug, spec in SITES.items():
        sid, lid = b.sites[slug]["id"], b.locations[slug]["id"]
        for rack in RACKS:
            model = "PDU-3P" if spec["feeds"][rack][2] == "three-phase" else "PDU-1P"
            pdus = {side: pdu(nb, b, roles, types, slug, rack, f"{rack}-PDU-{side}", model,
                              b.feeds[(slug, feed_name(rack, side))]) for side in "AB"}
            for n, node in enumerate(spec["servers"].get(rack, []), start=1):
                dev = b.devices[(slug, node)] = nb.create("dcim/devices", {
                    "name": node, "device_type": types["GPU-8x"]["id"], "role": roles["gpu-server"]["id"],
                    "site": sid, "location": lid, "rack": b.racks[(slug, rack)]["id"], "status": "active",
                    "position": 1 + (n - 1) * NODE_U_HEIGHT, "face": "front",
                })
                # PSU2 one outlet further along than PSU1: a different leg on a three-phase PDU.
                for side, psu, outlet_no in [("A", "PSU1", n), ("B", "PSU2", n + 1)]:
                    port = nb.find("dcim/power-ports", device_id=dev["id"], name=psu)
                    maximum, allocated = spec["psu"]
                    port = nb.patch("dcim/power-ports", port["id"], {"maximum_draw": maximum, "allocated_draw": allocated})
                    outlet = nb.find("dcim/power-outlets", device_id=pdus[side]["id"], name=str(outlet_no))
                    ensure_cable(nb, "poweroutlet", outlet, "powerport", port)
    pdu(nb, b, roles, types, got, "R-B01", "R-B01-PDU-DC", "PDU-DC", b.feeds[(got, "DC-1")])

    attempt(nb, meta, "sto1 gpu01 a second time in sto1", "dcim/devices", {
        "name": "gpu01", "device_type": types["GPU-8x"]["id"], "role": roles["gpu-server"]["id"],
        "site": b.sites[sto]["id"], "status": "active"})
    inlet = nb.find("dcim/power-ports", device_id=b.devices[(sto, "R-A01-PDU-A")]["id"], name="input")
    attempt(nb, meta, "a cable from sto1's A01-B to R-A01-PDU-A's input (both already cabled)", "dcim/cables", {
        "a_terminations": [{"object_type": "dcim.powerfeed", "object_id": b.feeds[(sto, "A01-B")]["id"]}],
        "b_terminations": [{"object_type": "dcim.powerport", "object_id": inlet["id"]}], "status": "connected"})
    return b


def port_state(nb: NetBox, port_id: int) -> dict:
    port = nb.get("dcim/power-ports", port_id)
    out = {k: port.get(k) for k in ("id", "cable", "cable_end", "link_peers", "link_peers_type", "connected_endpoints",
                                    "connected_endpoints_type", "connected_endpoints_reachable", "_occupied")}
    if port.get("cable"):
        cable = nb.get("dcim/cables", ref(port["cable"]))
        out["cable_now"] = {"id": cable["id"], "a_terminations": cable["a_terminations"],
                            "b_terminations": cable["b_terminations"]}
    return out


def delete_feed(nb: NetBox, b: Built) -> dict:
    feed = nb.get("dcim/power-feeds", b.feeds[("sto1", "A02-B")]["id"])
    dev = b.devices[("sto1", "R-A02-PDU-B")]
    inlet = nb.find("dcim/power-ports", device_id=dev["id"], name="input")
    before = port_state(nb, inlet["id"])
    nb.delete("dcim/power-feeds", feed["id"])
    after = port_state(nb, inlet["id"])
    cable_id = ref(feed["cable"])
    cable = nb.request("GET", f"api/dcim/cables/{cable_id}/", ok=(200, 404))
    print(f"  deleted feed sto1 PP-B/A02-B (id {feed['id']}); its cable #{cable_id}: {cable.status_code}")
    return {
        "step": "s2-feed-deleted",
        "change": f"deleted sto1's feed PP-B/A02-B (power-feed id {feed['id']}, cable id {cable_id}); "
                  f"its PDU R-A02-PDU-B (device id {dev['id']}, input power-port id {inlet['id']}) stays",
        "feed_id": feed["id"], "cable_id": cable_id, "pdu_device_id": dev["id"], "pdu_input_port_id": inlet["id"],
        "pdu_input_before": before, "pdu_input_after": after,
        "cable_after": cable.json() if cable.status_code == 200 else {"status": cable.status_code},
    }


def rename(nb: NetBox, endpoint: str, obj: dict, new: str) -> dict:
    done = nb.patch(endpoint, obj["id"], {"name": new})
    print(f"  renamed {endpoint} {obj['id']} {obj['name']} -> {done['name']}")
    return done


def available_power(step_dir: Path) -> dict[str, dict]:
    """Each feed's "Available Power (VA)" from NetBox's All-data export, by <panel's site slug>/<panel>/<feed>
    (the export's Site column is the feed's rack's site, empty for a feed with no rack, so the key comes
    from the API's objects, joined on the feed's id)."""
    panels = {p["id"]: p for p in json.loads((step_dir / "dcim_power-panels.json").read_text())}
    feeds = {f["id"]: f for f in json.loads((step_dir / "dcim_power-feeds.json").read_text())}
    text = (step_dir / "power-feeds.all-data.csv").read_text(encoding="utf-8-sig")
    out = {}
    for row in csv.DictReader(io.StringIO(text)):
        feed = feeds[int(row["ID"])]
        panel = panels[feed["power_panel"]["id"]]
        out[f"{panel['site']['slug']}/{panel['name']}/{feed['name']}"] = {
            "id": feed["id"], "available_power": int(row["Available Power (VA)"]), "csv_site": row["Site"]}
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8800", help="NetBox base URL (without /api)")
    parser.add_argument("--token-file", required=True, type=Path, help="file holding a write-enabled API token")
    parser.add_argument("--out", type=Path, help="default: tests/fixtures/netbox/<netbox-version>/sites/")
    parser.add_argument("--username", default="admin", help="UI user for the CSV exports (default admin)")
    parser.add_argument("--password", default="admin", help="its password (default admin)")
    parser.add_argument("--commit", default="", help="NetBox's git commit, written to meta.json")
    args = parser.parse_args(argv)

    url = args.url.rstrip("/") + "/"
    nb = NetBox(url, args.token_file.read_text())
    status = nb.request("GET", "api/status/").json()
    version = status["netbox-version"]
    out = args.out or REPO / "tests" / "fixtures" / "netbox" / version / "sites"
    print(f"NetBox {version} at {url}; recording into {out}")
    meta: dict = {
        "netbox_version": version, "netbox_commit": args.commit, "django_version": status.get("django-version"),
        "netbox_python": status.get("python-version"), "recorder_python": platform.python_version(),
        "recorded": datetime.date.today().isoformat(), "steps": [], "refused": [], "accepted_odd": [],
        "available_power_unit": "NetBox's CSV column 'Available Power (VA)'; the REST API does not return it",
        "available_power": {}, "site_filter_ids": {},
    }

    def snap(step: str, change: str, **extra) -> None:
        record(nb, out / step)
        record_csv_exports(url, args.username, args.password, out / step)
        meta["steps"].append({"step": step, "change": change, **extra})
        meta["available_power"][step] = available_power(out / step)
        # What NetBox's own ?site=<slug> filter answers, so a stand-in's filter can be checked against it.
        meta["site_filter_ids"][step] = {
            slug: {ep: sorted(o["id"] for o in nb.list(f"dcim/{ep}", site=slug)) for ep in SITE_FILTERED}
            for slug in SITES
        }

    b = build(nb, meta)
    snap("s1-two-sites",
         f"sites sto1 (id {b.sites['sto1']['id']}) and got1 (id {b.sites['got1']['id']}), each with location "
         f"hall-1, racks {', '.join(RACKS)}, panels PP-A and PP-B, A and B feeds and PDUs per rack; got1 also DC-1 "
         f"to R-B01-PDU-DC and the uncabled feeds A02-F (failed), P-1 (planned) and DC-3P",
         site_ids={s: b.sites[s]["id"] for s in SITES})

    deleted = delete_feed(nb, b)
    snap(deleted.pop("step"), deleted.pop("change"), **deleted)

    rack = b.racks[("sto1", "R-B01")]
    done = rename(nb, "dcim/racks", rack, "R-B01-NEW")
    snap("s3-rack-renamed", f"renamed sto1's rack R-B01 to {done['name']} (rack id {done['id']})", rack_id=done["id"])

    panel = b.panels[("got1", "PP-B")]
    done = rename(nb, "dcim/power-panels", panel, "PP-B2")
    snap("s4-panel-renamed", f"renamed got1's power panel PP-B to {done['name']} (power-panel id {done['id']})",
         panel_id=done["id"])

    got_a = nb.patch("dcim/power-feeds", b.feeds[("got1", "A01-A")]["id"], {"max_utilization": 60})
    sto_a = nb.patch("dcim/power-feeds", b.feeds[("sto1", "A01-A")]["id"], {"amperage": 20})
    snap("s5-utilization-edited",
         f"got1's feed PP-A/A01-A (power-feed id {got_a['id']}) max_utilization 80 -> {got_a['max_utilization']} %; "
         f"sto1's feed PP-A/A01-A (power-feed id {sto_a['id']}) amperage 16 -> {sto_a['amperage']} A",
         feed_ids={"got1/A01-A": got_a["id"], "sto1/A01-A": sto_a["id"]})

    dump(out / "meta.json", meta)
    print(f"wrote {out / 'meta.json'}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except NetBoxError as exc:
        sys.exit(f"netbox_record_sites: {exc}")
