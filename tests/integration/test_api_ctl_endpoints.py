"""The endpoints that make every `llmgw ctl` command work remotely: files applied whole, shed and capping,
tokens, NetBox. Authenticated, role-checked, bounded, refused naming the field, nothing half-applied."""

from __future__ import annotations

import pytest

from facility.models import Budget, FacilitySettings, Feed, ScenarioRun
from placement.models import Model

pytestmark = pytest.mark.django_db

WRITES = [
    ("post", "/api/v1/apply", {"text": "kind: Model\nname: m\nreplicas: 1\nprofile: {gpus: 1}\n"}),
    ("post", "/api/v1/facility/apply", {"text": "facility:\n  margin: 0.2\n"}),
    ("post", "/api/v1/facility/import/netbox", {"csv": "Name,Voltage,Amperage,Phase\n"}),
    ("post", "/api/v1/tokens", {"username": "bob", "role": "viewer"}),
    ("post", "/api/v1/nodes/gpu01/token", None),
]
READS = ["/api/v1/facility/shed", "/api/v1/facility/capping"]


@pytest.mark.parametrize(("method", "url", "body"), WRITES)
def test_no_change_without_a_token_or_by_a_viewer(anon_api, viewer_api, method, url, body):
    assert getattr(anon_api, method)(url, body, format="json").status_code == 401
    response = getattr(viewer_api, method)(url, body, format="json")
    assert response.status_code == 403
    assert response.json()["detail"].startswith("your role does not allow this: ")
    assert not Model.objects.exists() and FacilitySettings.load().margin != 0.2


@pytest.mark.parametrize("url", READS)
def test_shed_and_capping_are_a_viewers_reads(anon_api, viewer_api, url):
    assert anon_api.get(url).status_code == 401
    body = viewer_api.get(url).json()
    assert body["enabled"] is False


def test_shed_intervals_are_bounded(viewer_api):
    for bad in ("0", "101", "x", "²", "-1"):
        response = viewer_api.get("/api/v1/facility/shed", {"intervals": bad})
        assert (response.status_code, response.json()["field"]) == (400, "intervals"), bad
    assert viewer_api.get("/api/v1/facility/shed", {"intervals": "100"}).json() == {"enabled": False, "moves": []}


def test_tokens_are_an_admins_to_make(api, make_user):
    from rest_framework.test import APIClient

    response = api.post("/api/v1/tokens", {"username": "bob", "role": "viewer"}, format="json")
    assert response.status_code == 403  # an operator's token makes no token
    assert response.json()["detail"] == "your role does not allow this: tokens are made by an admin (a staff user)"
    admin, key = make_user("alice", "viewer")
    admin.is_staff = True
    admin.save()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    body = client.post("/api/v1/tokens", {"username": "bob", "role": "operator"}, format="json").json()
    assert (body["username"], body["role"], len(body["token"])) == ("bob", "operator", 40)
    for bad, field in (({"username": "x" * 151, "role": "viewer"}, "username"), ({"username": "bob", "role": "root"},
                       "role"), ({"username": "bob", "role": "viewer", "admin": True}, "admin")):
        response = client.post("/api/v1/tokens", bad, format="json")
        assert (response.status_code, response.json()["field"]) == (400, field), bad
    for name in ("bo b", "ev\x1b[2Jil", "bob\n", "bo\u200bb"):
        response = client.post("/api/v1/tokens", {"username": name, "role": "operator"}, format="json")
        assert response.status_code == 400
        assert response.json() == {
            "detail": f"username: {name!r} is not a username: letters, digits and @ . + - _ only", "field": "username"
        }
    # A bidirectional control is refused as any body's is, before the username's own rule.
    response = client.post("/api/v1/tokens", {"username": "x\u202ey", "role": "operator"}, format="json")
    assert (response.status_code, response.json()["field"]) == (400, "username")
    assert "bidirectional control characters (U+202E at character 2)" in response.json()["detail"]
    from django.contrib.auth.models import User

    assert sorted(User.objects.values_list("username", flat=True)) == ["alice", "bob", "operator1"]
    response = client.post("/api/v1/nodes/bad%20name/token", format="json")
    assert (response.status_code, response.json()["field"]) == (400, "node")
    body = client.post("/api/v1/nodes/gpu09/token", format="json").json()  # made before the node joins
    assert body["node"] == "gpu09" and len(body["token"]) > 20


