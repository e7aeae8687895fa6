"""Session retention: keep an agent conversation's KV while its tool runs. Pure Python.

A chat turn of a named session (`Request.session`) that finishes opens a *retention window* on
the prefix-cache path of its conversation (prompt plus generated tokens) for that session's
tenant. Retention is an eviction tier, not a pin: every node of the path counts the windows
over it (`RadixNode.retain_ref`), and the cache's eviction key (`retention_tiered`) puts such
leaves after every unretained leaf. They stay evictable, so capacity and admission do not
change; under pressure they are demoted to the host tier (the cache's `on_drop`) before any
pinned prefix is touched, and the cache's TTL skips them while a window is open.

A window closes when the session's next turn looks its history up (a *return*: the tokens it
found count as retention hits), when its deadline passes (an *expiry*), on an explicit
`release`, or when the operator cap on retained blocks makes room for a window expected back
sooner (the cap keeps the windows expected back first, refusing a new one expected last). Its
length is the session's expected tool time, learned from its own past gaps (an EWMA, times a
margin), or an explicit `ttl_s` hint; both are bounded by `max_ttl`. Windows are keyed by
(tenant, session): a session of one tenant never retains or releases another tenant's window.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from pacer.kv.prefix_cache import PrefixCache
from pacer.kv.radix_node import PrefixMatch, RadixNode

__all__ = ["SessionRetention", "RetentionWindow", "RetentionStats", "parse_retention_hint"]

SessionKey = tuple[str, str]   # (tenant, session)
_MAX_SESSIONS = 65536          # learned gaps kept (least recently used dropped first)


@dataclass(slots=True)
class RetentionWindow:
    tenant: str
    session: str
    node: RadixNode      # the deepest node of the conversation's path
    num_blocks: int
    opened: float
    deadline: float


@dataclass(slots=True)
class RetentionStats:
    """Monotonic counters (plus the `retained_blocks` gauge); `Engine.snapshot()` exports them."""

    windows_opened: int = 0
    retained_blocks: int = 0      # blocks under open windows now (shared prefixes counted per window)
    hit_tokens: int = 0           # tokens a returning turn found in its session's open window
    returns: int = 0              # windows closed by their session's next turn
    expiries: int = 0             # windows closed by their deadline
    releases: int = 0             # windows closed by a release hint
    answered: int = 0             # windows closed because the turn answered instead of calling a tool
    capped: int = 0               # windows closed (or not opened) to respect the operator cap
    demoted_blocks: int = 0       # retained blocks eviction took (demoted to the host tier when there is one)


def parse_retention_hint(value: object, max_ttl: float) -> tuple[float | None, bool]:
    """A request's `kv_retention` hint -> (ttl seconds or None, release). Raises ValueError
    naming the field and the limit."""
    if value is None:
        return None, False
    if not isinstance(value, dict):
        raise ValueError(f"kv_retention must be an object such as {{\"ttl_s\": 30}} or {{\"release\": true}}, "
                         f"got {value!r}")
    unknown = set(value) - {"ttl_s", "release"}
    if unknown:
        raise ValueError(f"kv_retention has unknown keys {sorted(unknown)}; allowed: ttl_s, release")
    release = value.get("release", False)
    if not isinstance(release, bool):
        raise ValueError(f"kv_retention.release must be a boolean, got {release!r}")
    ttl = value.get("ttl_s")
    if ttl is not None:
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 <= ttl <= max_ttl:
            raise ValueError(f"kv_retention.ttl_s must be a number in [0, {max_ttl:g}] seconds, got {ttl!r}")
        ttl = float(ttl)
    return ttl, release


class SessionRetention:
    """The open retention windows of one prefix cache (None or disabled: a null retention that
    opens nothing). `now` is the injected clock."""

    def __init__(self, cache: PrefixCache | None, now: Callable[[], float], *, enabled: bool = True,
                 default_ttl: float = 30.0, max_ttl: float = 300.0, max_blocks: int | None = None,
                 alpha: float = 0.3, margin: float = 4.0) -> None:
        if max_ttl <= 0 or default_ttl <= 0:
            raise ValueError(f"session retention TTLs must be > 0 seconds, got default {default_ttl}, max {max_ttl}")
        if max_blocks is not None and max_blocks < 0:
            raise ValueError(f"session_retention_max_blocks must be >= 0, got {max_blocks}")
        self.cache = cache
        self.enabled = enabled and cache is not None
        self._now = now
        self.default_ttl = min(default_ttl, max_ttl)
        self.max_ttl = max_ttl
        self.max_blocks = max_blocks
        self.alpha, self.margin = alpha, margin
        self.windows: dict[SessionKey, RetentionWindow] = {}
        self._gaps: OrderedDict[SessionKey, float] = OrderedDict()      # EWMA of tool gaps, seconds
        self._last_end: OrderedDict[SessionKey, float] = OrderedDict()  # when its last turn finished
        self.stats = RetentionStats()

    # ------------------------------------------------------------------ window length

    def expected_gap(self, tenant: str, session: str) -> float | None:
        """The session's learned tool time (EWMA of its past gaps), None before its first return."""
        return self._gaps.get((tenant, session))

    def ttl_for(self, tenant: str, session: str, hint: float | None = None) -> float:
        """How long a window of this session stays open: the hint, else margin x the learned
        gap (default_ttl before any), never above max_ttl."""
        if hint is not None:
            return min(hint, self.max_ttl)
        gap = self._gaps.get((tenant, session))
        return min(self.max_ttl, self.default_ttl if gap is None else max(self.margin * gap, 0.5))

    # ------------------------------------------------------------------ open / close

    def open(self, tenant: str, session: str, handle: PrefixMatch, ttl: float | None = None) -> bool:
        """A turn of (tenant, session) finished with `handle` its conversation's cached path:
        retain it (replacing the session's previous window). False: nothing retained."""
        key = (tenant, session)
        now = self._now()
        self._remember(self._last_end, key, now)
        self._close(key)
        if not self.enabled or handle.node.parent is None:
            return False
        ttl = self.ttl_for(tenant, session, ttl)
        n = handle.num_blocks
        if ttl <= 0 or n == 0:
            return False
        if self.max_blocks is not None:
            if n > self.max_blocks:
                self.stats.capped += 1
                return False
            deadline = now + ttl
            for old in sorted(self.windows.values(), key=lambda w: -w.deadline):   # expected back last first
                if self.stats.retained_blocks + n <= self.max_blocks:
                    break
                if old.deadline <= deadline:   # the new window is the one expected back last: keep the others
                    self.stats.capped += 1
                    return False
                self._close((old.tenant, old.session))
                self.stats.capped += 1
        self.windows[key] = RetentionWindow(tenant, session, handle.node, n, now, now + ttl)
        self._mark(handle.node, +1, now + ttl / self.margin)   # expected back after its learned gap
        self.stats.windows_opened += 1
        self.stats.retained_blocks += n
        return True

    def on_return(self, tenant: str, session: str, hit_tokens: int, block_size: int) -> int:
        """The session's next turn committed a hit of `hit_tokens`: learn the gap, close the
        window; returns the tokens it found because of the window (0 when none was open)."""
        key = (tenant, session)
        now = self._now()
        last = self._last_end.get(key)
        if last is not None:
            gap = max(0.0, now - last)
            prev = self._gaps.get(key)
            self._remember(self._gaps, key, gap if prev is None else self.alpha * gap + (1 - self.alpha) * prev)
        window = self.windows.get(key)
        if window is None:
            return 0
        found = min(hit_tokens, window.num_blocks * block_size)
        self._close(key)
        self.stats.returns += 1
        self.stats.hit_tokens += found
        return found

    def release(self, tenant: str, session: str, node: RadixNode | None = None) -> list[int]:
        """Close the session's window and drop its conversation's unlocked, unretained blocks
        now (`node`: the path of the turn that asked, else the window's); returns the dropped
        block ids (the caller frees them)."""
        window = self.windows.get((tenant, session))
        if window is not None:
            self._close((tenant, session))
            self.stats.releases += 1
            node = node or window.node
        if node is None or self.cache is None:
            return []
        return self.cache.drop_path(node)

    def answered(self, tenant: str, session: str) -> bool:
        """The session's last turn answered (no tool call, so no tool is running): its window
        closes and the conversation's blocks are evicted as any other's. False: none was open."""
        if (tenant, session) not in self.windows:
            return False
        self._close((tenant, session))
        self.stats.answered += 1
        return True

    def expire(self) -> int:
        """Close every window whose deadline has passed; returns how many."""
        if not self.windows:
            return 0
        now = self._now()
        due = [k for k, w in self.windows.items() if w.deadline <= now]
        for key in due:
            self._close(key)
        self.stats.expiries += len(due)
        return len(due)

    def sync_dropped(self) -> None:
        """Count the retained blocks eviction took since the last call (demotions)."""
        if self.cache is not None:
            self.stats.demoted_blocks = self.cache.num_retained_dropped

    def _close(self, key: SessionKey) -> None:
        window = self.windows.pop(key, None)
        if window is not None:
            self._mark(window.node, -1)
            self.stats.retained_blocks -= window.num_blocks

    def _mark(self, node: RadixNode | None, delta: int, next_use: float = 0.0) -> None:
        """Count a window on every node of the path (nodes split later copy the count) and, on
        opening, when it is expected back (the soonest of its windows); a leaf is re-keyed in
        the cache's eviction order."""
        while node is not None and node.parent is not None:
            node.next_use = next_use if delta > 0 and node.retain_ref == 0 else (
                min(node.next_use, next_use) if delta > 0 else node.next_use)
            node.retain_ref += delta
            if self.cache is not None:
                self.cache.rekey(node)
            node = node.parent

    @staticmethod
    def _remember(table: OrderedDict[SessionKey, float], key: SessionKey, value: float) -> None:
        table[key] = value
        table.move_to_end(key)
        if len(table) > _MAX_SESSIONS:
            table.popitem(last=False)

    # ------------------------------------------------------------------ checks

    def check_invariants(self) -> None:
        """Every retained node is covered by as many open windows as it counts; the gauge
        matches the windows; no window is past its deadline once `expire` has run."""
        counts: dict[int, int] = {}
        for w in self.windows.values():
            node: RadixNode | None = w.node
            while node is not None and node.parent is not None:
                counts[node.id] = counts.get(node.id, 0) + 1
                node = node.parent
        if self.cache is not None:
            for node in self.cache.iter_nodes():
                if node.retain_ref != counts.get(node.id, 0):
                    raise AssertionError(f"node {node.id} retain_ref {node.retain_ref} != windows {counts.get(node.id, 0)}")
        if self.stats.retained_blocks != sum(w.num_blocks for w in self.windows.values()):
            raise AssertionError("retained_blocks gauge disagrees with the open windows")
