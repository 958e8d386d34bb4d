"""Every listing of `llmgw ctl` fits 120 columns as a table for people, however wide what it lists: long
node, domain and model names, a hold's reason, a rolled-up condition, a leg's SOURCE, a pending replica's
reason, a no-fit's figures. `-o wide` prints every column and cell whole. The rows are what the API
answers (ctl's remote mode), from a facility wider than the demo's."""

from __future__ import annotations

import pytest

from llmgw.ctl import build_parser, parse
from llmgw.output import WIDTH, print_table, wrapped

NODE = "gpu-sto1-hall-b-r12-07-node-04"
RACK, PDU_A, PDU_B = "r12-07", "r12-07-a", "r12-07-b"
NOFIT = (
    "no node fits (1,024 nodes): 612 × gpu: 8 requested, 0 free; 301 × needs gpu.model in (H100,H200,B200); "
    + "; ".join(
        f"2 × rack r12-0{i}: 19.8 kW of a 22.5 kW limit (25.0 kW cap less 10%) in use, 24.7 kW with the shard (~5.6 kW)"
        for i in range(3)
    )
    + "; 1 × leg r12-07-a.C: 7.9 kW of a 8.6 kW limit (9.6 kW cap less 10%) in use, 10.3 kW with the shard (~2.4 kW)"
    + "; 106 more nodes for 31 other reasons"
)
HOLD_REASON = "PDU swap on the B side, ticket CHG-20431: the breaker and its whip are replaced, then tested under load"
CONDITION = {"condition": "hot", "mode": "observe", "detail": "inlet 35.0 °C", "overridden": False,
             "readings": {"inlet_temp_c": 35.04, "thermal_throttle_share": 0.25, "cooling_alarm": 1.0},
             "age_seconds": 120.0, "inlet": 35.04, "judged_at": None, "stale": False}
PROFILE = {"gpus": 8, "nodes": 2, "cpu_cores": 64, "memory_gib": 1024.0, "power_watts": 12000.0,
           "keep_within": "rack", "node_selector": "gpu.model in (H100,H200,B200), llmgw.io/room in (hall-a,hall-b)",
           "topology": "nvlink-all"}


def domain(name: str, *, source: str | None, hold: bool) -> dict:
    return {
        "domain": name, "nodes": [f"{NODE}{i}" for i in range(48)], "use_watts": 123456.0, "reserved_watts": 98765.0,
        "measured_watts": 111111.0, "limit_watts": 130000.0, "cap_source": source, "over_limit": True,
        "cap_warning": f"its written budget of 30.0 kW is above what feed A1207 415 V 63 A 3φ 80 % carries ({name})",
        "condition": {**CONDITION, "condition": "ok", "overridden": True},
        "rolled_up": {"condition": "hot", "from": f"rack {RACK}"},
        "hold": {"reason": HOLD_REASON, "drain": True, "drain_text": "12 left, 3 moving, 2 blocked"} if hold else None,
    }


def shard(node: str) -> dict:
    return {"node": node, "gpus": list(range(8)), "cpu_cores": 64, "memory_gib": 1024.0}


REPLICAS = [
    {"model": "llama-3.1-405b-instruct-fp8", "ordinal": 12, "state": "pending", "shards": [], "reason": NOFIT,
     "summary": NOFIT, "rejections": [], "nodes_checked": 1024},
    {"model": "llama-3.1-405b-instruct-fp8", "ordinal": 13, "state": "ready",
     "shards": [shard(f"{NODE}{i}") for i in range(4)], "reason": None,
     "why": "shares no rack or pdu with the model's 12 replicas; " * 3 + "leaves 0 GPUs free",
     "notes": ["observed: " + NOFIT], "summary": None, "conflicts": [NOFIT],
     "rejections": [{"node": f"{NODE}{i}", "reason": NOFIT} for i in range(3)], "passed_over": 40},
]

