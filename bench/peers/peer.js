// Drives one peer queue library against a throw-away redis-server, the way jobrt_bench_jobs
// drives jobrt, and prints one line of key=value pairs in the same form.
//
//   node peer.js PORT PEER throughput N CONCURRENCY GROUPS [MAX_SECONDS=120]
//     enqueues N no-op jobs in batches of 1,000 (BullMQ addBulk, bee-queue saveAll, GroupMQ
//     add with its autoBatch of 1,000), then one worker with CONCURRENCY runs them. When the
//     processing takes longer than MAX_SECONDS, jobs/s is what was done by then (drained=0).
//   node peer.js PORT PEER pickup N GROUPED
//     an idle worker; N jobs added one at a time, each after the previous one started; prints
//     the add-to-handler-start latency p50/p99.
// PEER: bullmq, bee (bee-queue) or groupmq. GROUPS 0 = ungrouped (BullMQ, bee-queue); GroupMQ
// needs a group per job. Completed jobs are removed by every peer, as jobrt does.
// The server is flushed. Any error exits non-zero with a message: the suite never skips silently.
'use strict';

const Redis = require('ioredis');

const [port, peer, mode, ...rest] = process.argv.slice(2);
if (!port || !['bullmq', 'bee', 'groupmq'].includes(peer) || !['throughput', 'pickup'].includes(mode)) {
  console.error('usage: node peer.js PORT bullmq|bee|groupmq throughput N C GROUPS [MAX_SECONDS] | pickup N GROUPED');
  process.exit(2);
}
const host = '127.0.0.1';
const redisPort = Number(port);
const queueName = 'bench';

function fail(e) {
  console.error(`peer.js ${peer} ${mode}: ${e && e.stack ? e.stack : e}`);
  process.exit(1);
}
process.on('unhandledRejection', fail);
process.on('uncaughtException', fail);
// A hard bound on the whole run (PEER_DEADLINE seconds, 280 unless set): a peer that hangs (a
// lost server, a job that never runs) fails the suite instead of stalling it.
const deadline = Number(process.env.PEER_DEADLINE || 280);
setTimeout(() => fail(new Error(`no result within ${deadline} s`)), deadline * 1000).unref();

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const nowUs = () => Number(process.hrtime.bigint()) / 1000;

// Waits for `promise`, failing after `ms` milliseconds.
async function withTimeout(promise, ms, message) {
  let timer = null;
  const bound = new Promise((resolve, reject) => (timer = setTimeout(() => reject(new Error(message)), ms)));
  try {
    return await Promise.race([promise, bound]);
  } finally {
    clearTimeout(timer);
  }
}

function infoFields(text) {
  const out = {};
  for (const line of text.split(/\r?\n/)) {
    const colon = line.indexOf(':');
    if (colon > 0 && line[0] !== '#') out[line.slice(0, colon)] = line.slice(colon + 1);
  }
  return out;
}

// The same counters as jobrt_bench_jobs: INFO cpu, commandstats (but INFO and CONFIG), memory.
async function readStats(admin) {
  const f = infoFields(await admin.info('all'));
  let commands = 0;
  for (const [k, v] of Object.entries(f)) {
    if (!k.startsWith('cmdstat_') || k === 'cmdstat_info' || k.startsWith('cmdstat_config')) continue;
    commands += Number(/calls=(\d+)/.exec(v)[1]);
  }
  return {
    cpu: Number(f.used_cpu_user) + Number(f.used_cpu_sys),
    commands,
    memory: Number(f.used_memory),
  };
}

function percentile(values, p) {
  const v = [...values].sort((a, b) => a - b);
  return v[Math.floor(p * (v.length - 1))];
}

// Each peer behind one small interface: produce(batch of group ids), start(handler, concurrency),
// close(). A group id is null for an ungrouped job.
async function makePeer(batched) {
  if (peer === 'bullmq') {
    const { Queue, Worker } = require('bullmq');
    const connection = { host, port: redisPort, maxRetriesPerRequest: null };
    const queue = new Queue(queueName, { connection });
    await queue.waitUntilReady();
    let worker = null;
    return {
      async produce(groups) {
        if (groups.length === 1) {
          await queue.add('noop', {}, { removeOnComplete: true, removeOnFail: true });
          return;
        }
        await queue.addBulk(groups.map(() => ({ name: 'noop', data: {}, opts: { removeOnComplete: true, removeOnFail: true } })));
      },
      async start(handler, concurrency) {
        worker = new Worker(queueName, async () => handler(), { connection, concurrency, autorun: false });
        worker.on('error', fail);
        worker.run().catch(fail);
        await worker.waitUntilReady();
      },
      async close() {
        if (worker) await worker.close(true);
        await queue.close();
      },
    };
  }
  if (peer === 'bee') {
    const BeeQueue = require('bee-queue');
    const redis = { host, port: redisPort };
    const producer = new BeeQueue(queueName, { redis, isWorker: false, getEvents: false, sendEvents: false, storeJobs: false });
    await producer.ready();
    let worker = null;
    return {
      async produce(groups) {
        if (groups.length === 1) {
          await producer.createJob({}).save();
          return;
        }
        const errors = await producer.saveAll(groups.map(() => producer.createJob({})));
        if (errors.size) throw [...errors.values()][0];
      },
      async start(handler, concurrency) {
        worker = new BeeQueue(queueName, {
          redis,
          isWorker: true,
          getEvents: false,
          sendEvents: false,
          storeJobs: false,
          removeOnSuccess: true,
          removeOnFailure: true,
          activateDelayedJobs: false,
        });
        worker.on('error', fail);
        await worker.ready();
        worker.process(concurrency, async () => handler());
      },
      async close() {
        if (worker) await worker.close(5000);
        await producer.close(5000);
      },
    };
  }
  const { Queue, Worker } = require('groupmq');
  const client = new Redis({ host, port: redisPort, maxRetriesPerRequest: null });
  const queueOptions = { redis: client, namespace: queueName, keepCompleted: 0, keepFailed: 0 };
  if (batched) queueOptions.autoBatch = { size: 1000, maxWaitMs: 5 };
  const queue = new Queue(queueOptions);
  let worker = null;
  let workerClient = null;
  let sequence = 0;
  return {
    async produce(groups) {
      await Promise.all(groups.map((g) => queue.add({ groupId: g === null ? 'none' : g, data: { n: sequence++ } })));
    },
    async start(handler, concurrency) {
      // The worker's queue gets a client of its own, as a separate process would have.
      workerClient = new Redis({ host, port: redisPort, maxRetriesPerRequest: null });
      const workerQueue = new Queue({ redis: workerClient, namespace: queueName, keepCompleted: 0, keepFailed: 0 });
      worker = new Worker({ queue: workerQueue, concurrency, handler: async () => handler(), onError: fail });
      worker.run().catch(fail);
    },
    async close() {
      if (worker) await worker.close(1000);
      await queue.close();
      client.disconnect();
      if (workerClient) workerClient.disconnect();
    },
  };
}

