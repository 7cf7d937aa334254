#!/usr/bin/env python3
"""End-to-end check of a running server with the stock greenstalk client.

Usage: python3 greenstalk_check.py PORT [--extensions]
       (server on 127.0.0.1:PORT; --extensions: delayq's job options too)

A producer and a worker connection do a full round trip on a tube of their
own: priorities and FIFO order, a 1-second delay, release, bury/kick,
kick-job, touch, DEADLINE_SOON, stats-job, stats-tube, use/watch/ignore,
pause-tube, and NOT_FOUND / NOT_IGNORED errors. It passes against
beanstalkd 1.12 and must pass against delayq.

Prints one line per failed check and, at the end, `greenstalk: N passed,
M failed`. Exits 0 only when nothing failed. Runs in about 1.5 s; a hard
alarm stops it after 30 s so CI never hangs on it.

Timing-sensitive values are checked with tolerances (time-left in a range,
the delayed job only after ~1 s) so the result does not depend on load.
"""

import os
import signal
import socket
import sys
import time

try:
    import greenstalk
except ImportError:
    print("greenstalk is not installed: python3 -m pip install greenstalk", file=sys.stderr)
    print("greenstalk: 0 passed, 1 failed")
    sys.exit(2)

PASSED = 0
FAILED = 0
SKIPPED = 0


def ok(name, cond, detail=""):
    global PASSED, FAILED
    if cond:
        PASSED += 1
    else:
        FAILED += 1
        print(f"FAIL {name}" + (f": {detail}" if detail else ""), flush=True)
    return cond


def eq(name, got, want):
    return ok(name, got == want, f"got {got!r}, want {want!r}")


def raises(name, exc, fn):
    try:
        got = fn()
    except exc:
        return ok(name, True)
    except Exception as e:  # noqa: BLE001 - report whatever came back
        return ok(name, False, f"raised {type(e).__name__}: {e!r}, want {exc.__name__}")
    return ok(name, False, f"returned {got!r}, want {exc.__name__}")


def summary_and_exit():
    skipped = f", {SKIPPED} skipped" if SKIPPED else ""
    print(f"greenstalk: {PASSED} passed, {FAILED} failed{skipped}")
    sys.exit(0 if FAILED == 0 else 1)


def on_alarm(signum, frame):
    global FAILED
    FAILED += 1
    print("FAIL timeout: the check did not finish within 30 s (server hung?)", flush=True)
    summary_and_exit()


