"""The pool's lock knows who holds it; the watchdog logs a hold past its deadline, once, with the holder's stack."""

import threading

import structlog

from fairagents.policies.watched_lock import LockWatchdog, WatchedLock


def _hold(lock, taken, release):
    with lock:
        taken.set()
        release.wait(10)


def test_a_hold_past_the_deadline_is_logged_once_with_where_the_holder_is():
    lock, taken, release = WatchedLock(), threading.Event(), threading.Event()
    watchdog = LockWatchdog(lock, deadline=1.0)
    holder = threading.Thread(target=_hold, args=(lock, taken, release), name="engine-chat")
    holder.start()
    taken.wait(10)
    try:
        since = lock.holder()[1]
        with structlog.testing.capture_logs() as logs:
            assert not watchdog.check(now=since + 0.9)
            assert watchdog.check(now=since + 1.1)
            assert not watchdog.check(now=since + 5.0)  # the same hold: logged once
        [entry] = logs
        assert entry["event"] == "fairagents.policy.lock_held" and entry["thread"] == "engine-chat"
        assert "_hold" in entry["stack"] and entry["seconds"] > 1.0
    finally:
        release.set()
        holder.join()
    assert lock.holder() is None and not watchdog.check(now=since + 10)


def test_the_lock_is_reentrant_and_free_after_the_outer_release():
    lock = WatchedLock()
    assert lock.acquire()
    assert lock.acquire(blocking=False)
    lock.release()
    assert lock.holder() is not None
    lock.release()
    assert lock.holder() is None
    other = threading.Thread(target=lambda: lock.acquire(blocking=False) and lock.release())
    other.start()
    other.join()


def test_the_watchdog_thread_starts_and_stops():
    lock = WatchedLock()
    watchdog = LockWatchdog(lock, deadline=0.05)
    watchdog.start()
    watchdog.start()  # already watching
    with structlog.testing.capture_logs() as logs, lock:
        threading.Event().wait(0.5)
    watchdog.stop()
    assert [entry["event"] for entry in logs] == ["fairagents.policy.lock_held"]