async function throughput(n, concurrency, groups, maxSeconds) {
  const admin = new Redis({ host, port: redisPort });
  await admin.flushall();
  await admin.config('RESETSTAT');
  const p = await makePeer(true);
  const s0 = await readStats(admin);
  const t0 = nowUs();
  for (let first = 0; first < n; first += 1000) {
    const batch = [];
    for (let i = first; i < Math.min(n, first + 1000); ++i) batch.push(groups > 0 ? String(i % groups) : null);
    await p.produce(batch);
  }
  const t1 = nowUs();
  const s1 = await readStats(admin);

  let done = 0;
  let finished = null;
  const allDone = new Promise((resolve) => (finished = resolve));
  const cpu0 = process.cpuUsage();
  const t2 = nowUs();
  await p.start(async () => {
    if (++done === n) finished();
  }, concurrency);
  let timer = null;
  await Promise.race([allDone, new Promise((resolve) => (timer = setTimeout(resolve, maxSeconds * 1000)))]);
  clearTimeout(timer);
  const t3 = nowUs();
  const cpu1 = process.cpuUsage(cpu0);
  const processed = done;
  const s2 = await readStats(admin);
  await p.close();
  await admin.quit();
  if (processed === 0) throw new Error(`no job ran in ${maxSeconds} s`);
  const secs = (t3 - t2) / 1e6;
  const f = (x, d) => x.toFixed(d);
  console.log(
    [
      `peer=${peer} throughput groups=${groups} n=${n} concurrency=${concurrency}`,
      `jobs_per_sec=${f(processed / secs, 0)} enqueue_per_sec=${f(n / ((t1 - t0) / 1e6), 0)}`,
      `cmds_per_job=${f((s1.commands - s0.commands) / n + (s2.commands - s1.commands) / processed, 2)}`,
      `enqueue_cmds_per_job=${f((s1.commands - s0.commands) / n, 2)} process_cmds_per_job=${f((s2.commands - s1.commands) / processed, 2)}`,
      `redis_cpu_us_per_job=${f(((s1.cpu - s0.cpu) / n + (s2.cpu - s1.cpu) / processed) * 1e6, 2)}`,
      `enqueue_cpu_us_per_job=${f(((s1.cpu - s0.cpu) / n) * 1e6, 2)} process_cpu_us_per_job=${f(((s2.cpu - s1.cpu) / processed) * 1e6, 2)}`,
      `mem_bytes_per_job=${f((s1.memory - s0.memory) / n, 1)}`,
      `worker_cpu_us_per_job=${f((cpu1.user + cpu1.system) / processed, 2)}`,
      `processed=${processed} drained=${processed >= n ? 1 : 0}`,
    ].join(' '),
  );
}

async function pickup(n, grouped) {
  const admin = new Redis({ host, port: redisPort });
  await admin.flushall();
  const p = await makePeer(false);
  let started = 0;
  let wake = null;
  await p.start(async () => {
    started = nowUs();
    if (wake) wake();
  }, 100);
  await sleep(200); // the worker is up and waiting
  const latencies = [];
  for (let i = 0; i < n; ++i) {
    await sleep(1); // the worker is idle again (a timer in Node waits at least 1 ms)
    started = 0;
    const ran = new Promise((resolve) => (wake = resolve));
    const sent = nowUs();
    await p.produce([grouped ? String(i) : null]);
    await withTimeout(ran, 10000, `job ${i} did not start within 10 s`);
    latencies.push(started - sent);
  }
  await p.close();
  await admin.quit();
  console.log(
    `peer=${peer} pickup grouped=${grouped ? 'true' : 'false'} n=${n} p50_us=${percentile(latencies, 0.5).toFixed(0)} ` +
      `p99_us=${percentile(latencies, 0.99).toFixed(0)} ` +
      [10, 25, 75, 90, 95].map((p) => `p${p}_us=${percentile(latencies, p / 100).toFixed(0)}`).join(' '),
  );
}

(async () => {
  if (mode === 'throughput') {
    const [n, c, groups, maxSeconds] = rest.map(Number);
    if (peer === 'groupmq' && !(groups > 0)) throw new Error('GroupMQ needs GROUPS > 0');
    await throughput(n, c, groups || 0, maxSeconds || 120);
  } else {
    const [n, grouped] = rest.map(Number);
    if (peer === 'groupmq' && !grouped) throw new Error('GroupMQ needs GROUPED = 1');
    await pickup(n, Boolean(grouped));
  }
  process.exit(0);
})().catch(fail);