def run(addr):
    global SKIPPED
    tube = f"ci-gs-{os.getpid()}-{int(time.time() * 1000) % 100000}"
    producer = greenstalk.Client(addr, use=tube)
    worker = greenstalk.Client(addr, watch=tube)

    # use / watch
    eq("producer using", producer.using(), tube)
    eq("worker watching", worker.watching(), [tube])
    ok("tube listed", tube in producer.tubes(), f"{tube} not in {producer.tubes()}")

    # puts: priorities, a FIFO tie, one delayed job (least urgent so that it
    # cannot jump the queue even on a slow machine)
    t_put = time.monotonic()
    ids = {
        "low": producer.put("low", priority=500),
        "high": producer.put("high", priority=10),
        "mid": producer.put("mid", priority=100),
        "mid2": producer.put("mid2", priority=100),
        "later": producer.put("later", priority=100000, delay=1),
    }
    ok("put ids are distinct and increasing",
       list(ids.values()) == sorted(set(ids.values())), repr(ids))

    # These hold only while the delayed job is still delayed: they are kept
    # if the block ran within 0.9 s of the put, else counted as skipped.
    early = []

    def soon(name, got, want):
        early.append((name, got == want, f"got {got!r}, want {want!r}"))

    st = producer.stats_tube(tube)
    soon("stats-tube ready", st["current-jobs-ready"], 4)
    soon("stats-tube delayed", st["current-jobs-delayed"], 1)
    soon("stats-tube urgent", st["current-jobs-urgent"], 4)
    eq("stats-tube total-jobs", st["total-jobs"], 5)
    eq("stats-tube using", st["current-using"], 1)
    eq("stats-tube watching", st["current-watching"], 1)
    eq("stats-tube name", st["name"], tube)

    sj = producer.stats_job(ids["later"])
    soon("stats-job delayed state", sj["state"], "delayed")
    eq("stats-job delayed delay", sj["delay"], 1)
    eq("stats-job delayed pri", sj["pri"], 100000)
    eq("stats-job delayed tube", sj["tube"], tube)
    soon("stats-job delayed time-left in 0..1", sj["time-left"] in (0, 1), True)

    try:
        j = producer.peek_delayed()
        soon("peek-delayed", (j.id, j.body), (ids["later"], "later"))
    except greenstalk.NotFoundError:
        soon("peek-delayed", "NOT_FOUND", (ids["later"], "later"))
    j = producer.peek_ready()
    eq("peek-ready", (j.id, j.body), (ids["high"], "high"))
    raises("peek-buried when none", greenstalk.NotFoundError, producer.peek_buried)
    if time.monotonic() - t_put < 0.9:
        for check in early:
            ok(*check)
    else:
        SKIPPED += len(early)
        print(f"note: {len(early)} delayed-state checks skipped (slow machine)", flush=True)

    # worker takes jobs in priority order, FIFO within a priority
    got = {}
    for name in ("high", "mid", "mid2", "low"):
        job = worker.reserve(timeout=0)
        eq(f"reserve order {name}", (job.id, job.body), (ids[name], name))
        got[name] = job

    sj = worker.stats_job(got["high"])
    eq("stats-job reserved state", sj["state"], "reserved")
    eq("stats-job reserved reserves", sj["reserves"], 1)
    eq("stats-job ttr", sj["ttr"], greenstalk.DEFAULT_TTR)
    ok("stats-job reserved time-left", 55 <= sj["time-left"] <= 60, repr(sj["time-left"]))
    eq("stats-tube reserved", producer.stats_tube(tube)["current-jobs-reserved"], 4)
    if time.monotonic() - t_put < 0.8:
        raises("delayed job not ready early", greenstalk.TimedOutError,
               lambda: worker.reserve(timeout=0))

    # release with a new priority, reserve it again
    worker.release(got["mid"], priority=5)
    sj = worker.stats_job(got["mid"])
    eq("released job ready", (sj["state"], sj["pri"], sj["releases"]), ("ready", 5, 1))
    job = worker.reserve(timeout=0)
    eq("reserve released job", (job.id, job.body), (ids["mid"], "mid"))
    eq("reserves counted", worker.stats_job(job)["reserves"], 2)
    got["mid"] = job

    # bury / peek-buried / kick
    worker.bury(got["low"], priority=7)
    sj = worker.stats_job(got["low"])
    eq("buried job", (sj["state"], sj["pri"], sj["buries"]), ("buried", 7, 1))
    j = producer.peek_buried()
    eq("peek-buried", (j.id, j.body), (ids["low"], "low"))
    eq("stats-tube buried", producer.stats_tube(tube)["current-jobs-buried"], 1)
    eq("kick 10 -> buried only", producer.kick(10), 1)
    sj = worker.stats_job(got["low"])
    eq("kicked job", (sj["state"], sj["kicks"]), ("ready", 1))
    job = worker.reserve(timeout=0)
    eq("reserve kicked job", (job.id, job.body), (ids["low"], "low"))
    got["low"] = job

    # bury / kick-job
    worker.bury(got["mid2"])
    producer.kick_job(ids["mid2"])
    eq("kick-job makes job ready", worker.stats_job(ids["mid2"])["state"], "ready")
    raises("kick-job of a ready job", greenstalk.NotFoundError,
           lambda: producer.kick_job(ids["mid2"]))
    job = worker.reserve(timeout=0)
    eq("reserve kick-job'd job", (job.id, job.body), (ids["mid2"], "mid2"))
    got["mid2"] = job

    # touch
    worker.touch(got["high"])
    ok("touch keeps time-left near ttr",
       55 <= worker.stats_job(got["high"])["time-left"] <= 60)
    raises("touch by another connection", greenstalk.NotFoundError,
           lambda: producer.touch(got["high"]))
    raises("delete by another connection", greenstalk.NotFoundError,
           lambda: producer.delete(got["high"]))

    # the delayed job arrives after ~1 s
    job = worker.reserve(timeout=5)
    waited = time.monotonic() - t_put
    eq("delayed job", (job.id, job.body), (ids["later"], "later"))
    ok("delayed job not before its delay", waited >= 0.9, f"after {waited:.3f}s")
    got["later"] = job

    # delete everything
    for name, job in got.items():
        worker.delete(job)
        ok(f"deleted {name}", True)
    raises("delete twice", greenstalk.NotFoundError, lambda: worker.delete(ids["high"]))
    raises("peek deleted", greenstalk.NotFoundError, lambda: producer.peek(ids["high"]))
    raises("reserve on empty tube", greenstalk.TimedOutError, lambda: worker.reserve(timeout=0))
    st = producer.stats_tube(tube)
    eq("stats-tube empty",
       [st[k] for k in ("current-jobs-ready", "current-jobs-reserved",
                        "current-jobs-delayed", "current-jobs-buried")], [0, 0, 0, 0])
    eq("stats-tube cmd-delete", st["cmd-delete"], 5)

    # TTR and DEADLINE_SOON (ttr 1: the safety margin starts at once)
    jid = producer.put("ttr", ttr=1)
    job = worker.reserve(timeout=0)
    eq("reserve ttr job", job.id, jid)
    raises("deadline soon", greenstalk.DeadlineSoonError, lambda: worker.reserve(timeout=2))
    try:
        worker.release(job)
    except greenstalk.NotFoundError:
        pass  # only on a stalled machine: the 1 s TTR ran out, the job is ready again
    worker.delete(jid)

    # pause-tube
    producer.pause_tube(tube, 60)
    eq("stats-tube pause", producer.stats_tube(tube)["pause"], 60)
    producer.put("paused")
    raises("no reserve from a paused tube", greenstalk.TimedOutError,
           lambda: worker.reserve(timeout=0))
    producer.pause_tube(tube, 0)
    job = worker.reserve(timeout=0)
    eq("reserve after unpause", job.body, "paused")
    worker.delete(job)

    # watch / ignore
    eq("watch default", worker.watch("default"), 2)
    eq("ignore default", worker.ignore("default"), 1)
    raises("ignore the last tube", greenstalk.NotIgnoredError, lambda: worker.ignore(tube))
    raises("stats-tube of a missing tube", greenstalk.NotFoundError,
           lambda: producer.stats_tube(tube + "-missing"))

    s = producer.stats()
    for key in ("current-jobs-ready", "cmd-put", "cmd-reserve-with-timeout",
                "current-connections", "total-jobs", "max-job-size", "version", "draining"):
        ok(f"stats has {key}", key in s)

    producer.close()
    worker.close()


