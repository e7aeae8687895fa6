"""Service per tenant is visible over HTTP: /metrics carries each tenant's service (cost units),
share and deficit under the capped `tenant` label, and the request log records the tenant's
service counter when each request was admitted (`tenant_service_at_admission`)."""

from __future__ import annotations

import json

import httpx
import openai

from tests.server.conftest import MODEL, serve, wait_for


def _series(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            tenant = labels.split('tenant="', 1)[1].split('"', 1)[0]
            out[tenant] = float(value)
    return out


def test_tenant_service_in_metrics_and_the_request_log(base, tmp_path):
    from tests.conftest import make

    log = tmp_path / "requests.jsonl"
    engine = make(base, num_kv_blocks=128)   # its own ledger: no tenant of another test in it
    with serve(engine, "--request-log", str(log), "--max-tenant-labels", "2") as served:
        client = openai.OpenAI(base_url=served.v1, api_key="x")
        for tenant, n in (("acme", 2), ("globex", 1), ("initech", 1), ("umbrella", 1)):
            for _ in range(n):
                client.completions.create(model=MODEL, prompt=f"{tenant} says hello to the world", max_tokens=3,
                                          temperature=0, extra_body={"tenant": tenant})
        wait_for(lambda: len(served.service.loop.state.tenants) >= 4, what="four tenants in the published state")
        text = httpx.get(served.base_url + "/metrics").text
    service = _series(text, "pacer_tenant_service_units_total")
    share = _series(text, "pacer_tenant_service_share")
    assert set(service) == {"acme", "globex", "other"}          # two labels, the rest summed under `other`
    assert service["acme"] > service["globex"] > 0 and service["other"] > service["globex"]
    assert abs(sum(share.values()) - 1.0) < 1e-6
    assert set(_series(text, "pacer_tenant_service_deficit")) == {"acme", "globex", "other"}
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    acme = [r["tenant_service_at_admission"] for r in rows if r["tenant"] == "acme"]
    assert len(acme) == 2 and acme[1] > acme[0]   # the second acme request came after the first's service


def test_the_keys_files_tenant_weights_weigh_fair_share_service(base, tmp_path):
    import argparse

    from pacer.cli.serve import add_args as add_serve_args
    from pacer.server.cli import build_service
    from tests.conftest import make

    keys = tmp_path / "keys.yaml"
    keys.write_text("tenant_weights: {acme: 3}\nkeys:\n  - {name: acme, key: acme-secret, tenant: acme}\n")
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    engine = make(base, tenant_isolation="isolated", scheduling_policy="fair")
    build_service(parser.parse_args(["--api-keys", str(keys)]), engine=engine)   # never started
    ledger = engine.scheduler.ledger
    assert ledger.weight("acme") == 3.0 and ledger.weight("globex") == 1.0
    ledger.charge("acme", num_prefill=30)
    assert ledger.normalized("acme") == 10.0
