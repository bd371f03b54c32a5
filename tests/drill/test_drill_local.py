"""The local drill's parts without a run: the Service DNS answering real DNS queries (dnslib's client over
UDP and TCP on 127.0.0.1), its selector rules, the schedule checks and `gennstack drill --local`'s argument
errors. The runs themselves: tests/gateway/test_gateway_drill_e2e.py."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from dnslib import RCODE, DNSRecord

from gennstack.drill.local import (
    LocalDrillError, LocalDrillSettings, RunResult, comparison_markdown, replacement_markdown, service_for,
)
from gennstack.drill.service_dns import Service, ServiceDNS, selector_matches, service_addresses
from tests.support import ROOT

SELECTOR = {"app.kubernetes.io/name": "gen3-g6e", "app.kubernetes.io/component": "server", "gennstack.io/routable": "true"}


def pod(name: str, ip: str | None, *, ready: bool = True, **labels: str) -> dict:
    status = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return {"metadata": {"name": name, "labels": {**SELECTOR, **labels}}, "status": {**status, "podIP": ip} if ip else status}


def test_selector_is_equality_on_every_key_and_empty_selects_nothing() -> None:
    assert selector_matches(SELECTOR, {**SELECTOR, "extra": "x"})
    assert not selector_matches(SELECTOR, {**SELECTOR, "gennstack.io/routable": "false"})
    assert not selector_matches(SELECTOR, {k: v for k, v in SELECTOR.items() if k != "gennstack.io/routable"})
    assert not selector_matches({}, SELECTOR) and not selector_matches(SELECTOR, None)


def test_addresses_are_matching_ready_pods_with_an_ip_not_being_deleted() -> None:
    deleting = pod("d", "127.0.0.5")
    deleting["metadata"]["deletionTimestamp"] = "2026-11-30T12:00:00Z"
    pods = [pod("b", "127.0.0.3"), pod("a", "127.0.0.2"), pod("c", "127.0.0.4", **{"gennstack.io/routable": "false"}),
            deleting, pod("e", None), pod("f", "fe80::1"), pod("g", "127.0.0.6", ready=False),
            {"metadata": {"name": "h", "labels": SELECTOR}, "status": {"podIP": "127.0.0.7"}}]
    assert service_addresses(SELECTOR, pods) == ["127.0.0.2", "127.0.0.3"]


def _ask(dns: ServiceDNS, name: str, qtype: str = "A", *, tcp: bool = False) -> DNSRecord:
    question = DNSRecord.question(name, qtype)
    return DNSRecord.parse(question.send(*dns.address, tcp=tcp, timeout=5))


@pytest.mark.parametrize("tcp", [False, True], ids=["udp", "tcp"])
def test_the_answer_follows_the_labels_at_query_time(tcp: bool) -> None:
    pods = [pod("a", "127.0.0.2"), pod("b", "127.0.0.3")]
    with ServiceDNS([Service("gen3-g6e.gennstack-serving.svc.cluster.local", SELECTOR)], lambda: pods, ttl_s=3) as dns:
        reply = _ask(dns, "gen3-g6e.gennstack-serving.svc.cluster.local", tcp=tcp)
        assert reply.header.rcode == RCODE.NOERROR
        assert [(str(rr.rdata), rr.ttl) for rr in reply.rr] == [("127.0.0.2", 3), ("127.0.0.3", 3)]
        pods[0]["metadata"]["labels"]["gennstack.io/routable"] = "false"
        assert [str(rr.rdata) for rr in _ask(dns, "GEN3-G6E.gennstack-serving.svc.cluster.local.", tcp=tcp).rr] == ["127.0.0.3"]
        aaaa = _ask(dns, "gen3-g6e.gennstack-serving.svc.cluster.local", "AAAA", tcp=tcp)
        assert (aaaa.header.rcode, aaaa.rr) == (RCODE.NOERROR, [])
        # no ready pod left: NXDOMAIN, as CoreDNS's kubernetes plugin answers a headless Service without endpoints
        pods[1]["metadata"]["labels"]["gennstack.io/routable"] = "false"
        empty = _ask(dns, "gen3-g6e.gennstack-serving.svc.cluster.local", tcp=tcp)
        assert (empty.header.rcode, empty.rr) == (RCODE.NXDOMAIN, [])
        unknown = _ask(dns, "other.gennstack-serving.svc.cluster.local", tcp=tcp)
        assert unknown.header.rcode == RCODE.NXDOMAIN
        assert dns.resolver.queries == 5
        answered = dns.resolver.answered
        assert [(qtype, addresses) for _, qtype, addresses in answered] == [
            ("A", ("127.0.0.2", "127.0.0.3")), ("A", ("127.0.0.3",)), ("AAAA", ("127.0.0.3",)), ("A", ()), ("A", ())]
        assert [at for at, _, _ in answered] == sorted(at for at, _, _ in answered)


def test_service_dns_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="ttl_s 3601: allowed 1 to 3600"):
        ServiceDNS([], list, ttl_s=3601)
    with pytest.raises(ValueError, match="ttl_s 0: allowed 1 to 3600 .*a TTL of 0 only at its dns_refresh_rate"):
        ServiceDNS([], list, ttl_s=0)
    with pytest.raises(ValueError, match="a name is given twice"):
        ServiceDNS([Service("a.b", SELECTOR), Service("A.b.", SELECTOR)], list)


def test_service_for_is_the_backend_host_and_the_charts_selector() -> None:
    """tests/test_drain_routing.py checks both against the rendered charts."""
    service = service_for("gpt-oss-20b")
    assert service.hostname == "gen3-g6e.gennstack-serving.svc.cluster.local"
    assert service.selector == SELECTOR


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"replicas": 1}, "replicas 1: allowed 2 to 16 (one is doomed, one must survive)"),
        ({"warning_at_s": 2.0}, "warning_at_s 2.0 must come after the 2 s warm-up"),
        ({"gone_after_s": 2.0}, "gone_after_s 2.0: must exceed the DNS TTL (1 s) plus one request (0.51 s) plus 1 s"),
        ({"duration_s": 25}, "duration_s 25: must outlast the warning and gone (10 + 12 s) by 5 s"),
        ({"dns_ttl_s": 0}, "dns_ttl_s 0: allowed 1 to 3600 (Envoy re-resolves a TTL of 0 only at its DNS refresh rate)"),
        ({"concurrency": 0}, "concurrency and max_tokens must be >= 1"),
    ],
)
def test_schedule_checks_name_the_setting(changes: dict, message: str) -> None:
    LocalDrillSettings().check()
    with pytest.raises(LocalDrillError) as caught:
        LocalDrillSettings(**changes).check()
    assert message in str(caught.value)


def test_the_table_has_one_row_per_run() -> None:
    runs = [RunResult(drain=True, requests_lost=0, broken_streams=0, failures_by_class={}, baseline_tok_s=1550.0,
                      seconds_below_50pct=0, time_to_recover_95_s=0.0, doomed_new_requests_after_warning=18,
                      doomed_new_requests_after_out_of_rotation=0, doomed_streams_started=177, doomed_streams_completed=177,
                      survivors_streams_completed=180,
                      label_to_out_of_rotation_s=1.003),
            RunResult(drain=False, requests_lost=8, broken_streams=8, failures_by_class={"broken_stream": 8}, baseline_tok_s=1550.0,
                      seconds_below_50pct=0, time_to_recover_95_s=1.0, doomed_new_requests_after_warning=177,
                      doomed_new_requests_after_out_of_rotation=None, doomed_streams_started=333, doomed_streams_completed=325,
                      survivors_streams_completed=340,
                      label_to_out_of_rotation_s=None)]
    table = comparison_markdown(LocalDrillSettings(), runs)
    assert "| on | 0 | 0 | 18 | 0 | 177 of 177 | 1.003 s | 0 | 0 s |" in table
    assert "| off | 8 | 8 | 177 | n/a | 325 of 333 | n/a | 0 | 1 s |" in table
    assert "50-token streams of 0.51 s" in table


def test_the_replacement_table_has_each_runs_ready_and_served_after_gone() -> None:
    """replacements.md: a replacement that served, and one the bench ended before it served (n/a)."""
    common = dict(requests_lost=0, broken_streams=0, failures_by_class={}, baseline_tok_s=None, seconds_below_50pct=None,
                  time_to_recover_95_s=None, doomed_new_requests_after_warning=0, doomed_new_requests_after_out_of_rotation=None,
                  doomed_streams_started=1, doomed_streams_completed=1, survivors_streams_completed=1,
                  label_to_out_of_rotation_s=None)
    runs = [RunResult(drain=True, **common, replacement_ready_s=0.109, replacement_served_s=2.352, replacement_streams_completed=125),
            RunResult(drain=False, **common, replacement_ready_s=0.2)]
    table = replacement_markdown(runs)
    assert "| on | 0.109 s | 2.352 s | 125 |" in table
    assert "| off | 0.2 s | n/a | 0 |" in table
    # the drain/no-drain table is unchanged by them (the README's block is that table)
    assert "replacement" not in comparison_markdown(LocalDrillSettings(), runs)


def _drill(tmp_path: Path, argv: list[str], config: dict | None = None) -> tuple[int, str]:
    from gennstack.cli import build_parser
    from gennstack.drill.cli import run

    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(config or {}))
    args = build_parser().parse_args(["drill", "--cdk-json", str(ROOT / "cdk.json"), "--config", str(config_file),
                                      "--output-dir", str(tmp_path / "out"), *argv])
    err = io.StringIO()
    return run(args, stdout=io.StringIO(), stderr=err), err.getvalue()


@pytest.mark.parametrize(
    ("argv", "config", "message"),
    [
        ([], {}, "--generation is required (or --local for a drill on this machine)"),
        (["--local", "--replicas", "1"], {}, "replicas 1: allowed 2 to 16"),
        (["--local", "--gone-after", "1"], {}, "gone_after_s 1.0: must exceed the DNS TTL"),
        (["--local", "--generation", "g6e"], {"gateway": {"models": {"m": {"generation": "inf2", "service": "m"}}, "aliases": {}}},
         "--generation g6e: no model in gateway.models is served by it"),
    ],
)
def test_local_argument_errors_exit_2_before_anything_starts(tmp_path: Path, argv: list[str], config: dict, message: str) -> None:
    code, err = _drill(tmp_path, argv, config)
    assert code == 2 and message in err, err
    assert not (tmp_path / "out").exists()
