"""Tenants in the KV bookkeeping. Pure Python; the KV manager owns one `TenantSpaces`.

`shared` caches every block in one namespace; `isolated` gives each tenant its own (only
public, prewarmed prefixes are shared); `partitioned` adds hard per-tenant quotas on cached
blocks: a tenant's inserts and allocations evict only its own cache (its eviction group and
the public one). A `cache_salt` makes a request's namespace private to requests with the
same salt (vLLM's meaning), inside its tenant's. The host tier keeps the same shares of its
own slots (`host_quotas`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pacer.config import TENANT_ISOLATION_MODES
from pacer.kv.events import SALT_SEPARATOR, namespace
from pacer.kv.radix_node import PUBLIC
from pacer.request import Request

if TYPE_CHECKING:
    from pacer.config import CacheConfig

__all__ = ["TenantSpaces", "OTHER_TENANTS", "group_fn", "host_quotas"]

OTHER_TENANTS = "*"  # tenant_quotas key for every tenant not listed (one quota shared by all of them)


class TenantSpaces:
    def __init__(self, isolation: str, quotas: Mapping[str, int] | None, num_blocks: int,
                 reserve_blocks: int = 0) -> None:
        """`reserve_blocks`: kept free for one max_model_len request (the quotas must leave them)."""
        if isolation not in TENANT_ISOLATION_MODES:
            raise ValueError(f"tenant_isolation must be one of {', '.join(TENANT_ISOLATION_MODES)}; "
                             f"got {isolation!r}")
        self.isolation = isolation
        self.quotas = dict(quotas or {})
        if self.quotas and isolation != "partitioned":
            raise ValueError("tenant_quotas apply only with tenant_isolation='partitioned'")
        reserve_blocks = min(reserve_blocks, num_blocks)
        if isolation == "partitioned" and sum(self.quotas.values()) + reserve_blocks > num_blocks:
            raise ValueError(
                f"tenant_quotas sum to {sum(self.quotas.values())} blocks; with {reserve_blocks} blocks kept "
                f"free for one max_model_len request that exceeds the {num_blocks} KV blocks")

    @property
    def partitioned(self) -> bool:
        return self.isolation == "partitioned"

    def owner(self, req: Request, public: bool = False) -> str:
        """The namespace the request's blocks are cached under (`public`: a public prewarm)."""
        if public:
            return PUBLIC
        return namespace(PUBLIC if self.isolation == "shared" else req.tenant, req.cache_salt)

    def owners(self, req: Request, public: bool = False) -> tuple[str, ...]:
        """The namespaces the request may match, in order of preference."""
        owner = self.owner(req, public)
        if owner == PUBLIC or req.cache_salt:   # a salted request shares nothing unsalted (vLLM)
            return (owner,)
        return (owner, PUBLIC)

    def quota_group(self, tenant: str) -> str:
        return tenant if tenant in self.quotas else OTHER_TENANTS

    def quota(self, group: str) -> int:
        return self.quotas.get(group, self.quotas.get(OTHER_TENANTS, 0))

    def evict_groups(self, tenant: str | None) -> list[str] | None:
        """The eviction groups a tenant's allocations may take from (None: every group)."""
        if not self.partitioned or tenant is None:
            return None
        return [self.quota_group(tenant), PUBLIC]


def group_fn(isolation: str, quotas: Mapping[str, int]) -> Callable[[str], str]:
    """The prefix cache's owner -> eviction group map for the isolation mode."""
    if isolation != "partitioned":
        return lambda owner: PUBLIC
    def group(owner: str) -> str:
        tenant = owner.partition(SALT_SEPARATOR)[0]   # a salted namespace counts against its tenant
        return tenant if tenant == PUBLIC or tenant in quotas else OTHER_TENANTS
    return group


def host_quotas(config: CacheConfig, num_device_blocks: int, num_host_blocks: int) -> dict[str, Any]:
    """The host tier's share of the tenants' quotas (`HostKVTier` keyword arguments): each
    tenant keeps the same fraction of the host tier as of the device (partitioned mode); {}
    when there are no quotas."""
    if config.tenant_isolation != "partitioned" or not config.enable_prefix_caching or not config.tenant_quotas:
        return {}
    quotas = {g: q * num_host_blocks // max(1, num_device_blocks) for g, q in config.tenant_quotas.items()}
    quotas.setdefault(OTHER_TENANTS, 0)
    return {"group_of": group_fn(config.tenant_isolation, config.tenant_quotas), "quotas": quotas}