def test_a_file_is_applied_whole_or_refused_naming_its_line(api):
    two = "kind: Model\nname: a\nreplicas: 1\nprofile: {gpus: 1}\n---\nkind: Model\nname: b\nreplicas: -1\nprofile: {gpus: 1}\n"
    response = api.post("/api/v1/apply", {"text": two, "filename": "m.yaml"}, format="json")
    assert response.status_code == 400
    assert response.json()["detail"].startswith("m.yaml line 8: replicas: ")
    assert not Model.objects.exists()
    body = api.post("/api/v1/apply", {"text": two.replace("-1", "2")}, format="json").json()
    assert [(m["name"], m["action"], m["desired"] if "desired" in m else m["replicas"]["desired"])
            for m in body["models"]] == [("a", "created", 1), ("b", "created", 2)]

    server = "facility:\n  margin: 0.2\n  budgets:\n    - {domain: rack:r1, cap_watts: 1000}\n    - {domain: rack:r1, cap_watts: 2}\n"
    response = api.post("/api/v1/facility/apply", {"text": server}, format="json")
    assert response.status_code == 400
    assert response.json()["detail"] == "server.yaml line 5: facility.budgets[1].domain: rack:r1 has a budget already in this file"
    assert FacilitySettings.load().margin != 0.2 and not Budget.objects.exists()


def test_an_apply_that_removes_is_refused_until_confirmed(api):
    api.post("/api/v1/facility/apply", {"text": "facility:\n  budgets:\n    - {domain: rack:r1, cap_watts: 1000}\n"},
             format="json")
    smaller = {"text": "facility:\n  margin: 0.2\n  budgets: []\n", "filename": "small.yaml"}
    response = api.post("/api/v1/facility/apply", smaller, format="json")
    assert (response.status_code, response.json()) == (
        409, {"detail": "small.yaml would remove 1 budget: rack:r1", "field": "confirm"})
    assert FacilitySettings.load().margin != 0.2 and Budget.objects.filter(domain="rack:r1").exists()
    response = api.post("/api/v1/facility/apply", {**smaller, "confirm": "yes"}, format="json")
    assert (response.status_code, response.json()["field"]) == (400, "confirm")
    body = api.post("/api/v1/facility/apply", {**smaller, "confirm": True}, format="json").json()
    assert (body["removed"], body["removed_domains"]) == (1, ["rack:r1"])
    assert FacilitySettings.load().margin == 0.2 and not Budget.objects.exists()


def test_files_and_names_are_bounded(api):
    from facility.serializers import MAX_FILE_CHARS

    for url, body, field in (
        ("/api/v1/apply", {"text": "#" * (MAX_FILE_CHARS + 1)}, "text"),
        ("/api/v1/apply", {"text": "", "filename": "f" * 1001}, "filename"),
        ("/api/v1/apply", {"text": 5}, "text"),
        ("/api/v1/apply", {}, "text"),
        ("/api/v1/facility/apply", {"text": "", "files": {str(i): "" for i in range(9)}}, "files"),
        ("/api/v1/facility/apply", {"text": "", "scenario": "x"}, "scenario"),
        ("/api/v1/facility/import/netbox", {"csv": "", "url": "http://netbox"}, "csv"),
        ("/api/v1/facility/import/netbox", {"url": "http://netbox"}, "token"),
        ("/api/v1/facility/import/netbox", {"csv": "", "site": "sto1"}, "site"),
        ("/api/v1/facility/import/netbox", {"csv": "", "dry_run": "yes"}, "dry_run"),
    ):
        response = api.post(url, body, format="json")
        assert (response.status_code, response.json()["field"]) == (400, field), (url, field)
    # Deep nesting and aliases that repeat a subtree are refused, not walked.
    for text in ("a: " + "[" * 5000 + "]" * 5000, "a: " + "[" * 70 + "]" * 70,
                 "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
                     f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 10) + "]\n"
                     for i in range(8))):
        response = api.post("/api/v1/facility/apply", {"text": text}, format="json")
        assert response.status_code == 400
        assert "nested deeper than 64 levels" in response.json()["detail"] or "more than 500,000 values" in \
            response.json()["detail"]