ANSWERS = {
    "nodes": [
        {"name": NODE, "state": "not-ready", "gpus": {"free": 16, "total": 16}, "condition": "hot observed",
         "location": {"site": "sto1", "room": "hall-b", "row": "12", "rack": RACK, "pdu": f"{PDU_A},{PDU_B}",
                      "leg": f"{PDU_A}.A,{PDU_B}.C"},
         "warnings": [f"its labels put it in rack {RACK}, NetBox in rack r12-08: " + NOFIT]},
    ],
    f"nodes/{NODE}": {
        "name": NODE, "state": "ready", "gpus": {"free": 0, "total": 16},
        "location": {"site": "sto1", "room": "hall-b", "row": "12", "rack": RACK, "pdu": f"{PDU_A},{PDU_B}",
                     "leg": f"{PDU_A}.A,{PDU_B}.C"},
        "power_source": "bmc", "bmc_watts": 10200.0, "bmc": {"resource": "/redfish/v1/Chassis/1/Power", "state": "down",
                                                             "reason": NOFIT},
        "warnings": [NOFIT], "inventory_pending": {"changes": [NOFIT]},
        "gpu_topology": {"links": [["X" if i == j else "NV18" for j in range(16)] for i in range(16)],
                         "numa": [i // 8 for i in range(16)]},
        "gpu_list": [{"index": i, "model": "NVIDIA H200-SXM5-141GB", "memory_gib": 141.0,
                      "replica_name": "llama-3.1-405b-instruct-fp8#13"} for i in range(16)],
    },
    "facility": {
        "settings": {"measured_window_seconds": 900.0},
        "domains": [domain(f"leg:{PDU_A}.A", source="feed A1207 415 V 63 A 3φ 80 %, leg A (a third)", hold=False),
                    domain(f"rack:{RACK}", source="budget", hold=True),
                    domain("room:hall-b-east-extension", source=None, hold=True)],
        "sources": [{"name": "prometheus-hall-b", "up": False, "last_error": NOFIT, "last_success_at": None}],
        "node_drains": {NODE: {"left": 3, "moving": 1, "blocked": [{"replica": "llama-3.1-405b#13", "reason": NOFIT}]}},
    },
    "facility/feeds": {
        "feeds": [{"name": "A1207-row12-east", "voltage": 415.0, "amperage": 63.0, "phase": "three", "supply": "ac",
                   "status": "failed", "max_utilization": 0.8, "text": "feed A1207-row12-east 415 V 63 A 3φ 80 %", "capacity_watts": 36226.0, "load_watts": 30123.0,
                   "reserved_watts": 28000.0, "measured_watts": 29000.0,
                   "pdus": [f"r12-{i:02}-a" for i in range(1, 13)], "racks": [f"r12-{i:02}" for i in range(1, 13)],
                   "legs": [{"pdu": "r12-01-a-east-extension", "imbalance": 0.908, "legs": [
                       {"leg": leg, "use_watts": 6030.0, "limit_watts": 8625.6} for leg in "ABC"]}]}],
        "unfed_pdus": [{"text": f"pdu {PDU_B}: no feed reaches it (NetBox); its nodes run on their other PDUs alone: "
                        + ", ".join(f"{NODE}{i}" for i in range(8))}],
    },
    "facility/feed-loss": {
        "feeds": [{"feed": "A1207-row12-east", "failed": True,
                   "violations": [{"text": "rack r12-07 would carry 24.7 kW of a 22.5 kW limit: " + NOFIT}],
                   "carried": [{"feed": "B1207-row12-west", "load_watts": 30123.0, "capacity_watts": 36226.0}]}],
        "violations": 1, "text": "1 violation: " + NOFIT,
    },
    "facility/events": [
        {"at": "2026-12-07T20:35:30.353222+00:00", "domain": f"leg:{PDU_A}.A", "from": "unknown", "to": "hot",
         "reason": "inlet 35.0 °C past 32.0 °C for 3 readings (source prometheus-hall-b); " + NOFIT},
    ],
    "facility/shed": {"enabled": True, "moves": [
        {"at": "2026-12-07T20:35:30", "domain": f"leg:{PDU_A}.A", "action": "move",
         "replica": "llama-3.1-405b-instruct-fp8#13", "class": "batch", "to": [f"{NODE}{i}" for i in range(4)],
         "reason": NOFIT}]},
    "models": [
        {"name": "llama-3.1-405b-instruct-fp8", "replicas": {"desired": 128, "placed": 100, "ready": 99, "pending": 28},
         "class": "critical", "min_ready": 64, "profile": PROFILE, "error": NOFIT, "error_at": "2026-12-07T20:35:30",
         "efficiency": [{"gpu_model": gpu, "tokens_per_joule": 3.1, "tokens_per_second": 24000.0}
                        for gpu in ("NVIDIA H200-SXM5-141GB", "NVIDIA H100-SXM5-80GB", "NVIDIA B200")]},
    ],
    "replicas": [{**r, "shards": r["shards"] or [shard(f"{NODE}{i}") for i in range(3)]} for r in REPLICAS],
    "models/llama-3.1-405b-instruct-fp8/explain": {
        "model": "llama-3.1-405b-instruct-fp8", "desired": 128, "placed": 100, "pending": 28, "profile": PROFILE,
        "replicas_total": 2, "replicas": REPLICAS,
    },
    "models/llama-3.1-405b-instruct-fp8/headroom": {
        "model": "llama-3.1-405b-instruct-fp8", "existing": 100, "fits": 0, "why_not": NOFIT,
    },
}

LISTINGS = [
    ["nodes"], ["node", NODE], ["facility"], ["facility", "feeds"], ["facility", "feed-loss"], ["facility", "events"],
    ["facility", "shed", "--dry-run"], ["models"], ["replicas"], ["explain-placement", "llama-3.1-405b-instruct-fp8"],
    ["headroom", "llama-3.1-405b-instruct-fp8"],
]


class Answers:
    """A remote control plane that answers each GET with the rows above (ctl's remote mode)."""

    headers: dict = {}

    def call(self, method, path, params=None, **_):
        answer = ANSWERS[path]
        return answer if not (params or {}).get("offset") else []


def printed(capsys, argv: list[str]) -> list[str]:
    args = parse(build_parser(), argv)
    args.remote = Answers()
    args.handler(args)
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("argv", LISTINGS, ids=" ".join)
def test_every_listing_fits_120_columns(capsys, argv):
    lines = printed(capsys, argv)
    assert len(lines) > 1
    assert [line for line in lines if len(line) > WIDTH] == []


def test_wide_prints_every_column_and_cell_whole(capsys):
    table = printed(capsys, ["facility"])
    assert table[0].split() == ["DOMAIN", "NODES", "USE", "LIMIT", "CONDITION", "HOLD", "SOURCE"]
    assert table[1].split("  ")[-1].endswith("…")  # the leg's SOURCE, cut
    wide = printed(capsys, ["facility", "-o", "wide"])
    assert wide[0].split() == ["DOMAIN", "NODES", "USE", "LIMIT", "RESERVED", "MEASURED", "PEAK", "15m", "CONDITION",
                               "HOLD", "SOURCE"]
    assert wide[1].endswith("feed A1207 415 V 63 A 3φ 80 %, leg A (a third)")
    assert f"held (drain: 12 left, 3 moving, 2 blocked): {HOLD_REASON}" in wide[2]
    assert "hot from rack r12-07; its own: ok (set by hand, inlet 35.0 °C, 25% throttling, alarm 1, 120 s old)" in wide[1]
    models = printed(capsys, ["models", "-o", "wide"])
    assert "NVIDIA B200 3.10 tok/J 24,000 tok/s" in models[1]
    assert max(len(line) for line in models) > WIDTH


def test_a_cut_column_keeps_its_start_and_says_so():
    lines: list[str] = []

    class Out:
        def write(self, text):
            lines.append(text)

    print_table(["NAME", "REASON"], [["gpu01", "r" * 200], ["gpu02", "short"]], out=Out(), cut=("REASON",))
    assert [len(line.rstrip("\n")) for line in lines] == [13, WIDTH, 12]
    assert lines[1] == "gpu01  " + "r" * (WIDTH - 8) + "…\n"


def test_a_long_line_breaks_after_its_reasons():
    lines = wrapped("the next one does not: " + NOFIT)
    assert lines[0].startswith("the next one does not: no node fits (1,024 nodes): 612 × gpu: 8 requested, 0 free;")
    assert all(len(line) <= WIDTH for line in lines)
    assert all(line.startswith("  ") for line in lines[1:])
    assert " ".join(line.strip() for line in lines) == "the next one does not: " + NOFIT
