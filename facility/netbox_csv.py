"""NetBox's CSV export of power feeds as the plan of an import (offline sites; no cables, so no PDU and no
node label): each feed supplies the rack it names. The export's Site column (the rack's site's name) tells
two sites' racks apart as the API's objects do, and its ID column is each feed's identity across imports.
"""

from __future__ import annotations

import csv
import io
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping

from facility import feeds as pure
from facility.netbox import Known, NetboxPlan, _feeds, _FoundFeed, safe_name
from llmgw.errors import InvalidInput


def plan_from_csv(text: str, *, default_utilization: float | None = None,
                  known: Mapping[tuple[str, int], Known] | None = None,
                  feed_racks: Mapping[int, Iterable[str]] | None = None) -> NetboxPlan:
    """NetBox's CSV export of power feeds ("All data", or the current view with the needed columns).

    Each feed supplies the rack it names (the export has no cables, so no PDU and no node label). An
    export without a max utilization column is refused, unless ``default_utilization`` (%) is given:
    NetBox's current-view export leaves that column out, and guessing 80 % would hide a 90 % feed. A
    Site column tells two sites' racks and feeds apart as the API's objects do; an ID column is each
    feed's identity across imports, and ``feed_racks`` (each known feed's racks as stored, by its id) keeps
    the name a rack had while the export still calls it the same.
    """
    known = known or {}
    feed_racks = feed_racks or {}
    problem = pure.utilization_problem(default_utilization)
    if problem:
        raise InvalidInput(f"default_utilization: {problem}", field="default_utilization")
    reader = csv.reader(io.StringIO(text.lstrip("\ufeff")))
    try:
        header = next(reader, None)
        if header is None:
            raise InvalidInput("csv: empty; export NetBox's power feeds (Export → All data)", field="csv")
        columns = [h.strip().lower().replace(" ", "_") for h in header]
        twice = sorted({c for c in columns if c and columns.count(c) > 1})
        if twice:  # the last column of a name would be read alone, the other unseen
            raise InvalidInput(f"csv line 1: column {twice[0]} is given twice", field="csv")
        for need in ("name", "voltage", "amperage", "phase"):
            if need not in columns:
                raise InvalidInput(f"csv line 1: column {need} is missing (NetBox's header: {need.replace('_', ' ').title()})", field="csv")
        if "max_utilization" not in columns and default_utilization is None:
            raise InvalidInput(
                "csv line 1: column max_utilization is missing (NetBox's current-view export leaves it out): "
                "export All data, or give --default-utilization PERCENT", field="csv",
            )
        rows = []
        for row in reader:
            line = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(columns):
                raise InvalidInput(f"csv line {line}: {len(row)} fields where the header has {len(columns)}", field="csv")
            rows.append({k: v.strip() for k, v in zip(columns, row, strict=True)})
    except csv.Error as exc:
        raise InvalidInput(f"csv line {reader.line_num}: {exc}", field="csv") from exc
    plan = NetboxPlan()
    # The export names a site by its name: its slug is what an import through the API recorded for it,
    # else the name as NetBox makes a slug of it.
    slug_of = {k.named_from: k.name for (kind, _), k in known.items() if kind == "site"}
    for values in rows:
        if values.get("site"):
            values["site"] = slug_of.get(values["site"]) or re.sub(r"[^a-z0-9_]+", "-", values["site"].lower()).strip("-")
    # Racks by (site, name): the export has no rack ids, so an earlier import's name is found by what it
    # was made from; a name two sites share is qualified by the site, as the API's objects are.
    # Two racks of one site and name (two locations) are one to the export: the one named plainly.
    by_made: dict[str, str] = {}
    for (kind, _), k in sorted(known.items(), key=lambda kv: (-len(kv[1].name), kv[1].name)):
        if kind == "rack":
            by_made[k.named_from] = k.name
    rack_sites: dict[str, set[str]] = defaultdict(set)
    for values in rows:
        if values.get("rack"):
            rack_sites[safe_name(values["rack"])].add(safe_name(values.get("site")))
    for (kind, _), k in known.items():
        if kind == "rack":
            rack_sites[safe_name(k.named_from.split("/", 1)[-1])].add(k.site)
    found = []
    for values in rows:
        site, rack = safe_name(values.get("site")), safe_name(values.get("rack"))
        ext = values.get("id", "")
        if rack:
            made = f"{site}/{values['rack']}"
            before = [r for r in feed_racks.get(int(ext), ()) if r == rack or r.endswith(f".{rack}")] if ext.isdigit() else []
            rack = by_made.get(made) or (before[0] if before else None) or (
                f"{site}.{rack}" if site and len(rack_sites[rack]) > 1 else rack)
        found.append(_FoundFeed(int(ext) if ext.isdigit() else None, site, safe_name(values.get("power_panel")),
                                safe_name(values.get("name")), values, (), (rack,) if rack else ()))
    _feeds(found, plan, known, default_utilization=default_utilization)
    return plan
