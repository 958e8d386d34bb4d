#!/usr/bin/env python3
"""Build a small facility in a real NetBox and record NetBox's answers as test fixtures.

Standalone: needs only the standard library and `requests`; no test imports it. It talks to a NetBox
you run yourself (see tests/fixtures/netbox/README.md for the setup) and:

1. builds the facility through the REST API, finding or creating (and patching back) every object by
   its natural key, so a re-run against the same NetBox restores the `base` state even after the
   `rack-deleted` step of an earlier run;
2. records snapshot `base`: every object of a fixed list of endpoints, the two CSV exports of
   /dcim/power-feeds/ a logged-in UI user can download, and NetBox's answer to a doubled `/api` URL;
3. deletes rack R-B02 the way an operator has to (unrack its servers, delete its PDUs, detach its
   feeds, which NetBox protects the rack with, then delete the rack) and records snapshot `rack-deleted`.

    python scripts/netbox_record.py --url http://127.0.0.1:8800 --token-file ~/.netbox-token

The token file holds a v1 token (40 characters, sent as `Authorization: Token <token>`) or a v2 token
(`nbt_<key>.<token>`, sent as `Authorization: Bearer nbt_<key>.<token>`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from urllib.parse import urljoin

import requests

REPO = Path(__file__).resolve().parent.parent

# Endpoints recorded per snapshot; "status" is an object, the others are lists of objects.
ENDPOINTS = [
    "status",
    "dcim/sites",
    "dcim/locations",
    "dcim/racks",
    "dcim/rack-groups",
    "dcim/power-panels",
    "dcim/power-feeds",
    "dcim/power-ports",
    "dcim/power-outlets",
    "dcim/devices",
    "dcim/cables",
]

# name: (panel, rack as (location slug, rack name) or None, status, type, supply, phase, volts, amps, max_util)
FEEDS = [
    ("MDB-A", "A1", ("row-1", "R-A01"), "active", "primary", "ac", "three-phase", 415, 32, 80),
    ("MDB-B", "B1", ("row-1", "R-A01"), "active", "redundant", "ac", "three-phase", 415, 32, 80),
    ("MDB-A", "A2", ("row-1", "R-A02"), "active", "primary", "ac", "three-phase", 415, 32, 80),
    ("MDB-B", "B2", ("row-1", "R-A02"), "active", "redundant", "ac", "single-phase", 230, 16, 80),
    ("MDB-A", "A3", ("row-2", "R-B01"), "active", "primary", "ac", "three-phase", 415, 32, 80),
    ("MDB-B", "B3", ("row-2", "R-B01"), "active", "redundant", "ac", "three-phase", 415, 32, 80),
    ("MDB-B", "P3", ("row-2", "R-B01"), "planned", "redundant", "ac", "single-phase", 230, 16, 80),
    ("MDB-A", "A4", ("row-2", "R-B02"), "active", "primary", "ac", "single-phase", 230, 32, 80),
    ("MDB-B", "B4", ("row-2", "R-B02"), "active", "redundant", "ac", "single-phase", 230, 32, 90),
    ("MDB-A", "DC1", ("row-2", "R-C01"), "active", "primary", "dc", "single-phase", -48, 100, 80),
    ("MDB-B", "H2-A1", ("hall-2", "R-A01"), "planned", "primary", "ac", "single-phase", 230, 10, 80),
    ("MDB-C", "A1", None, "offline", "primary", "ac", "three-phase", 400, 63, 80),
]

# rack: (location slug, A feed, B feed, nodes on outlets 1, 2, 3 ...)
POWERED_RACKS = {
    "R-A01": ("row-1", "A1", "B1", ["gpu01", "gpu02"]),
    "R-A02": ("row-1", "A2", "B2", ["gpu03", "gpu04"]),
    "R-B01": ("row-2", "A3", "B3", ["gpu05", "gpu06", "gpu09"]),
    "R-B02": ("row-2", "A4", "B4", ["gpu07", "gpu08"]),
}
NODE_U_HEIGHT = 4
DELETED_RACK = "R-B02"


class NetBoxError(RuntimeError):
    pass


def auth_header(token: str) -> str:
    token = token.strip()
    if token.startswith(("Token ", "Bearer ")):
        return token
    return f"Bearer {token}" if token.startswith("nbt_") else f"Token {token}"


def ref(obj) -> object:
    """The comparable value of a field as NetBox answers it: an id for a related object, the value of a choice."""
    if isinstance(obj, dict):
        if "id" in obj:
            return obj["id"]
        if "value" in obj:
            return obj["value"]
    return obj


class NetBox:
    def __init__(self, url: str, token: str):
        self.url = url.rstrip("/") + "/"
        self.http = requests.Session()
        self.http.headers.update({"Authorization": auth_header(token), "Accept": "application/json"})

    def request(self, method: str, path: str, *, ok=(200, 201, 204), **kw) -> requests.Response:
        url = path if path.startswith("http") else urljoin(self.url, path)
        resp = self.http.request(method, url, timeout=60, **kw)
        if resp.status_code not in ok:
            raise NetBoxError(f"{method} {url} -> {resp.status_code}: {resp.text[:2000]}")
        return resp

    def list(self, endpoint: str, **params) -> list[dict]:
        out: list[dict] = []
        url = f"api/{endpoint}/"
        params = {"limit": 1000, **params}
        while url:
            data = self.request("GET", url, params=params).json()
            out.extend(data["results"])
            url, params = data.get("next"), None
        return out

    def find(self, endpoint: str, **filters) -> dict | None:
        found = self.list(endpoint, **filters)
        if len(found) > 1:
            raise NetBoxError(f"{endpoint} {filters}: {len(found)} objects match, expected at most one")
        return found[0] if found else None

    def get(self, endpoint: str, pk: int) -> dict:
        return self.request("GET", f"api/{endpoint}/{pk}/").json()

    def create(self, endpoint: str, data: dict) -> dict:
        return self.request("POST", f"api/{endpoint}/", json=data).json()

    def patch(self, endpoint: str, pk: int, data: dict) -> dict:
        return self.request("PATCH", f"api/{endpoint}/{pk}/", json=data).json()

    def delete(self, endpoint: str, pk: int) -> None:
        self.request("DELETE", f"api/{endpoint}/{pk}/")

    def ensure(self, endpoint: str, lookup: dict, data: dict) -> dict:
        """Find the object by `lookup` (API filters), creating it from `data` or patching differing fields."""
        obj = self.find(endpoint, **lookup)
        if obj is None:
            print(f"  create {endpoint} {lookup}")
            return self.create(endpoint, data)
        diff = {k: v for k, v in data.items() if (ref(obj.get(k)) or None) != (v or None)}
        if diff:
            print(f"  patch {endpoint} {obj['id']} {diff}")
            return self.patch(endpoint, obj["id"], diff)
        return obj


def ensure_cable(nb: NetBox, a_type: str, a: dict, b_type: str, b: dict) -> None:
    """Cable termination a to b unless they are already cabled to each other."""
    a_ep = {"powerfeed": "dcim/power-feeds", "poweroutlet": "dcim/power-outlets"}[a_type]
    a, b = nb.get(a_ep, a["id"]), nb.get("dcim/power-ports", b["id"])
    if a["cable"] or b["cable"]:
        if a["cable"] and b["cable"] and ref(a["cable"]) == ref(b["cable"]):
            return
        raise NetBoxError(f"{a['display']} / {b['display']} already cabled elsewhere")
    print(f"  cable {a_type} {a['display']} -> {b['device']['name']} {b['name']}")
    nb.create("dcim/cables", {
        "a_terminations": [{"object_type": f"dcim.{a_type}", "object_id": a["id"]}],
        "b_terminations": [{"object_type": "dcim.powerport", "object_id": b["id"]}],
        "status": "connected",
    })


def build(nb: NetBox) -> None:
    print("building the facility")
    # Deleting a device leaves its cables behind with one or both ends empty (see delete_rack); drop them so
    # that a re-run after the rack-deleted step can cable the restored PDUs again.
    for cable in nb.list("dcim/cables"):
        if not cable["a_terminations"] or not cable["b_terminations"]:
            print(f"  delete dangling cable {cable['display']}")
            nb.delete("dcim/cables", cable["id"])
    mfr = nb.ensure("dcim/manufacturers", {"slug": "acme"}, {"name": "Acme", "slug": "acme"})
    roles = {
        slug: nb.ensure("dcim/device-roles", {"slug": slug}, {"name": name, "slug": slug, "color": color})
        for slug, name, color in [("pdu", "PDU", "ff9800"), ("gpu-server", "GPU server", "2196f3")]
    }

    types = {}
    for model, u_height in [("PDU-3P", 0), ("PDU-1P", 0), ("GPU-8x", NODE_U_HEIGHT)]:
        slug = model.lower()
        types[model] = nb.ensure("dcim/device-types", {"slug": slug}, {
            "manufacturer": mfr["id"], "model": model, "slug": slug, "u_height": u_height,
            "is_full_depth": u_height > 0,
        })
    for model, legs in [("PDU-3P", "ABCABC"), ("PDU-1P", [None] * 6)]:
        dt = types[model]["id"]
        inlet = nb.ensure("dcim/power-port-templates", {"device_type_id": dt, "name": "input"},
                          {"device_type": dt, "name": "input"})
        for n, leg in enumerate(legs, start=1):
            nb.ensure("dcim/power-outlet-templates", {"device_type_id": dt, "name": str(n)},
                      {"device_type": dt, "name": str(n), "power_port": inlet["id"], "feed_leg": leg or ""})
    for psu in ("PSU1", "PSU2"):
        dt = types["GPU-8x"]["id"]
        nb.ensure("dcim/power-port-templates", {"device_type_id": dt, "name": psu},
                  {"device_type": dt, "name": psu, "maximum_draw": 5000, "allocated_draw": 4200})

    site = nb.ensure("dcim/sites", {"slug": "dc1"}, {"name": "DC1", "slug": "dc1", "status": "active"})
    sid = site["id"]
    loc = {}
    for slug, name, parent in [("hall-1", "Hall 1", None), ("row-1", "Row 1", "hall-1"),
                               ("row-2", "Row 2", "hall-1"), ("hall-2", "Hall 2", None)]:
        loc[slug] = nb.ensure("dcim/locations", {"site_id": sid, "slug": slug}, {
            "site": sid, "name": name, "slug": slug, "status": "active",
            "parent": loc[parent]["id"] if parent else None,
        })

    racks = {}
    for loc_slug, name, status in [("row-1", "R-A01", "active"), ("row-1", "R-A02", "active"),
                                   ("row-2", "R-B01", "active"), ("row-2", "R-B02", "active"),
                                   ("row-2", "R-C01", "active"), ("hall-2", "R-A01", "planned")]:
        lid = loc[loc_slug]["id"]
        racks[(loc_slug, name)] = nb.ensure("dcim/racks", {"location_id": lid, "name": name}, {
            "site": sid, "location": lid, "name": name, "status": status, "u_height": 42,
        })

    panels = {}
    for name, loc_slug in [("MDB-A", "hall-1"), ("MDB-B", "hall-1"), ("MDB-C", None)]:
        panels[name] = nb.ensure("dcim/power-panels", {"site_id": sid, "name": name}, {
            "site": sid, "name": name, "location": loc[loc_slug]["id"] if loc_slug else None,
        })

    feeds = {}
    for panel, name, rack, status, ftype, supply, phase, volts, amps, util in FEEDS:
        pid = panels[panel]["id"]
        feeds[(panel, name)] = nb.ensure("dcim/power-feeds", {"power_panel_id": pid, "name": name}, {
            "power_panel": pid, "name": name, "rack": racks[rack]["id"] if rack else None, "status": status,
            "type": ftype, "supply": supply, "phase": phase, "voltage": volts, "amperage": amps,
            "max_utilization": util,
        })
    phase_of = {name: phase for panel, name, _r, _s, _t, _su, phase, *_ in FEEDS if panel != "MDB-C"}

    for rack_name, (loc_slug, feed_a, feed_b, nodes) in POWERED_RACKS.items():
        rack = racks[(loc_slug, rack_name)]
        placed = {"site": sid, "location": loc[loc_slug]["id"], "rack": rack["id"], "status": "active"}
        pdus = {}
        for side, panel, feed in [("A", "MDB-A", feed_a), ("B", "MDB-B", feed_b)]:
            model = "PDU-3P" if phase_of[feed] == "three-phase" else "PDU-1P"
            name = f"{rack_name}-PDU-{side}"
            pdus[side] = nb.ensure("dcim/devices", {"site_id": sid, "name": name}, {
                "name": name, "device_type": types[model]["id"], "role": roles["pdu"]["id"], **placed,
            })
            inlet = nb.find("dcim/power-ports", device_id=pdus[side]["id"], name="input")
            ensure_cable(nb, "powerfeed", feeds[(panel, feed)], "powerport", inlet)
        for n, node in enumerate(nodes, start=1):
            dev = nb.ensure("dcim/devices", {"site_id": sid, "name": node}, {
                "name": node, "device_type": types["GPU-8x"]["id"], "role": roles["gpu-server"]["id"],
                **placed, "position": 1 + (n - 1) * NODE_U_HEIGHT, "face": "front",
            })
            for side, psu in [("A", "PSU1"), ("B", "PSU2")]:
                outlet = nb.find("dcim/power-outlets", device_id=pdus[side]["id"], name=str(n))
                port = nb.find("dcim/power-ports", device_id=dev["id"], name=psu)
                ensure_cable(nb, "poweroutlet", outlet, "powerport", port)


def delete_rack(nb: NetBox, meta: dict) -> None:
    """Delete R-B02 the way an operator has to: NetBox PROTECTs a rack from its devices and its power feeds."""
    print(f"deleting rack {DELETED_RACK}")
    site = nb.find("dcim/sites", slug="dc1")
    row2 = nb.find("dcim/locations", site_id=site["id"], slug="row-2")
    rack = nb.find("dcim/racks", location_id=row2["id"], name=DELETED_RACK)
    for dev in nb.list("dcim/devices", rack_id=rack["id"]):
        if dev["name"].startswith(f"{DELETED_RACK}-PDU-"):
            print(f"  delete device {dev['name']}")
            nb.delete("dcim/devices", dev["id"])
        else:
            print(f"  unrack {dev['name']}")
            nb.patch("dcim/devices", dev["id"], {"rack": None, "position": None, "face": ""})
    # With the devices gone, the rack's power feeds still protect it: record that refusal, then detach them.
    resp = nb.request("DELETE", f"api/dcim/racks/{rack['id']}/", ok=(204, 409))
    if resp.status_code == 409:
        meta["rack_delete_refused"] = {"status": resp.status_code, "body": resp.json()}
        for feed in nb.list("dcim/power-feeds", rack_id=rack["id"]):
            print(f"  detach feed {feed['power_panel']['name']}/{feed['name']} from the rack")
            nb.patch("dcim/power-feeds", feed["id"], {"rack": None})
        nb.delete("dcim/racks", rack["id"])
    print(f"  deleted rack {DELETED_RACK}")


def dump(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


def record(nb: NetBox, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for endpoint in ENDPOINTS:
        if endpoint == "status":
            data = nb.request("GET", "api/status/").json()
        else:
            data = sorted(nb.list(endpoint), key=lambda o: o["id"])
        dump(out / f"{endpoint.replace('/', '_')}.json", data)
    print(f"recorded {out}")


def record_csv_exports(url: str, username: str, password: str, out: Path) -> None:
    """Download /dcim/power-feeds/ exports as a logged-in UI user: ?export=table and ?export (All data)."""
    ui = requests.Session()
    login = urljoin(url, "login/")
    ui.get(login, timeout=60).raise_for_status()
    resp = ui.post(login, timeout=60, allow_redirects=False, headers={"Referer": login}, data={
        "csrfmiddlewaretoken": ui.cookies["csrftoken"], "username": username, "password": password, "next": "/",
    })
    if resp.status_code != 302:
        raise NetBoxError(f"UI login as {username} failed: {resp.status_code}")
    for query, name in [("export=table", "current-view"), ("export", "all-data")]:
        resp = ui.get(urljoin(url, f"dcim/power-feeds/?{query}"), timeout=60)
        if resp.status_code != 200 or "text/csv" not in resp.headers.get("Content-Type", ""):
            raise NetBoxError(f"CSV export ?{query}: {resp.status_code} {resp.headers.get('Content-Type')}")
        (out / f"power-feeds.{name}.csv").write_bytes(resp.content)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8800", help="NetBox base URL (without /api)")
    parser.add_argument("--token-file", required=True, type=Path, help="file holding a write-enabled API token")
    parser.add_argument("--out", type=Path, help="default: tests/fixtures/netbox/<netbox-version>/")
    parser.add_argument("--username", default="admin", help="UI user for the CSV exports (default admin)")
    parser.add_argument("--password", default="admin", help="its password (default admin)")
    args = parser.parse_args(argv)

    url = args.url.rstrip("/") + "/"
    nb = NetBox(url, args.token_file.read_text())
    version = nb.request("GET", "api/status/").json()["netbox-version"]
    out = args.out or REPO / "tests" / "fixtures" / "netbox" / version
    print(f"NetBox {version} at {url}; recording into {out}")

    build(nb)
    record(nb, out / "base")
    record_csv_exports(url, args.username, args.password, out / "base")
    wrong = nb.http.get(urljoin(url, "api/api/dcim/racks/"), timeout=60)
    (out / "base" / "wrong-url-404.html").write_bytes(wrong.content)
    meta = {
        "netbox_version": version,
        "recorded": datetime.date.today().isoformat(),
        "wrong_url_status": wrong.status_code,
        "wrong_url_content_type": wrong.headers.get("Content-Type"),
    }

    delete_rack(nb, meta)
    record(nb, out / "rack-deleted")
    dump(out / "meta.json", meta)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except NetBoxError as exc:
        sys.exit(f"netbox_record: {exc}")
