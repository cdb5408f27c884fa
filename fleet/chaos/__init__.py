"""Chaos drill: steady client load on an HA router pair while rolling restarts run, with seeded
kill -9 faults of the worker, the active router, an engine, or the Temporal dev server.

Stack (all on 127.0.0.1, every process started here and stopped by PID):
Temporal dev server (``--db-filename`` in the drill directory) · ``narwhal-worker`` ·
``narwhal-supervisor`` owning ``--engines`` simulated engines · two ``narwhal-serve`` on one shared
lease (r0 primary, r1 ``--standby-of`` r0) · rolling restarts started with ``narwhal-restart start``
one after another until ``--duration`` is over (the last one is waited for, bounded).

Faults (one at a time, at seeded random moments, kinds cycled in a seeded order):

* ``worker``   — SIGKILL the worker, start a new one after a short pause.
                 Recovered: the new worker logged ready.
* ``router``   — SIGKILL the router currently answering ``/ready`` 200. Recovered: the other router
                 answers ``/ready`` 200 (takeover); the killed one is restarted as ``--standby-of``
                 the new holder.
* ``engine``   — SIGKILL an engine that is in placement and not held by the lifecycle (pid from the
                 supervisor), then ``POST /engines/<iid>/start`` (not a restart: does not count).
                 Recovered: the active router's lifecycle document shows it ``accepts_new`` again.
* ``temporal`` — SIGKILL the dev server, start it again on the same ports and ``--db-filename``.
                 Recovered: a client connects.

Client: ``--concurrency`` closed-loop streams; a request refused before any byte (connection
refused/reset, 503 from a standby) is retried on the other router within a 10 s budget (what a
load balancer with health checks does) — masked. Whatever still fails is recorded and attributed
to a fault when it was in flight during that fault's window (kill → recovered + 2 s) and the fault
can cut a stream (router, engine). Anything else is *unattributed*.

Invariants (exit status 1 when violated):

* duplicated restarts = Σ max(0, supervisor ``restarts[iid]`` − restarts of ``iid`` reported by the
  workflows: a finished one's result, an unfinished one's live ``progress`` query, where an engine
  past its drain — restart command sent, not yet recorded — may own one) must be 0;
* lifecycle holds lost must be 0: sampled every 0.2 s from whichever router is active, an engine
  seen in a hold state must never be seen accepting new work without a ``readmitted`` event for it
  after the hold started (nor be in a hold state while ``accepts_new``);
* unattributed client failures must be 0.

The drill lives here (``stack``: the processes, ``drill``: load, sampler, restarts, faults and
the report, ``report``: verdict and summary, ``cli``: the command line); ``bench/chaos.py`` and
``python -m fleet.chaos`` are its command line:

    .venv/bin/python bench/chaos.py --short --json bench/results/chaos-short.json
    .venv/bin/python bench/chaos.py --duration 300 --engines 8 --seed 7 --faults worker,router,engine,temporal
"""
