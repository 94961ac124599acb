// Drain of N no-op jobs by graphile-worker, for `dltsub bench all`.
//
// Usage: NODE_PATH=DIR/node_modules node graphile_drain.js DSN SCHEMA JOBS [PROCESSES] [CONCURRENCY]
//
// Installs graphile-worker's schema as SCHEMA (a scratch schema the caller drops
// afterwards), starts PROCESSES worker processes (default 4) and lets each warm up (load,
// connect), adds JOBS jobs in one statement, then tells every process to run until the
// queue is empty (`runOnce`). Settings are those of graphile-worker's own performance test
// (perfTest/ in its repository): 4 processes, 10 concurrent jobs each, a local queue of
// 500 prefetched jobs (one statement fetches up to 500), refetch delay 10 ms, completions
// batched with no delay (one statement completes many).
//
// Prints one JSON line: {"peer", "version", "jobs", "seconds", "jobs_per_sec", "left"}.
// Timing starts when the processes are told to go and ends when the last one is done.
"use strict";

const { fork } = require("child_process");
const { Pool } = require("pg");
const worker = require("graphile-worker");

const [dsn, schema, jobsArg, processesArg, concurrencyArg] = process.argv.slice(2);
const jobs = parseInt(jobsArg, 10);
const processes = parseInt(processesArg || "4", 10);
const concurrency = parseInt(concurrencyArg || "10", 10);
if (!/^[a-z_][a-z0-9_]*$/.test(schema || "")) {
  throw new Error("SCHEMA must be a plain lower-case identifier");
}

function options(pgPool) {
  return {
    pgPool,
    schema,
    concurrency,
    noHandleSignals: true,
    taskList: { noop: async () => {} },
    logger: new worker.Logger(() => () => {}),
    preset: {
      worker: {
        localQueue: { size: 500, refetchDelay: { durationMs: 10 } },
        completeJobBatchDelay: 0,
        failJobBatchDelay: 0,
      },
    },
  };
}

async function child() {
  const pgPool = new Pool({ connectionString: dsn, max: concurrency + 1 });
  pgPool.on("error", (error) => console.error(error));
  // Warm-up on the empty queue: compiles the options and opens the connections.
  await worker.runOnce(options(pgPool));
  process.send("ready");
  process.on("message", async (message) => {
    if (message !== "go") return;
    await worker.runOnce(options(pgPool));
    await pgPool.end();
    process.send("done", () => process.exit(0));
  });
}

async function parent() {
  const pgPool = new Pool({ connectionString: dsn, max: 2 });
  pgPool.on("error", (error) => console.error(error));
  await worker.runMigrations({ pgPool, schema, logger: new worker.Logger(() => () => {}) });
  const children = [];
  for (let i = 0; i < processes; i++) {
    const c = fork(__filename, [dsn, schema, jobsArg, processesArg || "4", concurrencyArg || "10", "--child"]);
    children.push(c);
  }
  await Promise.all(children.map((c) => new Promise((resolve, reject) => {
    c.once("message", (m) => (m === "ready" ? resolve() : reject(new Error(m))));
    c.once("exit", (code) => reject(new Error(`worker process exited ${code} before it was ready`)));
  })));
  await pgPool.query(
    `select ${schema}.add_jobs(array(
       select json_populate_record(null::${schema}.job_spec,
                json_build_object('identifier', 'noop', 'payload', json_build_object('i', i)))
       from generate_series(1, $1::int) i))`,
    [jobs],
  );
  const done = children.map((c) => new Promise((resolve, reject) => {
    c.removeAllListeners("exit");
    c.once("message", (m) => (m === "done" ? resolve() : reject(new Error(m))));
    c.once("exit", (code) => (code === 0 ? resolve() : reject(new Error(`worker process exited ${code}`))));
  }));
  const started = process.hrtime.bigint();
  children.forEach((c) => c.send("go"));
  await Promise.all(done);
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  const { rows } = await pgPool.query(`select count(*)::int as left from ${schema}._private_jobs`);
  await pgPool.end();
  console.log(JSON.stringify({
    peer: "graphile-worker",
    version: require("graphile-worker/package.json").version,
    settings: `${processes} processes x ${concurrency} concurrent, local queue 500, batched completion`,
    jobs,
    done: jobs - rows[0].left,
    seconds,
    jobs_per_sec: jobs / seconds,
    left: rows[0].left,
  }));
}

(process.argv.includes("--child") ? child() : parent()).catch((error) => {
  console.error(error);
  process.exit(1);
});
