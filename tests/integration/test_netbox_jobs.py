"""A NetBox import runs as a job off the request that asked: the API answers 202 with its id before NetBox has
answered, the job's phase and objects read are readable while it runs, and its end (the diff, or why it
failed) is read by GET, by `llmgw ctl facility import job` and on the Facility page. On workers the job is a
Celery task; in the embedded server, a thread of its own; in a command with no server, it runs at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection

from facility import netbox_import
from facility.models import Feed, ImportJob
from llmgw.ctl import main as ctl
from tests.fakes.netbox import FakeNetbox
from tests.integration import conftest as processes
from tests.integration.test_netbox_sites import joined, two_sites  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)

LLMGW = Path(sys.executable).parent / "llmgw"
WAIT = 120  # seconds a test waits for a job at most: far past any job here, never reached when it works


class GatedNetbox:
    """objects_from_api held until ``open()``: a NetBox that has not answered yet. ``held`` says, for each
    read, whether the job held a database connection while it waited."""

    def __init__(self, monkeypatch):
        self.gate = threading.Event()
        self.reading = threading.Event()
        self.held: list[bool] = []
        real = netbox_import.objects_from_api

        def gated(api, *, site=None, progress=None):
            self.held.append(connection.connection is not None)
            self.reading.set()
            assert self.gate.wait(WAIT)
            return real(api, site=site, progress=progress)

        monkeypatch.setattr(netbox_import, "objects_from_api", gated)

    def open(self):
        self.gate.set()


@pytest.fixture
def embedded_server(monkeypatch):
    """Jobs run as in `llmgw serve` without Redis: in its import thread, not in the request."""
    from llmgw import inprocess

    monkeypatch.setattr(inprocess, "running", lambda: True)


def job_ended(client, job_id: int) -> dict:
    ends_at = time.monotonic() + WAIT
    while time.monotonic() < ends_at:
        job = client.get(f"/api/v1/facility/import/jobs/{job_id}").json()
        if job["state"] in ("done", "failed"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not end: {job}")


def test_the_api_answers_202_before_netbox_does_and_the_job_ends_with_the_diff(
        admin_client, settings, monkeypatch, joined, embedded_server):  # noqa: F811
    netbox = GatedNetbox(monkeypatch)
    with FakeNetbox(two_sites()) as nb:
        settings.LLMGW_NETBOX_URLS = [nb.url]
        answer = admin_client.post("/api/v1/facility/import/netbox",
                                   {"url": nb.url, "token": "t0ken", "site": "sto1"}, content_type="application/json")
        assert answer.status_code == 202, answer.content
        job = answer.json()
        assert answer["Location"] == f"/api/v1/facility/import/jobs/{job['id']}"
        assert job["state"] in ("queued", "running") and job["result"] is None
        assert netbox.reading.wait(WAIT)
        running = admin_client.get(f"/api/v1/facility/import/jobs/{job['id']}").json()
        assert running["state"] == "running" and not Feed.objects.exists()
        netbox.open()
        done = job_ended(admin_client, job["id"])
    assert netbox.held == [False]  # the job's connection went back while NetBox had not answered
    assert done["state"] == "done" and done["error"] is None and done["site"] == "sto1"
    assert done["objects_read"] > 0 and done["objects_applied"] == 21  # 6 feeds, 6 nodes relabelled, 9 caps
    assert done["result"]["applied"] and len(done["result"]["feeds_added"]) == 6
    assert Feed.objects.count() == 6


def test_a_dry_run_job_writes_nothing_and_a_refused_token_fails_the_job_naming_the_url(
        admin_client, settings, joined):  # noqa: F811
    with FakeNetbox(two_sites()) as nb:
        settings.LLMGW_NETBOX_URLS = [nb.url]
        dry = admin_client.post("/api/v1/facility/import/netbox", {"url": nb.url, "token": "t0ken", "dry_run": True},
                                content_type="application/json").json()
        wrong = admin_client.post("/api/v1/facility/import/netbox", {"url": nb.url, "token": "nope"},
                                  content_type="application/json").json()
    assert dry["state"] == "done" and dry["dry_run"] and dry["objects_applied"] == 0
    assert dry["result"]["dry_run"] and not dry["result"]["applied"] and len(dry["result"]["feeds_added"]) == 12
    assert not Feed.objects.exists()
    assert wrong["state"] == "failed" and wrong["error_field"] == "url"
    assert wrong["error"] == f"--url: NetBox at {nb.url} refused the token (403)"
    listed = admin_client.get("/api/v1/facility/import/jobs").json()
    assert [j["id"] for j in listed] == [wrong["id"], dry["id"]]
    assert "token" not in listed[0] and ImportJob.objects.get(pk=wrong["id"]).token == ""


def test_a_map_entry_that_names_no_node_is_refused_before_any_job(admin_client, settings):
    settings.LLMGW_NETBOX_URLS = ["http://netbox.test"]
    answer = admin_client.post("/api/v1/facility/import/netbox",
                               {"url": "http://netbox.test", "token": "t", "map": ["gpu01"]},
                               content_type="application/json")
    assert answer.status_code == 400
    assert answer.json() == {"detail": "map: 'gpu01' is not SITE/DEVICE=NODE (got1/gpu01=gpu01-got1)", "field": "map"}
    assert not ImportJob.objects.exists()


def test_past_four_jobs_at_once_a_fifth_is_refused_and_a_lost_one_stops_counting(admin_client, settings):
    from facility.import_jobs import LOST_SECONDS

    settings.LLMGW_NETBOX_URLS = ["http://netbox.test"]
    jobs = [ImportJob.objects.create(url="http://netbox.test", state=state)
            for state in ("queued", "running", "running", "queued")]
    body = {"url": "http://netbox.test", "token": "t"}
    answer = admin_client.post("/api/v1/facility/import/netbox", body, content_type="application/json")
    assert answer.status_code == 409
    ids = ", ".join(str(j.pk) for j in jobs)
    assert answer.json()["detail"] == (
        f"netbox: 4 imports are queued or running (jobs {ids}), at most 4; wait for one to end "
        f"(llmgw ctl facility import job {jobs[0].pk})")
    # The worker of the first was stopped: past LOST_SECONDS the job says so, and no longer counts.
    ImportJob.objects.filter(pk=jobs[1].pk).update(
        created_at=jobs[1].created_at - timedelta(seconds=LOST_SECONDS + 1))
    lost = admin_client.get(f"/api/v1/facility/import/jobs/{jobs[1].pk}").json()
    assert lost["state"] == "failed"
    assert lost["error"] == "lost: no worker ended it within 15 minutes (was a worker stopped?); run it again"
    assert ImportJob.objects.filter(state__in=["queued", "running"]).count() == 3
    for missing in ("999999", "9" * 30):  # past the database's integer too
        assert admin_client.get(f"/api/v1/facility/import/jobs/{missing}").json() == {
            "detail": f"job: no NetBox import job {missing} (the newest 200 are kept)", "field": "job"}


def test_ctl_no_wait_prints_the_job_and_import_job_prints_its_diff(tmp_path, capsys, joined):  # noqa: F811
    token = tmp_path / "nb.token"
    token.write_text("t0ken\n")
    with FakeNetbox(two_sites()) as nb:
        assert ctl(["facility", "import", "netbox", "--url", nb.url, "--token-file", str(token), "--site", "sto1",
                    "--no-wait"]) == 0
    job = ImportJob.objects.get()
    # No worker runs jobs for a command on the embedded default's database: it ran before ctl returned.
    assert capsys.readouterr().out == (
        f"NetBox import {job.pk} done, {job.objects_read:,} objects read, 21 changes applied; "
        f"follow it: llmgw ctl facility import job {job.pk}\n")
    assert ctl(["facility", "import", "job", str(job.pk)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("+ feed A01-A 230 V 16 A") and out[-1] == "21 changes applied"
    assert ctl(["facility", "import", "job"]) == 0
    assert capsys.readouterr().out.endswith(f"UTC  NetBox import {job.pk} done, {job.objects_read:,} objects read, "
                                            "21 changes applied\n")


def test_remote_ctl_prints_the_jobs_progress_then_its_diff(
        live_server, make_user, tmp_path, settings, monkeypatch, joined, embedded_server):  # noqa: F811
    netbox = GatedNetbox(monkeypatch)
    _, key = make_user("ops", role="operator")
    token = tmp_path / "nb.token"
    token.write_text("t0ken\n")
    env = {k: v for k, v in os.environ.items() if k not in {"LLMGW_TOKEN", "DATABASE_URL"}}
    env.update(LLMGW_URL=live_server.url, LLMGW_TOKEN=key, XDG_CONFIG_HOME=str(tmp_path))
    with FakeNetbox(two_sites()) as nb:
        settings.LLMGW_NETBOX_URLS = [nb.url]
        proc = subprocess.Popen(
            [str(LLMGW), "ctl", "facility", "import", "netbox", "--url", nb.url, "--token-file", str(token),
             "--site", "sto1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = proc.stderr.readline()  # the job, followed while NetBox has not answered
            netbox.open()
            out, err = proc.communicate(timeout=WAIT)
        finally:
            proc.kill()
    job = ImportJob.objects.get()
    assert first.startswith(f"NetBox import {job.pk} ") and ("queued" in first or "running: " in first), first
    assert proc.returncode == 0, err
    assert out.splitlines()[-1] == "21 changes applied" and job.requested_by == "ops"


@pytest.mark.worker
@pytest.mark.slow
def test_on_workers_the_import_is_a_task_and_the_request_reads_no_netbox(
        celery_on_redis, admin_client, settings, tmp_path, joined):  # noqa: F811
    with FakeNetbox(two_sites()) as nb:
        settings.LLMGW_NETBOX_URLS = [nb.url]
        answer = admin_client.post("/api/v1/facility/import/netbox", {"url": nb.url, "token": "t0ken", "site": "got1"},
                                   content_type="application/json")
        assert answer.status_code == 202 and answer.json()["state"] == "queued"
        assert nb.requests == []  # the request asked NetBox nothing
        env = {k: v for k, v in os.environ.items() if k != "LLMGW_CONFIG"}
        env.update(DATABASE_URL=processes.test_database_url(), REDIS_URL=celery_on_redis, LLMGW_NETBOX_URLS=nb.url)
        worker = processes.Worker(env, tmp_path)
        worker.start()
        try:
            done = job_ended(admin_client, answer.json()["id"])
        finally:
            worker.stop()
    assert done["state"] == "done", done
    assert sorted(f["name"] for f in done["result"]["feeds_added"]) == [
        "A01-A", "A01-B", "A02-A", "A02-B", "B01-A", "B01-B"]
    assert Feed.objects.filter(site="got1").count() == 6


def test_the_facility_page_shows_a_running_job_and_why_the_last_one_failed(admin_client):
    ImportJob.objects.create(url="http://netbox.test", state="running", phase="reading NetBox: power-feeds",
                             objects_read=1250)
    failed = ImportJob.objects.create(url="http://netbox.test", state="failed", phase="failed",
                                      error="--url: NetBox at http://netbox.test refused the token (403)")
    ImportJob.objects.filter(pk=failed.pk).update(finished_at=failed.created_at)
    page = admin_client.get("/facility/").content.decode()
    running = ImportJob.objects.get(state="running")
    assert f"NetBox import {running.pk} running: reading NetBox: power-feeds, 1,250 objects read" in page
    assert f"NetBox import {failed.pk} failed: --url: NetBox at http://netbox.test refused the token (403)" in page


def test_the_sync_runs_as_a_job_too(admin_client, tmp_path, settings, joined):  # noqa: F811
    from facility.services import facility_apply

    token = tmp_path / "nb.token"
    token.write_text("t0ken\n")
    assert admin_client.post("/api/v1/facility/import/sync", {}, content_type="application/json").json() == {
        "detail": "facility.netbox: no NetBox is configured (server.yaml facility.netbox)", "field": "netbox"}
    with FakeNetbox(two_sites()) as nb:
        settings.LLMGW_NETBOX_URLS = [nb.url]
        facility_apply(text=f"facility:\n  netbox:\n    url: {nb.url}\n    token_file: {token}\n    site: sto1\n")
        answer = admin_client.post("/api/v1/facility/import/sync", {"dry_run": True}, content_type="application/json")
    assert answer.status_code == 202
    job = answer.json()
    assert job["kind"] == "sync" and job["state"] == "done" and job["result"]["dry_run"]
    assert json.loads(json.dumps(job["result"]["feeds_added"]))[0]["name"] == "A01-A"
