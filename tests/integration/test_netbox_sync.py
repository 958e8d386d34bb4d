"""The scheduled NetBox sync in a real Celery worker on PostgreSQL and Redis: a cap that falls is applied
without a person, a feed deleted in NetBox waits for one, and the wait is on /metrics and in ctl."""

from __future__ import annotations

import os
import time

import pytest

from facility.models import Budget, DcimSync, Feed
from facility.services import facility_apply
from llmgw.ctl import main as ctl
from tests.fakes.netbox import FakeNetbox
from tests.integration import conftest as processes
from tests.integration.test_netbox_sites import feed, two_sites

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def sync_in_worker(worker: processes.Worker, *, runs: bool) -> None:
    """Beat's minute sent through Redis; with ``runs``, wait for the sync it queues to finish too, else check it
    claimed no run (the site's last run stays as it was)."""
    from facility.tasks import netbox_sync

    log = worker.log_dir / f"worker-{worker.starts}.log"

    def runs_done() -> int:
        return sum(1 for line in log.read_text().splitlines()
                   if "Task facility.tasks.netbox_sync_run[" in line and "succeeded" in line)

    done_before = runs_done()
    last_run = DcimSync.objects.values_list("last_run_at", flat=True).first()
    sent = netbox_sync.delay()
    ticked = f"Task facility.tasks.netbox_sync[{sent.id}] succeeded"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (ticked not in log.read_text() or (runs and runs_done() == done_before)):
        time.sleep(0.1)
    assert ticked in log.read_text(), log.read_text()[-3000:]
    if runs:
        assert runs_done() == done_before + 1, log.read_text()[-3000:]
    else:
        assert DcimSync.objects.values_list("last_run_at", flat=True).first() == last_run


def rack_cap(name: str) -> float:
    return round(Budget.objects.get(domain=f"rack:{name}").effective_cap_watts)


def test_the_scheduled_sync_lowers_a_cap_alone_and_holds_a_deleted_feed_for_a_yes(
        celery_on_redis, tmp_path, join_node, capsys):
    for name in ("gpu01", "gpu02", "gpu03", "gpu04"):
        join_node(name)
    data = two_sites()
    token = tmp_path / "nb.token"
    token.write_text("t0ken\n")
    with FakeNetbox(data) as nb:
        facility_apply(text=(
            f"facility:\n  netbox:\n    url: {nb.url}\n    token_file: {token}\n    site: sto1\n    sync_every: 10m\n"))
        env = {k: v for k, v in os.environ.items() if k != "LLMGW_CONFIG"}
        env.update(DATABASE_URL=processes.test_database_url(), REDIS_URL=celery_on_redis, LLMGW_NETBOX_URLS=nb.url)
        worker = processes.Worker(env, tmp_path)
        worker.start()
        try:
            sync_in_worker(worker, runs=True)
            assert rack_cap("R-A01") == 2944 and rack_cap("R-A02") == 2300
            # NetBox changes: A01-A is held to 60 % (a cap that falls), A02-B is deleted (its PDU left unfed).
            feed(data, "sto1", "A01-A")["max_utilization"] = 60
            gone = feed(data, "sto1", "A02-B")
            data["power-feeds"].remove(gone)
            for port in data["power-ports"]:
                if port.get("link_peers") == [{"id": gone["id"]}]:
                    port["link_peers"], port["link_peers_type"] = [], None
            sync_in_worker(worker, runs=False)  # not due yet: ten minutes have not passed
            assert rack_cap("R-A01") == 2944
            # Ten minutes later (the test moves the sync's clock, not the machine's).
            row = DcimSync.objects.get(site="sto1")
            DcimSync.objects.filter(pk=row.pk).update(last_run_at=row.last_run_at.replace(year=row.last_run_at.year - 1))
            sync_in_worker(worker, runs=True)
        finally:
            worker.stop()
    assert rack_cap("R-A01") == 2208  # 230 V × 16 A × 60 %: applied by nobody
    assert Feed.objects.filter(name="A02-B").exists()  # its removal waits
    row = DcimSync.objects.get(site="sto1")
    assert "feed A02-B removed" in row.pending and row.differs_since is not None
    from facility.metrics import DomainPowerCollector

    family = {f.name: f for f in DomainPowerCollector().collect()}["llmgw_netbox_pending_changes"]
    assert {s.labels["site"]: s.value for s in family.samples} == {"sto1": float(len(row.pending))}
    assert ctl(["facility", "import", "status"]) == 0
    out = capsys.readouterr().out
    assert f"{len(row.pending)} waiting for a yes since" in out and "    feed A02-B removed" in out
