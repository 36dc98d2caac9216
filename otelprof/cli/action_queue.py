"""The webhook's outgoing actions: queued per target, sent by a few workers, bounded everywhere.

``otelprof webhook`` answers Alertmanager as soon as a payload is checked and its actions are queued
here; what happens to them is logged and counted (``otelprof.webhook.*`` in the catalog). The rules:

* **One queue per target** (the ``host:port`` a request goes to), at most :attr:`ActionQueue.per_target`
  actions, and at most :attr:`ActionQueue.total` in all. Over a target's cap a new action is dropped; over
  the total the newest action of the payload holding the most actions is dropped (which may be the new one),
  so a storm cannot crowd out a payload of one alert. Drops are counted by cause and warned about once.
* **One request in flight per target**, :attr:`ActionQueue.workers` in all: a target that hangs holds one
  worker, never more. Workers serve the pending payloads in turn (the least recently served first, so a new
  payload goes next), so a stop for a healthy job is sent next to, not behind, a storm of actions for dead
  ones. (Many payloads of one alert each for distinct dead targets are still tried in arrival order.)
* **Bounded attempts**: :func:`otelprof.cli.actions.post_json` connects within a second and ends within the
  webhook's ``--timeout``, whatever the target does.
* **A circuit breaker per target**: after a failed attempt (unreachable, timed out, or answered 5xx / 429)
  its actions wait ``backoff`` seconds (doubling up to :attr:`ActionQueue.max_backoff`) and are retried until
  they are :attr:`ActionQueue.retry_for` seconds old; then they are given up (``failed``).
* **Identical pending actions are one**: the same action for the same URL while one is queued or in flight is
  counted ``duplicate`` and shares its outcome.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from otelprof import semconv as sc

log = logging.getLogger("otelprof.webhook")

SENT, REFUSED, FAILED, DUPLICATE = (sc.WEBHOOK_OUTCOME_SENT, sc.WEBHOOK_OUTCOME_REFUSED, sc.WEBHOOK_OUTCOME_FAILED,
                                    sc.WEBHOOK_OUTCOME_DUPLICATE)
QUEUED = "queued"
"""What :meth:`ActionQueue.submit` answers for an action it took (its outcome comes later)."""
TARGET_FULL, QUEUE_FULL = sc.WEBHOOK_DROP_TARGET_FULL, sc.WEBHOOK_DROP_QUEUE_FULL


MAX_SHARED = 16
"""Duplicates whose ``on_done`` an action keeps (more are counted, not told): the same alert re-sent while its
target is down costs no memory."""


def retryable(status: int) -> bool:
    """Statuses worth another attempt: the target is overloaded or broken, not refusing this request."""
    return status >= 500 or status == 429


@dataclass(eq=False)
class Action:
    """One request to send: ``send()`` returns the HTTP status, or raises OSError / ValueError when the target
    cannot be reached. ``on_done(outcome, detail)`` is called once with ``sent``, ``refused``, ``failed`` or a
    drop cause, for this action and for every duplicate merged into it."""

    action: str
    target: str
    key: tuple[str, ...]
    send: Callable[[], int]
    what: str
    retry: bool = True
    on_done: list[Callable[[str, str], None]] = field(default_factory=list)
    batch: int = 0
    created: float = 0.0
    attempts: int = 0


@dataclass(eq=False)
class _Target:
    queue: deque[Action] = field(default_factory=deque)
    busy: bool = False
    failures: int = 0
    retry_at: float = 0.0


class ActionQueue:
    """Per-target queues of :class:`Action` and the workers that send them (started when first needed)."""

    def __init__(self, workers: int = 8, per_target: int = 16, total: int = 1024, retry_for: float = 600.0,
                 backoff: float = 1.0, max_backoff: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.workers = workers
        self.per_target = per_target
        self.total = total
        self.retry_for = retry_for
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._clock = clock
        self._cond = threading.Condition()
        self._targets: dict[str, _Target] = {}
        self._pending: dict[tuple[str, ...], Action] = {}
        """Queued or in flight, by key."""
        self._batches: dict[int, dict[str, int]] = {}
        """Per payload: its queued actions per target, payloads in arrival order."""
        self._sizes: Counter[int] = Counter()
        """Per payload: its queued actions."""
        self._queued = 0
        self._in_flight = 0
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._batch_ids = itertools.count(1)
        self._turns = itertools.count(1)
        self._served: dict[int, int] = {}
        """When each payload last had an action taken: the least recently served goes next (new ones first)."""
        self.outcomes: Counter[tuple[str, str]] = Counter()
        """Finished actions by (action, outcome), plus duplicates."""
        self.dropped: Counter[str] = Counter()
        """Actions not queued (or pushed out), by cause."""
        self._warned: set[str] = set()
        self._failing = 0
        """Times a target started failing (logged at the 1st, 10th, 100th, ...)."""

    # ------------------------------------------------------------------ taking actions
    def new_batch(self) -> int:
        """An id for the actions of one payload: workers take turns between payloads."""
        return next(self._batch_ids)

    def submit(self, action: Action, batch: int = 0) -> str:
        """Queue ``action``: ``queued``, ``duplicate`` (an identical one is pending: it shares its outcome), or the
        cause it was dropped for (``target_full``, ``queue_full``; ``on_done`` is not called)."""
        evicted: Action | None = None
        with self._cond:
            if self._stopping:
                return QUEUE_FULL
            same = self._pending.get(action.key)
            if same is not None:
                same.on_done.extend(action.on_done[:max(0, MAX_SHARED - len(same.on_done))])
                self.outcomes[(action.action, DUPLICATE)] += 1
                return DUPLICATE
            if len(self._targets) > 2 * self.total:
                self._forget_idle()
            target = self._targets.setdefault(action.target, _Target())
            if len(target.queue) >= self.per_target:
                return self._drop(action, TARGET_FULL)
            if self._queued + self._in_flight >= self.total:
                evicted = self._evict(batch)
                if evicted is None:
                    return self._drop(action, QUEUE_FULL)
            action.batch, action.created = batch, self._clock()
            target.queue.append(action)
            self._pending[action.key] = action
            self._count_in(action)
            self._start_worker()
            self._cond.notify()
        if evicted is not None:
            self._finish(evicted, QUEUE_FULL, f"dropped: more than {self.total} actions queued")
        return QUEUED

    def _forget_idle(self) -> None:
        """Forget targets with nothing queued or in flight (and their failures): the map stays bounded."""
        for name in [n for n, t in self._targets.items() if not t.queue and not t.busy]:
            del self._targets[name]

    def _drop(self, action: Action, cause: str) -> str:
        self.dropped[cause] += 1
        if cause not in self._warned:
            self._warned.add(cause)
            log.warning("dropping %s: %s (counted in otelprof_webhook_dropped_total{reason=%r}; further drops are "
                        "not logged)", action.what, self._why(cause), cause)
        return cause

    def _why(self, cause: str) -> str:
        if cause == TARGET_FULL:
            return f"{self.per_target} actions already wait for its target"
        return f"{self.total} actions already wait"

    def _evict(self, batch: int) -> Action | None:
        """At the total cap: take back the newest action of the payload with the most queued actions, if it holds
        more than ``batch`` would with the new one (so one payload cannot crowd out others)."""
        if not self._sizes:
            return None
        largest = max(self._sizes, key=lambda b: self._sizes[b])
        if self._sizes[largest] <= self._sizes[batch] + 1:
            return None
        for name in reversed(self._batches[largest]):
            queue = self._targets[name].queue
            for action in reversed(queue):
                if action.batch == largest:
                    queue.remove(action)
                    self._unqueue(action, name)
                    del self._pending[action.key]
                    self.dropped[QUEUE_FULL] += 1
                    return action
        return None

    def _count_in(self, action: Action) -> None:
        counts = self._batches.setdefault(action.batch, {})
        counts[action.target] = counts.get(action.target, 0) + 1
        self._sizes[action.batch] += 1
        self._queued += 1

    def _unqueue(self, action: Action, name: str) -> None:
        self._sizes[action.batch] -= 1
        if not self._sizes[action.batch]:
            del self._sizes[action.batch]
        counts = self._batches[action.batch]
        counts[name] -= 1
        if not counts[name]:
            del counts[name]
            if not counts:
                del self._batches[action.batch]
        self._queued -= 1

    # ------------------------------------------------------------------ what the workers do
    def _start_worker(self) -> None:
        if len(self._threads) < self.workers and len(self._threads) < self._queued + self._in_flight:
            thread = threading.Thread(target=self._work, name=f"otelprof-webhook-action-{len(self._threads)}",
                                      daemon=True)
            self._threads.append(thread)
            thread.start()

    def _next(self) -> Action | None:
        """The next action to send (its target marked busy), taking payloads in turn; None if none may go now.
        Called with the lock held."""
        now = self._clock()
        for batch in sorted(self._batches, key=lambda b: self._served.get(b, 0)):  # stable: then by arrival
            for name in self._batches[batch]:
                target = self._targets[name]
                if target.busy or target.retry_at > now:
                    continue
                action = next(a for a in target.queue if a.batch == batch)
                target.queue.remove(action)
                target.busy = True
                self._unqueue(action, name)
                self._served[batch] = next(self._turns)  # this payload goes to the back of the turn
                if len(self._served) > 4 * self.total:
                    self._served = {b: n for b, n in self._served.items() if b in self._batches}
                self._in_flight += 1
                return action
        return None

    def _wait_time(self) -> float | None:
        """Seconds until a waiting target may be tried again (None: nothing waits on a clock)."""
        now = self._clock()
        times = [t.retry_at - now for t in self._targets.values() if t.queue and not t.busy and t.retry_at > now]
        return max(0.01, min(times)) if times else None

    def _work(self) -> None:
        while True:
            with self._cond:
                action = None
                while not self._stopping:
                    action = self._next()
                    if action is not None:
                        break
                    self._cond.wait(self._wait_time())
                if action is None:
                    return
            self._attempt(action)

    def _attempt(self, action: Action) -> None:
        action.attempts += 1
        try:
            status = action.send()
        except (OSError, ValueError) as exc:  # ValueError: a URL the client cannot use
            ok, outcome, detail = False, FAILED, f"unreachable ({_one_line(exc)})"
        except Exception as exc:  # a bug: this action fails, the workers go on
            ok, outcome, detail = False, FAILED, f"internal error ({_one_line(exc)})"
        else:
            ok = 200 <= status < 300
            outcome = SENT if ok else FAILED if retryable(status) else REFUSED
            detail = f"answered {status}"
        with self._cond:
            target = self._targets[action.target]
            target.busy = False
            again = False
            if ok or outcome == REFUSED:
                target.failures, target.retry_at = 0, 0.0
            else:
                target.failures += 1
                wait = min(self.max_backoff, self.backoff * 2 ** min(target.failures - 1, 30))
                target.retry_at = self._clock() + wait
                if target.failures == 1:
                    self._failing += 1
                    if self._failing == 10 ** (len(str(self._failing)) - 1):  # 1st, 10th, 100th, ...
                        log.warning("%s: %s; its target's actions wait %.0f s, then are retried (%d targets failed "
                                    "so far)", action.what, detail, wait, self._failing)
                again = action.retry and self._clock() - action.created + wait < self.retry_for
                if again:  # first in its target's queue again, in its payload's turn
                    self._in_flight -= 1
                    target.queue.appendleft(action)
                    self._count_in(action)
            if not again:
                self._pending.pop(action.key, None)
                if not target.queue and not target.busy and not target.failures:
                    del self._targets[action.target]  # forget healthy idle targets (the map stays bounded)
            self._cond.notify_all()
        if again:
            return
        if outcome == FAILED and action.attempts > 1:
            detail = f"{detail}; gave up after {action.attempts} attempts"
        self._finish(action, outcome, detail)  # still in flight: what it queues is seen by join()
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def _finish(self, action: Action, outcome: str, detail: str) -> None:
        if outcome in (SENT, REFUSED, FAILED):
            with self._cond:
                self.outcomes[(action.action, outcome)] += 1
        for callback in action.on_done:
            try:
                callback(outcome, detail)
            except Exception as exc:  # a bug in a callback: logged, the workers go on
                log.error("%s: outcome callback failed: %s", action.what, _one_line(exc))

    # ------------------------------------------------------------------ state
    def depth(self) -> int:
        """Actions queued or in flight."""
        with self._cond:
            return self._queued + self._in_flight

    def waiting_targets(self) -> int:
        """Targets whose last attempt failed (their actions wait for the backoff)."""
        with self._cond:
            return sum(1 for t in self._targets.values() if t.failures)

    def count(self, action: str, outcome: str) -> None:
        """Count an outcome decided without the queue (an action already sent for this alert: a duplicate)."""
        with self._cond:
            self.outcomes[(action, outcome)] += 1

    def metrics(self) -> tuple[dict[tuple[str, str], int], dict[str, int], int, int]:
        """(outcomes, drops, actions held, failing targets), read at once."""
        with self._cond:
            return (dict(self.outcomes), dict(self.dropped), self._queued + self._in_flight,
                    sum(1 for t in self._targets.values() if t.failures))

    def snapshot(self) -> dict[str, object]:
        with self._cond:
            return {"queued": self._queued, "in_flight": self._in_flight,
                    "targets_waiting": sum(1 for t in self._targets.values() if t.failures),
                    "outcomes": {f"{a}:{o}": n for (a, o), n in sorted(self.outcomes.items())},
                    "dropped": dict(self.dropped)}

    def join(self, timeout: float) -> bool:
        """Wait until nothing is queued or in flight (False at ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queued or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
            return True

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the workers after their current request (waiting at most ``timeout`` seconds in all: they are
        daemon threads); what is queued is dropped."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            threads = list(self._threads)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def _one_line(exc: BaseException) -> str:
    return repr(str(exc)[:200])[1:-1] or type(exc).__name__
