// Helpers for the dashboard's browser tests: the jobrt processes (CLI, worker, dashboard), a
// Redis server, and waiting for conditions by polling (playwright-core has no `expect`).
import { spawn, spawnSync, execFile } from 'node:child_process';
import { createInterface } from 'node:readline';
import { createServer, connect } from 'node:net';
import { get as httpGet } from 'node:http';
import { fileURLToPath } from 'node:url';
import { setTimeout as delay } from 'node:timers/promises';

export const JOBRT_BIN = process.env.JOBRT_BIN || '/work/main/build/dev/runtime/jobrt';
export const JOBRT_HANDLERS = process.env.JOBRT_HANDLERS || '/work/main/build/dev/handlers';
export const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
export const CHROMIUM_ARGS = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];

const REDIS_SCRIPT = fileURLToPath(new URL('../../scripts/redis.sh', import.meta.url));

// The children's environment: none of the jobrt settings of the caller's (a JOBRT_DASHBOARD_TOKEN
// or REDIS_URL there would change what the tests start).
const childEnv = Object.fromEntries(Object.entries(process.env)
  .filter(([k]) => !k.startsWith('JOBRT_') && k !== 'REDIS_URL'));

// --- waiting ---

// Calls `check` until it returns something other than false/undefined (that value is returned)
// or `timeout` ms have passed (then throws, with the last error `check` threw, if any). `what`
// names the condition: text, or a function giving it then.
export async function eventually(check, { timeout = 10000, interval = 100, what = 'a condition' } = {}) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      const v = await check();
      if (v !== false && v !== undefined) return v;
      last = undefined;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) {
      const name = typeof what === 'function' ? what() : what;
      throw new Error(`timed out after ${timeout} ms waiting for ${name}${last ? ': ' + last.message : ''}`);
    }
    await delay(interval);
  }
}

// Waits until the locator's text (trimmed) equals `expected`, or matches it when a RegExp.
export async function hasText(locator, expected, timeout = 10000) {
  let seen;
  await eventually(async () => {
    seen = ((await locator.textContent({ timeout: 1000 })) ?? '').trim();
    return expected instanceof RegExp ? expected.test(seen) : seen === expected;
  }, { timeout, what: () => `text ${JSON.stringify(String(expected))} in ${locator} (last seen: ${JSON.stringify(seen)})` });
  return seen;
}

// Waits until the locator matches exactly `n` elements.
export async function hasCount(locator, n, timeout = 10000) {
  let seen;
  await eventually(async () => (seen = await locator.count()) === n,
    { timeout, what: () => `${n} of ${locator} (last seen: ${seen})` });
}

// --- processes ---

const children = new Set();

// Whatever is still running when this process ends is killed (a failed or timed-out test, ^C).
process.on('exit', () => {
  for (const c of children) try { c.kill('SIGKILL'); } catch { /* gone */ }
});
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => process.exit(130));
}

// A jobrt process kept track of, with its output gathered.
function start(args) {
  const child = spawn(JOBRT_BIN, args, { env: childEnv, stdio: ['ignore', 'pipe', 'pipe'] });
  child.output = '';
  child.exited = new Promise((resolve) => {
    child.once('exit', (code, signal) => resolve({ code, signal }));
    child.once('error', (e) => { child.output += `spawn error: ${e.message}\n`; resolve({ error: e }); });
  });
  for (const s of [child.stdout, child.stderr]) s.on('data', (d) => { child.output += d; });
  children.add(child);
  child.exited.then(() => children.delete(child));
  return child;
}

// Stops one child: SIGTERM, again after 1 s (a worker's forced stop), SIGKILL after 5 s.
export async function stop(child) {
  if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) return;
  const gone = child.exited.then(() => true);
  child.kill('SIGTERM');
  if (await Promise.race([gone, delay(1000, false)])) return;
  child.kill('SIGTERM');
  if (await Promise.race([gone, delay(4000, false)])) return;
  child.kill('SIGKILL');
  await gone;
}

