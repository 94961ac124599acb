"""Drain of N no-op jobs by PgQueuer, for `dltsub bench all`.

Usage: pgqueuer_drain.py DSN SCHEMA JOBS [WORKERS] [BATCH_SIZE]

Installs PgQueuer's tables in SCHEMA (a scratch schema the caller drops afterwards),
enqueues JOBS jobs in one statement, then starts WORKERS queue managers, each on its own
connection, each fetching BATCH_SIZE jobs per statement, in PgQueuer's drain mode (they
stop once the queue is empty). The defaults, 5 workers of 10, are PgQueuer's own drain
benchmark settings (tools/benchmark.py in its repository); asyncpg and uvloop as there.

Prints one JSON line: {"peer", "version", "jobs", "seconds", "jobs_per_sec", "left"}.
Timing starts when the workers start and ends when all of them have stopped.
"""

import asyncio
import json
import os
import sys
import time


async def main() -> None:
    dsn, schema, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    workers = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    batch_size = int(sys.argv[5]) if len(sys.argv) > 5 else 10
    # PgQueuer reads its object names (and their schema) from the environment once.
    os.environ["PGQUEUER_SCHEMA"] = schema

    import asyncpg
    import pgqueuer
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    setup = Queries(AsyncpgDriver(await asyncpg.connect(dsn=dsn)))
    await setup.install()
    for start in range(0, jobs, 50_000):
        n = min(50_000, jobs - start)
        await setup.enqueue(["noop"] * n, [None] * n, [0] * n)

    done = 0

    def make_worker(connection) -> PgQueuer:
        worker = PgQueuer(AsyncpgDriver(connection))

        @worker.entrypoint("noop")
        async def noop(job) -> None:
            nonlocal done
            done += 1

        return worker

    connections = [await asyncpg.connect(dsn=dsn) for _ in range(workers)]
    queues = [make_worker(c) for c in connections]
    started = time.perf_counter()
    await asyncio.gather(
        *(q.run(batch_size=batch_size, mode=QueueExecutionMode.drain) for q in queues)
    )
    seconds = time.perf_counter() - started
    left = sum(s.count for s in await setup.queue_size())
    print(
        json.dumps(
            {
                "peer": "pgqueuer",
                "version": pgqueuer.__version__,
                "settings": f"{workers} workers x batch {batch_size}, asyncpg, uvloop",
                "jobs": jobs,
                "done": done,
                "seconds": seconds,
                "jobs_per_sec": jobs / seconds,
                "left": left,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
