"""One deadline for the whole outbound call: a server that trickles its status line or its headers a byte
every half second is cut when the deadline passes, not when the trickle ends (a timeout per wait never
fires: each byte comes in time). Real sockets on 127.0.0.1; the deadlines are small, the trickles long."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from facility.sources import parse_query_signals, poll_prometheus
from llmgw import outbound
from tests.fakes.trickle import CUT_WITHIN, Trickle

SIGNALS = parse_query_signals({"inlet_temp_c": {"query": "max by (rack) (x)", "domain_label": "rack"}})


@pytest.mark.parametrize("status_too", [True, False], ids=["status-line", "headers"])
def test_a_prometheus_trickling_its_head_is_down_once_the_polls_deadline_passes(status_too):
    with Trickle("status" if status_too else "headers") as slow, outbound.client() as client:
        poll = poll_prometheus(slow.url, SIGNALS, client=client, now=time.time(), deadline_seconds=1.0)
        assert slow.cut.wait(CUT_WITHIN), "the poll kept waiting for the headers"
    assert not poll.up
    assert poll.errors == ["inlet_temp_c: no answer within 1 s"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_the_periodic_evaluation_marks_a_prometheus_trickling_its_headers_down():
    """The evaluation's own client (none given) keeps the whole deadline too (the poll's 5 s)."""
    from facility.evaluation import conditions_evaluate
    from facility.models import SourceStatus
    from facility.services import facility_apply

    with Trickle("headers") as slow:
        facility_apply(text=(
            "facility:\n  sources:\n    prometheus:\n"
            f"      url: {slow.url}\n      interval: 30s\n      signals:\n"
            "        inlet_temp_c: {query: 'max by (rack) (x)', domain_label: rack}\n"
        ))
        conditions_evaluate()
        assert slow.cut.wait(CUT_WITHIN)
    status = SourceStatus.objects.get(name="prometheus")
    assert not status.up and status.last_error == "inlet_temp_c: no answer within 5 s"


def test_a_requests_session_keeps_the_deadline_through_a_trickled_head():
    import requests

    with Trickle("status") as slow:
        session = outbound.bound_session(requests.Session())
        with outbound.Deadline(1.0) as deadline, pytest.raises(requests.RequestException):
            # requests' timeout bounds each wait on the socket: 5 s, never reached by a byte every 0.5 s.
            session.get(slow.url, timeout=5)
        assert deadline.expired
        assert slow.cut.wait(CUT_WITHIN)


@pytest.mark.django_db
def test_a_netbox_trickling_its_headers_is_refused_naming_the_url(tmp_path, capsys, monkeypatch):
    from facility import netbox_import
    from llmgw.ctl import main as ctl

    token = tmp_path / "nb.token"
    token.write_text("t")
    monkeypatch.setattr(netbox_import, "NETBOX_TIMEOUT_SECONDS", 1)
    with Trickle("headers") as slow:
        code = ctl(["facility", "import", "netbox", "--url", slow.url, "--token-file", str(token)])
        assert slow.cut.wait(CUT_WITHIN)
    assert code == 1
    assert capsys.readouterr().err.startswith(
        f"error: --url: NetBox at {slow.url}/api did not answer: NetBox's answer took longer than its deadline"
    )


class StalledResolver:
    """socket.getaddrinfo that never answers for ``name`` (a DNS server gone quiet) until the test ends; every
    other name (127.0.0.1 included) resolves as it does."""

    def __init__(self, monkeypatch, name: str):
        self.name = name
        self.asked = threading.Event()
        self.released = threading.Event()
        real = socket.getaddrinfo

        def getaddrinfo(host, *args, **kwargs):
            if host == name:
                self.asked.set()
                self.released.wait(CUT_WITHIN * 4)
                raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
            return real(host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.released.set()


def test_a_prometheus_whose_name_does_not_resolve_is_down_once_the_polls_deadline_passes(monkeypatch):
    with StalledResolver(monkeypatch, "prometheus.example.test") as dns, outbound.client() as client:
        poll = poll_prometheus("http://prometheus.example.test:9090", SIGNALS, client=client, now=time.time(),
                               deadline_seconds=1.0)
        assert dns.asked.is_set() and not dns.released.is_set()  # answered while the resolver still stalls
    assert not poll.up
    assert poll.errors == ["inlet_temp_c: no answer within 1 s"]


@pytest.mark.django_db
def test_a_netbox_whose_name_does_not_resolve_is_refused_at_the_deadline(tmp_path, capsys, monkeypatch):
    from facility import netbox_import
    from llmgw.ctl import main as ctl

    token = tmp_path / "nb.token"
    token.write_text("t")
    monkeypatch.setattr(netbox_import, "NETBOX_TIMEOUT_SECONDS", 1)
    with StalledResolver(monkeypatch, "netbox.example.test") as dns:
        code = ctl(["facility", "import", "netbox", "--url", "http://netbox.example.test", "--token-file", str(token)])
        assert dns.asked.is_set() and not dns.released.is_set()
    assert code == 1
    assert capsys.readouterr().err.startswith(
        "error: --url: NetBox at http://netbox.example.test/api did not answer: NetBox's answer took longer than "
        "its deadline"
    )