def connect(addr):
    """A plain socket to the server: a Unix socket's path, or (host, port)."""
    if isinstance(addr, str):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(addr)
        return s
    return socket.create_connection(addr)


def raw(addr, line):
    """One command no stock client sends; its first reply line."""
    with connect(addr) as s:
        s.sendall(line)
        return s.makefile("rb").readline().decode().strip()


def extensions(addr):
    """delayq's job options, seen through the stock client: a dead letter
    that release buries (greenstalk raises BuriedError for that reply, as
    for beanstalkd's out-of-memory bury), stats with extra keys, an expiry
    counted in stats-tube. Set up with raw lines, worked with greenstalk."""
    tube = f"ci-gs-ext-{os.getpid()}"
    eq("tube-set", raw(addr, f"tube-set {tube} tries=2 backoff=1ms\r\n".encode()), "SET")
    producer = greenstalk.Client(addr, use=tube)
    worker = greenstalk.Client(addr, watch=tube)
    jid = producer.put("flaky", ttr=60)
    job = worker.reserve(timeout=5)
    worker.release(job)
    job = worker.reserve(timeout=5)
    eq("second try", job.id, jid)
    raises("release after the last try buries", greenstalk.BuriedError,
           lambda: worker.release(job))
    sj = producer.stats_job(jid)
    eq("dead letter", (sj["state"], sj["buried-because"], sj["tries"], sj["max-tries"]),
       ("buried", "tries", 2, 2))
    eq("stats-job keeps beanstalkd's keys", (sj["id"], sj["tube"], sj["reserves"]), (jid, tube, 2))
    eq("peek-buried", producer.peek_buried().id, jid)
    producer.kick_job(jid)
    eq("a kick starts a fresh round", producer.stats_job(jid)["tries"], 0)
    producer.delete(jid)
    body = b"short-lived"
    eq("put with ttl", raw(addr, b"use %s\r\nput 0 0 60 %d ttl=200ms\r\n%s\r\n"
                            % (tube.encode(), len(body), body)), f"USING {tube}")
    time.sleep(0.5)
    st = producer.stats_tube(tube)
    eq("expired and counted", (st["current-jobs-ready"], st["total-jobs-expired"]), (0, 1))
    ok("stats counts expiries", producer.stats()["total-jobs-expired"] >= 1)
    producer.close()
    worker.close()


def main():
    args = sys.argv[1:]
    with_extensions = "--extensions" in args
    args = [a for a in args if a != "--extensions"]
    if len(args) != 1 or not (args[0].isdigit() or args[0].startswith("unix:")):
        print(f"usage: {sys.argv[0]} PORT|unix:PATH [--extensions]", file=sys.stderr)
        sys.exit(2)
    # greenstalk takes a Unix socket's path as its address.
    addr = args[0][5:] if args[0].startswith("unix:") else ("127.0.0.1", int(args[0]))
    socket.setdefaulttimeout(10)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(30)
    global FAILED
    try:
        run(addr)
        if with_extensions:
            extensions(addr)
    except ConnectionRefusedError:
        FAILED += 1
        print(f"FAIL cannot connect to {addr}", flush=True)
    except Exception as e:  # noqa: BLE001 - any surprise is a failure
        FAILED += 1
        print(f"FAIL unexpected {type(e).__name__}: {e!r}", flush=True)
    summary_and_exit()


if __name__ == "__main__":
    main()