def test_a_remote_facility_apply_reads_nothing_from_the_servers_disk(api, tmp_path):
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text((__import__("pathlib").Path(__file__).parents[2] / "llmgw/demo/scenarios/crac-failure.yaml").read_text())
    text = f"facility:\n  sources:\n    simulated: {{file: {scenario}}}\n"
    response = api.post("/api/v1/facility/apply", {"text": text, "filename": str(tmp_path / "server.yaml")}, format="json")
    assert response.status_code == 400
    assert response.json()["detail"] == (
        f"{tmp_path / 'server.yaml'} line 3: facility.sources.simulated.file: {scenario}: "
        f"not among the files sent with {tmp_path / 'server.yaml'}"
    )
    assert not ScenarioRun.objects.exists()
    response = api.post("/api/v1/facility/apply", {"text": text, "files": {str(scenario): "kind: nonsense\n"}},
                        format="json")
    assert response.status_code == 400 and response.json()["field"] == "facility.sources.simulated.file"
    response = api.post("/api/v1/facility/apply", {"text": text, "files": {str(scenario): scenario.read_text()}},
                        format="json")
    assert response.status_code == 200, response.content
    assert ScenarioRun.objects.get().name == "crac-failure"


def test_a_netbox_import_by_csv_and_its_dry_run(api, join_node):
    join_node("n1", rack="r1")
    csv = ("Name,Power Panel,Rack,Status,Type,Voltage,Amperage,Phase,Max Utilization\n"
           "A1,panel 1,r1,Active,Primary,415,32,Three-phase,80%\n")
    body = api.post("/api/v1/facility/import/netbox", {"csv": csv, "dry_run": True}, format="json").json()
    assert body["applied"] is False and [f["name"] for f in body["feeds_added"]] == ["A1"]
    assert not Feed.objects.exists()
    # One bad feed is reported by name and skipped, never the whole import.
    response = api.post("/api/v1/facility/import/netbox", {"csv": csv.replace("415", "lots")}, format="json")
    assert response.json()["skipped"] == [
        "power feed panel-1/A1: voltage: 'lots' is not a number; not counted: rack r1 is capped by its other feeds"]
    assert not Feed.objects.exists()
    assert api.post("/api/v1/facility/import/netbox", {"csv": csv}, format="json").json()["applied"] is True
    assert list(Feed.objects.values_list("name", flat=True)) == ["A1"]
    response = api.post("/api/v1/facility/import/netbox", {"url": "http://169.254.169.254", "token": "t"},
                        format="json")
    assert (response.status_code, response.json()["field"]) == (400, "url")


def test_only_an_admin_points_the_server_at_a_new_prometheus(api, make_user):
    from rest_framework.test import APIClient

    def server(url: str) -> str:
        return (f"facility:\n  margin: 0.2\n  sources:\n    prometheus:\n      url: {url}\n"
                "      signals:\n        inlet_temp_c: {query: 'max by (rack) (inlet)', domain_label: rack}\n")

    response = api.post("/api/v1/facility/apply", {"text": server("http://169.254.169.254:80")}, format="json")
    assert (response.status_code, response.json()["field"]) == (403, "text")
    assert response.json()["detail"] == (
        "server.yaml: facility.sources.prometheus.url: only an admin may point the server at a Prometheus "
        "(http://169.254.169.254:80) through the API; apply it on the server, or with an admin's token"
    )
    assert FacilitySettings.load().margin != 0.2  # nothing of the file applied
    admin, key = make_user("alice", "operator")
    admin.is_staff = True
    admin.save()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.post("/api/v1/facility/apply", {"text": server("http://monitoring:9090")}, format="json").status_code == 200
    # The one in force may stay in an operator's file; another may not.
    assert api.post("/api/v1/facility/apply", {"text": server("http://monitoring:9090")}, format="json").status_code == 200
    assert api.post("/api/v1/facility/apply", {"text": server("http://other:9090")}, format="json").status_code == 403