// Stops every child still running (all at once).
export async function stopAll() {
  await Promise.all([...children].map(stop));
}

// Waits until the child's output matches `re`; fails when it exits first or after `timeout`.
async function waitForOutput(child, re, timeout, what) {
  await eventually(() => {
    if (re.test(child.output)) return true;
    if (child.exitCode !== null || child.signalCode !== null || child.output.startsWith('spawn error'))
      throw new Error(`${what} exited: ${child.output}`);
    return false;
  }, { timeout, interval: 20, what: () => `${what} to start (output so far: ${child.output})` });
}

// `jobrt dashboard` on a free port: { url, token, child }.
export async function startDashboard(redis, queues, { token, readOnly = false } = {}) {
  const args = ['dashboard', '--redis', redis, '--listen', '127.0.0.1:0'];
  for (const q of [].concat(queues)) args.push('-q', q);
  if (token) args.push('--token', token);
  if (readOnly) args.push('--read-only');
  const child = start(args);
  const lines = createInterface({ input: child.stdout });
  let url, madeUp;
  lines.on('line', (line) => {
    url ??= /listening on (http:\/\/\S+\/)/.exec(line)?.[1];
    madeUp ??= /actions need this token .*: (\S+)$/.exec(line)?.[1];
  });
  await waitForOutput(child, /listening on http/, 10000, 'the dashboard');
  await eventually(() => url !== undefined, { timeout: 2000, what: 'the dashboard\'s address' });
  if (!token && !readOnly)
    await eventually(() => madeUp !== undefined, { timeout: 2000, what: 'the dashboard\'s made-up token' });
  return { url, token: token || madeUp, child };
}

// `jobrt worker` with the noop and sleep handlers (and `plugins` more), once it runs.
export async function startWorker(redis, queue, { id, concurrency = 4, onFailure, plugins = [] } = {}) {
  const args = ['worker', '--redis', redis, '-q', queue, '--grace', '500', '--concurrency', String(concurrency),
    '--plugin', `${JOBRT_HANDLERS}/jobrt_noop.so`, '--plugin', `${JOBRT_HANDLERS}/jobrt_sleep.so`];
  for (const p of plugins) args.push('--plugin', `${JOBRT_HANDLERS}/${p}`);
  if (id) args.push('--id', id);
  if (onFailure) args.push('--on-failure', onFailure);
  const child = start(args);
  await waitForOutput(child, /running .* on queue/, 10000, 'the worker');
  return child;
}

// --- the CLI ---

// Runs `jobrt ARGS...`; its stdout. `input` goes to its stdin.
export function jobrt(args, input) {
  return new Promise((resolve, reject) => {
    const p = execFile(JOBRT_BIN, args, { env: childEnv, timeout: 15000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`jobrt ${args.join(' ')}: ${err.message}\n${stderr}`));
      else resolve(stdout);
    });
    p.stdin.on('error', () => {});  // (a command that reads no input may be gone: EPIPE; its exit says more)
    if (input === undefined) p.stdin.end();
    else p.stdin.end(input);
  });
}

// Enqueues jobs given as objects ({type, payload, group, id, max_attempts, ...}), in one call.
export function enqueue(redis, queue, jobs) {
  const lines = [].concat(jobs).map((j) => JSON.stringify(j) + '\n').join('');
  return jobrt(['enqueue', '--redis', redis, '-q', queue, '-f', '-', '--json'], lines);
}

// Enqueues `n` generated jobs of `type` over groups g0..g(groups-1).
export function enqueueMany(redis, queue, n, groups, type = 'nobody') {
  return jobrt(['enqueue', '--redis', redis, '-q', queue, '-n', String(n), '--groups', String(groups), '-t', type, '--json']);
}

