"""Request routers, written once in pure Python: the Ray Serve deployment (`pacer serve
--replicas N --router NAME`) and the simulator (`pacer sim --replicas N --router NAME`)
both call `Router.choose`.

A router sees a `RouteRequest` (token ids, tenant, cache namespace, class) and a `Cluster`
view (replica ids, each one's load = waiting + running requests, and a `BlockIndex` fed by
the replicas' KV events), and returns one replica id. No I/O, no clocks, no randomness
beyond a seeded rotation for ties, so the same trace routes the same way served and simulated.

- `round-robin`: replicas in turn.
- `least-loaded`: fewest waiting + running (ties in turn).
- `prefix`: the replica holding the longest cached prefix of the request (from KV events,
  plus the recent routing decisions whose blocks are not reported yet), unless it is
  overloaded: when its load exceeds the least-loaded replica's by more than
  `balance_abs_threshold` and by more than `balance_rel_threshold` times, the request goes
  to the least-loaded replica instead (bounded imbalance: a hot prefix cannot pile all
  traffic on one replica). Load alone misses a skew that builds slowly (a closed loop of a
  few clients keeps loads within a request of each other while one replica takes two thirds
  of the traffic), so each prefix (named by its first block) also has home replicas
  (`PrefixHomes`): ties between equal matches, and a prefix no replica holds, go home; and the
  traffic homed on a replica is bounded (`max_share_slack`: at most 1 + slack times the even
  share of the last 64 x N decisions): past it, one of its lesser prefixes moves to the replica
  homing the least traffic, or, when its busiest prefix alone is over the bound, that prefix
  gains a second home there. The measure moves the moment a home does, so a move is never
  repeated while old decisions age out, and a prefix is cached on as few replicas as its
  traffic needs. In isolated mode the match is within the request's tenant.
- `class`: separate pools per request class (e.g. long RAG prompts on their own replicas),
  each pool routed by an inner router.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pacer.deploy.kv_index import BlockIndex
from pacer.deploy.prefix_homes import PrefixHomes
from pacer.kv.events import BlockRemovedEvent, BlockStoredEvent, chain_hashes, namespace

__all__ = ["RouteRequest", "Cluster", "Router", "RoundRobinRouter", "LeastLoadedRouter", "PrefixRouter",
           "ClassRouter", "ROUTERS", "make_router", "request_namespace", "parse_pools"]

ROUTERS = ("round-robin", "least-loaded", "prefix", "class")
SHARE_WINDOW = 64   # the prefix router bounds each replica's share of the last 64 x N decisions
SHARE_START = 8     # once 8 x N decisions are in


def request_namespace(tenant: str, cache_salt: str | None, isolation: str) -> str:
    """The cache namespace a request's blocks live in (the engine's rule, see KVCacheManager)."""
    return namespace("" if isolation == "shared" else tenant, cache_salt)


@dataclass(frozen=True, slots=True)
class RouteRequest:
    request_id: str
    token_ids: Sequence[int]
    tenant: str = "default"
    owner: str = ""                 # cache namespace: request_namespace(tenant, cache_salt, isolation)
    request_class: str = "chat"
    session: str | None = None      # agent session (x-session-id): a long history routes by it


# a session's history this long (tokens) is its own routing key: its turns go to the replica
# retaining it (pacer.kv.retention), not wherever the shared system prompt's home is
SESSION_ROUTING_MIN_TOKENS = 512


@dataclass(slots=True)
class Cluster:
    """What routers read: replica ids in a stable order, their load, their cached blocks."""

    replica_ids: list[str]
    load: dict[str, int] = field(default_factory=dict)       # waiting + running, as the caller knows it
    index: BlockIndex = field(default_factory=BlockIndex)
    block_size: int = 16


class Router(Protocol):
    name: str

    def choose(self, req: RouteRequest, cluster: Cluster, candidates: Sequence[str] | None = None) -> str: ...


class RoundRobinRouter:
    name = "round-robin"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def choose(self, req: RouteRequest, cluster: Cluster, candidates: Sequence[str] | None = None) -> str:
        ids = _candidates(cluster, candidates)
        return ids[next(self._turn) % len(ids)]


class LeastLoadedRouter:
    name = "least-loaded"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def choose(self, req: RouteRequest, cluster: Cluster, candidates: Sequence[str] | None = None) -> str:
        ids = _candidates(cluster, candidates)
        return least_loaded(ids, cluster.load, next(self._turn))


def least_loaded(ids: Sequence[str], load: Mapping[str, float], turn: int = 0) -> str:
    low = min(load.get(r, 0) for r in ids)
    ties = [r for r in ids if load.get(r, 0) == low]
    return ties[turn % len(ties)]


class PrefixRouter:
    """Longest cached prefix with bounded imbalance (SGLang's cache-aware router's rule), each
    prefix kept on its home replicas (`PrefixHomes`) and the recent share each replica's homed
    prefixes bring bounded: lesser prefixes move off an over-share replica, a prefix too hot for
    one replica gains another home."""

    name = "prefix"

    def __init__(self, balance_abs_threshold: int = 4, balance_rel_threshold: float = 1.5,
                 max_pending: int = 256, max_share_slack: float | None = 0.2) -> None:
        if balance_abs_threshold < 0 or balance_rel_threshold < 1.0:
            raise ValueError(f"balance thresholds must be abs >= 0 and rel >= 1, got {balance_abs_threshold}, "
                             f"{balance_rel_threshold}")
        if max_share_slack is not None and not max_share_slack >= 0:
            raise ValueError(f"max_share_slack must be >= 0 (or None: off), got {max_share_slack!r}")
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.max_share_slack = max_share_slack
        self.homes = PrefixHomes()
        self._turn = itertools.count()
        # blocks of recent decisions whose KV events have not arrived yet (oldest dropped first)
        self.pending = BlockIndex()
        self._pending_order: deque[tuple[str, list[int]]] = deque()
        self._max_pending = max_pending
        self.num_prefix_routed = 0
        self.num_balanced = 0     # detours to the least-loaded replica (the prefix keeps its homes)
        self.num_rehomed = 0      # prefixes moved off, or given another home beside, an over-share replica

    def choose(self, req: RouteRequest, cluster: Cluster, candidates: Sequence[str] | None = None) -> str:
        ids = _candidates(cluster, candidates)
        bs = cluster.block_size
        memo = cluster.index.memo(req.token_ids, bs, req.owner)
        hashes = chain_hashes(None, req.token_ids, bs, req.owner)
        matched = {r: self._match(r, req, cluster, memo, hashes) for r in ids}
        turn = next(self._turn)
        head = hash(tuple(req.token_ids[:bs])) ^ hash(req.owner)   # the prefix's name for its homes
        if req.session is not None and len(req.token_ids) >= SESSION_ROUTING_MIN_TOKENS:
            head = hash(("session", req.owner, req.session))
        homes = self._holding_homes(head, matched)
        choice = self._cached_choice(head, homes, matched, ids, cluster, turn)
        low = least_loaded(ids, cluster.load, turn)
        if self._overloaded(cluster.load.get(choice, 0), cluster.load.get(low, 0)):
            choice = low            # a passing detour: the prefix keeps its homes
            self.num_balanced += 1
        else:
            moved = self._rebalance(choice, ids, head, cluster)
            self.num_prefix_routed += moved == choice and matched[choice] > 0
            self.num_rehomed += moved != choice
            choice = moved
        self.homes.record(head, SHARE_WINDOW * len(ids))
        self._remember(choice, hashes, bs, cluster.index)
        return choice

    def _match(self, replica: str, req: RouteRequest, cluster: Cluster, memo: Any, hashes: list[int]) -> int:
        """Blocks of the request `replica` holds: reported by its KV events, or routed there and not
        reported yet. Once the events cover what was pending, the pending copy goes, so an eviction
        reported later is seen at once."""
        bs = cluster.block_size
        reported = cluster.index.match_blocks(replica, req.token_ids, bs, req.owner, memo)
        pending = self.pending.match_blocks(replica, req.token_ids, bs, req.owner, memo)
        if pending and reported >= pending:
            mine = self.pending.blocks(replica)
            self.pending.apply(replica, [BlockRemovedEvent(tuple(h for h in hashes[:pending] if h in mine))])
            return reported
        return max(reported, pending)

    def _lightest(self, ids: Sequence[str], cluster: Cluster, turn: int,
                  matched: Mapping[str, int] | None = None) -> str:
        """Least loaded; among those the one holding the most of the request (when `matched`
        is given), then the one whose homed prefixes bring the least recent traffic."""
        low = min(cluster.load.get(r, 0) for r in ids)
        ties = [r for r in ids if cluster.load.get(r, 0) == low]
        if matched is not None:
            most = max(matched[r] for r in ties)
            ties = [r for r in ties if matched[r] == most]
        return least_loaded(ties, self.homes.traffic, turn)

    def _cached_choice(self, head: int, homes: tuple[str, ...], matched: Mapping[str, int], ids: Sequence[str],
                       cluster: Cluster, turn: int) -> str:
        """A home holding at least half the longest match anywhere (a few tail blocks evicted at
        home, or one conversation's turn cached elsewhere, is not worth copying the prefix): the
        least loaded of them, then the one holding the most. Else the replica with the longest
        match, which becomes a home in place of the one holding the least (or the first home of a
        new prefix)."""
        best_len = max(matched.values())
        near = [r for r in homes if r in matched and 2 * matched[r] >= best_len]
        if near:
            return self._lightest(near, cluster, turn, matched)
        choice = self._lightest([r for r in ids if matched[r] == best_len], cluster, turn)
        keep = sorted((r for r in homes if r in matched), key=lambda r: matched[r])[1:]
        self.homes.set_homes(head, (*keep, choice))
        return choice

    def _holding_homes(self, head: int, matched: Mapping[str, int]) -> tuple[str, ...]:
        """The prefix's homes, less those that lost it (its first block gone from their cache)
        while another home still holds it: their traffic is not theirs any more."""
        homes = self.homes.homes(head)
        holding = tuple(r for r in homes if matched.get(r, 0))
        if holding and len(holding) < len(homes):
            self.homes.set_homes(head, holding)
            return holding
        return homes

    def _rebalance(self, choice: str, ids: Sequence[str], head: int, cluster: Cluster) -> str:
        """Where this request of `head` goes: `choice`, unless the prefixes homed there bring more than
        (1 + slack) x the even share of the recent traffic (once 8 x N decisions are in). Then a
        lesser prefix moves to the replica bringing the least traffic, and the replica's busiest
        prefix gains that replica as another home if it alone is over the bound; either only when
        it lowers the busiest share (a move that merely swaps the roles never happens)."""
        h = self.homes
        n = h.size() + 1
        if self.max_share_slack is None or len(ids) < 2 or n <= SHARE_START * len(ids):
            return choice
        bound = (1 + self.max_share_slack) * n / len(ids)
        if h.traffic[choice] + 1 <= bound:
            return choice
        homes = h.homes(head)
        others = [r for r in ids if r not in homes]
        if not others:
            return choice
        target = min(others, key=lambda r: (h.traffic[r], cluster.load.get(r, 0)))
        share = h.per_home(head)
        if h.busiest(choice) != head:           # move a lesser prefix
            new_homes = tuple(r for r in homes if r != choice) + (target,)
            after = h.traffic[target] + share
        elif share > bound:                     # the hot prefix alone overflows: one more home
            new_homes = (*homes, target)
            after = h.traffic[target] + h.freq[head] / len(new_homes)
        else:
            return choice
        if after >= h.traffic[choice]:
            return choice
        h.set_homes(head, new_homes)
        return target

    def _overloaded(self, load: int, lowest: int) -> bool:
        return load - lowest > self.balance_abs_threshold and load > self.balance_rel_threshold * lowest

    def _remember(self, replica: str, hashes: list[int], bs: int, index: BlockIndex) -> None:
        """The request's blocks will be on `replica`: pending until its KV events report them
        (blocks it already reports are not pending: a cache hit stores nothing new)."""
        known, reported = self.pending.blocks(replica), index.blocks(replica)
        fresh = [h for h in hashes if h not in known and h not in reported]
        self.pending.apply(replica, [BlockStoredEvent(tuple(fresh), None, (), bs, None)])
        self._pending_order.append((replica, fresh))
        while len(self._pending_order) > self._max_pending:
            old_replica, old = self._pending_order.popleft()
            self.pending.apply(old_replica, [BlockRemovedEvent(tuple(old))])


class ClassRouter:
    """Pools by request class: `pools` maps a class to replica positions (indices into
    `Cluster.replica_ids`); classes not named share the remaining replicas."""

    name = "class"

    def __init__(self, pools: Mapping[str, Sequence[int]], inner: Router | None = None) -> None:
        self.pools = {c: list(p) for c, p in pools.items()}
        self.inner = inner or LeastLoadedRouter()

    def choose(self, req: RouteRequest, cluster: Cluster, candidates: Sequence[str] | None = None) -> str:
        ids = _candidates(cluster, candidates)
        n = len(cluster.replica_ids)
        named = {i for pool in self.pools.values() for i in pool if i < n}
        wanted = self.pools.get(req.request_class)
        positions = [i for i in wanted if i < n] if wanted is not None else [i for i in range(n) if i not in named]
        pool = [cluster.replica_ids[i] for i in positions if cluster.replica_ids[i] in ids] or list(ids)
        return self.inner.choose(req, cluster, pool)


def parse_pools(spec: str | None, num_replicas: int) -> dict[str, list[int]]:
    """`long_context=1,agent=1`: each class gets that many replicas, counted from the last;
    everything else shares the rest. Default: `long_context` gets a quarter (at least 1)."""
    if num_replicas < 2:
        raise ValueError(f"--router class needs --replicas >= 2, got {num_replicas}")
    counts: dict[str, int] = {}
    for part in (spec or f"long_context={max(1, num_replicas // 4)}").split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or not name or not value.isdigit() or int(value) < 1:
            raise ValueError(f"--router-pools: expected CLASS=COUNT (COUNT >= 1), got {part!r}")
        counts[name] = int(value)
    if sum(counts.values()) >= num_replicas:
        raise ValueError(f"--router-pools: the pools take {sum(counts.values())} of {num_replicas} replicas; "
                         "leave at least one for the other classes")
    pools, end = {}, num_replicas
    for name, k in counts.items():
        pools[name] = list(range(end - k, end))
        end -= k
    return pools


def make_router(name: str, num_replicas: int, pools: str | None = None, inner: str = "least-loaded",
                balance_abs_threshold: int = 4, balance_rel_threshold: float = 1.5) -> Router:
    if name == "round-robin":
        return RoundRobinRouter()
    if name == "least-loaded":
        return LeastLoadedRouter()
    if name == "prefix":
        return PrefixRouter(balance_abs_threshold, balance_rel_threshold)
    if name == "class":
        if inner == "class":
            raise ValueError("--router class cannot nest itself")
        return ClassRouter(parse_pools(pools, num_replicas),
                           make_router(inner, num_replicas, None, "least-loaded", balance_abs_threshold,
                                       balance_rel_threshold))
    raise ValueError(f"--router must be one of {', '.join(ROUTERS)}; got {name!r}")


def _candidates(cluster: Cluster, candidates: Sequence[str] | None) -> Sequence[str]:
    ids = cluster.replica_ids if candidates is None else candidates
    if not ids:
        raise ValueError("no replica to route to")
    return ids