export async function stats(redis, queue) {
  return JSON.parse(await jobrt(['stats', '--redis', redis, '-q', queue, '--json']));
}

const jsonLines = (text) => text.split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));

export async function deadLetters(redis, queue) {
  return jsonLines(await jobrt(['dlq', 'list', '--redis', redis, '-q', queue, '--json', '-n', '1000']));
}

export async function pausedGroups(redis, queue) {
  return jsonLines(await jobrt(['group', 'show', '--redis', redis, '-q', queue, '--json']));
}

// Waits until the queue holds `n` dead letters.
export function deadCount(redis, queue, n, timeout = 10000) {
  return eventually(async () => (await stats(redis, queue)).dead === n,
    { timeout, interval: 100, what: `${n} dead letters in ${queue}` });
}

// --- Redis ---

// The server of $JOBRT_TEST_REDIS_URL, or one started with scripts/redis.sh: { url, stop() }.
export function redisServer() {
  if (process.env.JOBRT_TEST_REDIS_URL) return { url: process.env.JOBRT_TEST_REDIS_URL, stop() {} };
  const r = spawnSync('bash', [REDIS_SCRIPT], { encoding: 'utf8', timeout: 30000 });
  if (r.status !== 0) throw new Error(`scripts/redis.sh: ${r.stderr}`);
  const [port, dir] = r.stdout.trim().split(/\s+/);
  const stopIt = () => spawnSync('bash', [REDIS_SCRIPT, 'stop', dir], { timeout: 10000 });
  process.on('exit', stopIt);
  return { url: `redis://127.0.0.1:${port}`, stop() { process.off('exit', stopIt); stopIt(); } };
}

// A command with redis-cli; its output.
export function redisCli(url, ...args) {
  const r = spawnSync('redis-cli', ['-u', url, ...args], { encoding: 'utf8', timeout: 10000 });
  if (r.status !== 0 || /^(ERR|WRONGTYPE)/m.test(r.stdout)) throw new Error(`redis-cli ${args.join(' ')}: ${r.stdout}${r.stderr}`);
  return r.stdout;
}

// A loopback port that nothing listens on (one the system just gave and took back).
export function closedPort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// The HTTP status of a GET of `address` sent with another Host header (what a browser sends for
// a name of its own that resolves to this address).
export function statusWithHost(address, host) {
  return new Promise((resolve, reject) => {
    const u = new URL(address);
    const req = httpGet({ host: u.hostname, port: u.port, path: u.pathname, headers: { Host: host }, timeout: 5000 },
      (res) => { res.resume(); resolve(res.statusCode); });
    req.on('timeout', () => req.destroy(new Error(`GET ${address}: no answer`)));
    req.on('error', reject);
  });
}

// A TCP relay to the Redis server of `redisUrl` that can be cut (open connections closed, new
// ones dropped) and mended: a store that goes away and comes back, the server untouched.
// { url (the relay's, as a Redis URL), cut(), mend(), close() }.
export async function relay(redisUrl) {
  const target = new URL(redisUrl);
  const sockets = new Set();
  let isCut = false;
  const server = createServer((client) => {
    if (isCut) return client.destroy();
    const upstream = connect(Number(target.port || 6379), target.hostname);
    for (const [a, b] of [[client, upstream], [upstream, client]]) {
      sockets.add(a);
      a.on('error', () => b.destroy());
      a.on('close', () => { sockets.delete(a); b.destroy(); });
      a.pipe(b);
    }
  });
  await new Promise((resolve, reject) => server.once('error', reject).listen(0, '127.0.0.1', resolve));
  const url = new URL(redisUrl);
  url.hostname = '127.0.0.1';
  url.port = String(server.address().port);
  return {
    url: url.toString(),
    cut() { isCut = true; for (const s of sockets) s.destroy(); },
    mend() { isCut = false; },
    close() { this.cut(); return new Promise((resolve) => server.close(resolve)); },
  };
}
