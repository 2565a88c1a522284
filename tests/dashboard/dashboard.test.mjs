// The dashboard's pages in headless Chromium, against a real redis-server, real `jobrt worker`
// processes and `jobrt dashboard`. One browser for the file, a new context (and page) per test;
// each test has queues of its own (dash-<pid>-<n>) and its own dashboard.
//
//   JOBRT_TEST_REDIS_URL=redis://127.0.0.1:PORT npm test    (without it, scripts/redis.sh starts one)
//   JOBRT_BIN, JOBRT_HANDLERS, CHROMIUM: the binaries (defaults under /work/main/build/dev, /usr/bin)
import { describe, test, before, after, beforeEach, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { chromium } from 'playwright-core';
import * as h from './helpers.mjs';

const T = { timeout: 30000 };
const FAILED_AS_ASKED = 'sleep: failed as asked (payload.fail)';
const NEGATIVE_MS = 'sleep: payload.ms is negative';
const TOKEN_ERROR = "this action needs the dashboard's token, in the X-Jobrt-Token header";

let redis, browser, context, page, dialogs;
let queues = 0, testQueues = [];
const url = () => redis.url;
const newQueue = () => {
  const q = `dash-${process.pid}-${++queues}`;
  testQueues.push(q);
  return q;
};

// --- page helpers ---

const open = (dash, route) => page.goto(dash.url + '#' + route);
const figure = (queue, id) => page.locator(`section[data-queue="${queue}"] [data-figure="${id}"] .n`);
const button = (name) => page.getByRole('button', { name, exact: true });
const rows = (table) => page.locator(`table#${table} tbody tr:not(.detail)`);

// Loads a listing to its end: "More" until it goes (a page reads a bounded part of the
// keyspace, so on a big shared server a page may bring few rows or none), then expects `n`
// rows. (Each click disables "More" until its part came.)
async function allRows(table, n) {
  const more = page.locator('#more');
  await page.locator('main[data-loaded]').waitFor();
  for (let clicks = 0; clicks < 500 && (await more.isVisible()); clicks++) {
    await page.locator('#more:not([disabled])').waitFor();
    if (!(await more.isVisible())) break;
    await more.click();
    await page.locator('#more:not([disabled])').or(page.locator('#more[hidden]')).first().waitFor({ state: 'attached' });
  }
  await h.hasCount(rows(table), n);
}
const cell = (row, i) => row.locator(':scope > td').nth(i);
const deadRow = (id) => page.locator(`table#dead tr[data-id="${id}"]`);
const attrs = (locator, name) => locator.evaluateAll((es, n) => es.map((e) => e.getAttribute(n)), name);

// Reloads the page until `check` passes (for what a page shows as it loads, not live).
async function reloadUntil(what, check, timeout = 15000) {
  await h.eventually(async () => {
    await page.reload();
    await check();
    return true;
  }, { timeout, interval: 200, what });
}

// The page's requests for a page of the groups list (the list always names a prefix).

// Jobs that fail at once: { id, group, payload extra } each, max_attempts 1.
const failing = (specs) => specs.map(({ id, group, ...payload }) =>
  ({ type: 'sleep', id, group, max_attempts: 1, payload: { ms: 1, fail: true, ...payload } }));

// A queue with dead letters: the jobs enqueued, and a worker run until all of them are dead
// (then stopped: nothing runs them again once requeued).
async function withDeadLetters(queue, jobs, { plugins } = {}) {
  await h.enqueue(url(), queue, jobs);
  const worker = await h.startWorker(url(), queue, { plugins });
  await h.deadCount(url(), queue, jobs.length, 20000);
  await h.stop(worker);
}

before(async () => {
  redis = h.redisServer();
  browser = await chromium.launch({ executablePath: h.CHROMIUM, args: h.CHROMIUM_ARGS });
}, { timeout: 60000 });

after(async () => {
  await browser?.close();
  await h.stopAll();
  redis?.stop();
}, { timeout: 30000 });

beforeEach(async () => {
  context = await browser.newContext();
  page = await context.newPage();
  page.setDefaultTimeout(10000);
  dialogs = [];
  page.on('dialog', (d) => { dialogs.push(d.message()); d.dismiss().catch(() => {}); });
}, { timeout: 15000 });

afterEach(async () => {
  await context?.close().catch(() => {});
  await h.stopAll();
  // The test's queues go (a queue never enqueued to is unknown to purge: nothing to do).
  for (const q of testQueues.splice(0))
    await h.jobrt(['queue', 'purge', '--redis', url(), '-q', q, '--force']).catch(() => {});
}, { timeout: 30000 });

describe('overview', () => {
  // 1. The figures of a queue: 30 jobs of a type nobody runs over 10 groups are 10 pending lanes
  //    and 10 groups with jobs, nothing running, dead or paused.
  test('shows pending lanes and groups after enqueueing', T, async () => {
    const q = newQueue();
    await h.enqueueMany(url(), q, 30, 10);
    const dash = await h.startDashboard(url(), q, { token: 't' });
    await open(dash, '/');
    await h.hasText(figure(q, 'ready'), '10');
    await h.hasText(figure(q, 'groups'), '10');
    for (const id of ['running', 'delayed', 'dead', 'paused', 'workers', 'completed', 'failed'])
      await h.hasText(figure(q, id), '0');
    await h.hasText(figure(q, 'latency'), /^\d+\.\d s$/);
    assert.equal(await page.locator('section[data-queue]').count(), 1);
  });

  // 2. The figures are live (server-sent events): jobs enqueued while the page is open show
  //    without a reload (a mark set in the page survives).
  test('updates live when jobs are enqueued', T, async () => {
    const q = newQueue();
    await h.enqueueMany(url(), q, 30, 10);
    const dash = await h.startDashboard(url(), q, { token: 't' });
    await open(dash, '/');
    await h.hasText(figure(q, 'groups'), '10');
    await page.evaluate(() => { window.__sameDocument = true; });
    await h.enqueue(url(), q, [1, 2, 3, 4, 5].map((i) => ({ type: 'nobody', group: `late-${i}` })));
    await h.hasText(figure(q, 'groups'), '15');
    await h.hasText(figure(q, 'ready'), '15');
    assert.equal(await page.evaluate(() => window.__sameDocument), true, 'the page was reloaded');
  });

  // 3. The chart: none without history; drawn from three stored points (two rates), with the
  //    polylines where the rates put them (jobs/s 1 then 2, failures/min 2 then 1; top 2).
  test('draws the chart from history points, and says when there are none', T, async () => {
    const q = newQueue();
    const dash = await h.startDashboard(url(), q, { token: 't' });
    await open(dash, '/');
    await h.hasText(page.locator('#chart p'), /^No history yet/);
    assert.equal(await page.locator('#chart svg').count(), 0);

    const minute = Math.floor(Date.now() / 60000) * 60000;
    const points = [[minute - 180000, 0, 0], [minute - 120000, 60, 2], [minute - 60000, 180, 3]];
    const args = points.flatMap(([m, completed, failed]) => [String(m), `${m}|${JSON.stringify({ completed, failed })}`]);
    h.redisCli(url(), 'ZADD', `jobrt:{${q}}:history`, ...args);
    await page.reload();
    await h.hasText(page.locator('#chart-points'), '2 minutes');
    assert.equal(await page.locator('#chart svg.chart polyline.jobs').getAttribute('points'), '30,100 690,30');
    assert.equal(await page.locator('#chart svg.chart polyline.fails').getAttribute('points'), '30,30 690,100');
    assert.equal(await page.locator('#chart').getByText('No history yet').count(), 0);
  });

  // 25. Two queues (-q twice): a section each with its own figures; the queue picker switches
  //     the other pages to the second queue.
  test('lists two queues, and the picker switches between them', T, async () => {
    const qa = newQueue(), qb = newQueue();
    await h.enqueueMany(url(), qa, 6, 3);
    await h.enqueueMany(url(), qb, 8, 4);
    const dash = await h.startDashboard(url(), [qa, qb], { token: 't' });
    await open(dash, '/');
    await h.hasText(figure(qa, 'groups'), '3');
    await h.hasText(figure(qb, 'groups'), '4');
    assert.deepEqual(await attrs(page.locator('#queue option'), 'value'), [qa, qb]);
    await h.hasText(page.locator('main h2').last(), `Last hour: ${qa}`);
    await page.selectOption('#queue', qb);
    await h.hasText(page.locator('main h2').last(), `Last hour: ${qb}`);
    await page.locator('nav a[data-page="groups"]').click();
    await h.hasText(page.locator('main h2'), `Groups of ${qb}`);
    await allRows('groups', 4);
  });
});

describe('groups', () => {
  // 4. The groups list: every group once, with its depth, next job and state.
  test('lists the groups with depth, next job and state', T, async () => {
    const q = newQueue();
    await h.enqueueMany(url(), q, 30, 10);
    const dash = await h.startDashboard(url(), q, { token: 't' });
    await open(dash, '/groups');
    await allRows('groups', 10);
    const names = await attrs(rows('groups'), 'data-group');
    assert.deepEqual(names.sort(), Array.from({ length: 10 }, (_, i) => `g${i}`).sort());
    for (const row of await rows('groups').all()) {
      assert.equal(await cell(row, 1).textContent(), '3');
      assert.match(await cell(row, 2).textContent(), /^nobody \d+$/);
      assert.equal(await cell(row, 3).textContent(), 'pending');
    }
  });

  // 5. Search by prefix: only the groups the prefix starts; a prefix that is also a key shows
  //    that group first.
  test('search by prefix shows only the matching groups', T, async () => {
    const q = newQueue();
    const groups = ['alpha-1', 'alpha-2', 'alpha-3', 'beta-1', 'beta-10', 'gamma'];
    await h.enqueue(url(), q, groups.map((group) => ({ type: 'nobody', group })));
    const dash = await h.startDashboard(url(), q, { token: 't' });
    await open(dash, '/groups');
    await allRows('groups', 6);

    await page.locator('input[name="prefix"]').fill('alpha-');
    await button('Search').click();
    await page.waitForURL(/#\/groups\?prefix=alpha-$/);
    await allRows('groups', 3);
    assert.deepEqual((await attrs(rows('groups'), 'data-group')).sort(), ['alpha-1', 'alpha-2', 'alpha-3']);

    await page.locator('input[name="prefix"]').fill('beta-1');
    await button('Search').click();
    await allRows('groups', 2);
    assert.deepEqual(await attrs(rows('groups'), 'data-group'), ['beta-1', 'beta-10']);
  });

  // 6. Paging: the first page leaves some of 300 groups for "More", which brings the next part
  //    until there is none, and the parts together list every group.
  test('pages through many groups with More', T, async () => {
    const q = newQueue();
    const total = 300;
    await h.enqueueMany(url(), q, total, total);
    const dash = await h.startDashboard(url(), q, { token: 't' });
    await open(dash, '/groups');
    await page.locator('main[data-loaded]').waitFor();
    assert.ok((await rows('groups').count()) < total, 'the first page leaves some');
    assert.equal(await page.locator('#more').isVisible(), true);
    await allRows('groups', total);
    await page.locator('#more').waitFor({ state: 'hidden' });
    const names = new Set(await attrs(rows('groups'), 'data-group'));
    assert.equal(names.size, total, 'each group listed once');
    for (let i = 0; i < total; i++) assert.ok(names.has(`g${i}`), `g${i} listed`);
  });

  // 29. Names that mean something in a URL ('.', '..', '/', '?', '&', '#', '%', spaces,
  //     non-ASCII): each group's link in the list leads to that group's page, and its next job
  //     is found by id and group. ('.' and '..' in an API path would be resolved away by the
  //     browser: the page must not put them there.)
  test('odd group names and ids reach their pages', T, async () => {
    const q = newQueue();
    const names = ['.', '..', 'a/b', 'q?x=1&y=2#h', '100% sure', 'ünï ✓'];
    await h.enqueue(url(), q, names.map((name, i) => ({ type: 'nobody', group: name, id: name, payload: { i } })));
    const dash = await h.startDashboard(url(), q, { token: 't' });
    for (const [i, name] of names.entries()) {
      await open(dash, '/groups');
      await allRows('groups', names.length);
      await page.locator('table#groups').getByRole('link', { name, exact: true }).click();
      await h.hasText(page.locator('#group-name'), name);
      await h.hasText(page.locator('#group-depth'), '1');
      assert.deepEqual(JSON.parse(await page.locator('#head').textContent()).payload, { i }, `head of ${name}`);
      await open(dash, '/job?' + new URLSearchParams({ id: name, group: name }));
      await h.hasText(page.locator('#job-state'), 'pending');
    }
  });

  // 7. A group's page: its depth, and its next job (id, type, payload) as JSON; the job page
  //    finds that job by id and group as pending.
  test('group detail shows depth and the head job', T, async () => {
    const q = newQueue();
    await h.enqueue(url(), q, [1, 2, 3].map((step) => ({ type: 'nobody', group: 'detail', id: `d-${step}`, payload: { step } })));
    const dash = await h.startDashboard(url(), q, { token: 't' });
    await open(dash, '/group?g=detail');
    await h.hasText(page.locator('#group-name'), 'detail');
    await h.hasText(page.locator('#group-state'), 'pending');
    await h.hasText(page.locator('#group-depth'), '3');
    const head = JSON.parse(await page.locator('#head').textContent());
    assert.equal(head.id, 'd-1');
    assert.equal(head.type, 'nobody');
    assert.deepEqual(head.payload, { step: 1 });
    assert.equal(head.attempts, 0);

    await open(dash, '/job?id=d-1&group=detail');
    await h.hasText(page.locator('#job-state'), 'pending');
  });
});

describe('group actions', () => {
  // 8. Pause with the token the dashboard made up and printed: the page shows paused, the CLI
  //    lists the group as paused (not halted), and the overview counts it.
  test('pause with the token', T, async () => {
    const q = newQueue();
    await h.enqueue(url(), q, [{ type: 'nobody', group: 'p' }, { type: 'nobody', group: 'p' }]);
    const dash = await h.startDashboard(url(), q);  // no --token: one is made up
    assert.match(dash.token, /^\S{16,}$/);
    await open(dash, '/group?g=p');
    await h.hasText(page.locator('#group-state'), 'pending');
    await page.locator('#token').fill(dash.token);
    await button('Pause').click();
    await h.hasText(page.locator('#group-state'), 'paused');
    const paused = await h.pausedGroups(url(), q);
    assert.deepEqual(paused.map((g) => [g.group, g.halted]), [['p', false]]);
    await open(dash, '/');
    await h.hasText(figure(q, 'paused'), '1');
  });

  // 9. Resume a group paused with the CLI: the page shows it pending again, the CLI agrees.
  test('resume a paused group', T, async () => {
    const q = newQueue();
    await h.enqueue(url(), q, [{ type: 'nobody', group: 'r' }]);
    await h.jobrt(['group', 'pause', '--redis', url(), '-q', q, 'r']);
    const dash = await h.startDashboard(url(), q, { token: 'resume-token' });
    await open(dash, '/group?g=r');
    await h.hasText(page.locator('#group-state'), 'paused');
    await page.locator('#token').fill('resume-token');
    await button('Resume').click();
    await h.hasText(page.locator('#group-state'), 'pending');
    assert.deepEqual(await h.pausedGroups(url(), q), []);
  });

  // 10. A job that fails with --on-failure halt halts its group: the page shows halted and the
  //     job's error; "Resume, skipping the halted job" empties the group and dead-letters it.
  test('a halted group: its error, and resume skipping moves the job to the dead letters', T, async () => {
    const q = newQueue();
    await h.startWorker(url(), q, { onFailure: 'halt' });
    await h.enqueue(url(), q, failing([{ id: 'halter', group: 'h' }]));
    await h.eventually(async () => (await h.pausedGroups(url(), q)).some((g) => g.group === 'h' && g.halted),
      { what: 'group h to halt' });
    const dash = await h.startDashboard(url(), q, { token: 'skip-token' });
    await open(dash, '/group?g=h');
    await h.hasText(page.locator('#group-state'), 'halted');
    await h.hasText(page.locator('#halt-error'), FAILED_AS_ASKED);
    await h.hasText(page.locator('#group-depth'), '1');

    await page.locator('#token').fill('skip-token');
    await button('Resume, skipping the halted job').click();
    await h.hasText(page.locator('#group-state'), 'empty');
    await h.hasText(page.locator('#group-depth'), '0');
    const dead = await h.deadLetters(url(), q);
    assert.deepEqual(dead.map((d) => [d.id, d.group]), [['halter', 'h']]);
    assert.match(dead[0].error, /^skipped by an operator.*failed as asked/);
    assert.deepEqual(await h.pausedGroups(url(), q), []);
  });

  // 11. An action without the token, or with a wrong one, is refused: #error says the token is
  //     needed and the group stays as it was.
  test('an action without the token shows the token error', T, async () => {
    const q = newQueue();
    await h.enqueue(url(), q, [{ type: 'nobody', group: 'tk' }]);
    const dash = await h.startDashboard(url(), q, { token: 'the-right-one' });
    await open(dash, '/group?g=tk');
    await h.hasText(page.locator('#group-state'), 'pending');
    assert.equal(await page.locator('#error').isVisible(), false);
    for (const token of ['', 'a-wrong-one']) {
      await page.locator('#token').fill(token);
      const refused = page.waitForResponse((r) => r.request().method() === 'POST');
      await button('Pause').click();
      assert.equal((await refused).status(), 401);
      await h.hasText(page.locator('#error'), TOKEN_ERROR);
      assert.equal(await page.locator('#error').isVisible(), true);
    }
    await h.hasText(page.locator('#group-state'), 'pending');
    assert.deepEqual(await h.pausedGroups(url(), q), []);
  });

  // 12. --read-only: the header says so, has no token box, every action button is disabled,
  //     and the server refuses an action even from a button enabled by hand.
  test('read-only mode disables the actions', T, async () => {
    const q = newQueue();
    await h.enqueue(url(), q, [{ type: 'nobody', group: 'ro' }]);
    const dash = await h.startDashboard(url(), q, { readOnly: true });
    await open(dash, '/group?g=ro');
    await h.hasText(page.locator('#group-state'), 'pending');
    await h.hasText(page.locator('#mode'), 'read-only');
    assert.equal(await page.locator('#token-box').isVisible(), false);
    for (const name of ['Pause', 'Resume', 'Resume, skipping the halted job']) {
      assert.equal(await button(name).isDisabled(), true, `${name} disabled`);
      assert.equal(await button(name).getAttribute('title'), 'the dashboard is read-only');
    }
    await open(dash, '/dead');
    await page.locator('table#dead').waitFor();
    for (const name of ['Requeue selected', 'Requeue all shown', 'Purge selected', 'Purge all shown'])
      assert.equal(await button(name).isDisabled(), true, `${name} disabled`);

    await open(dash, '/group?g=ro');
    await h.hasText(page.locator('#group-state'), 'pending');
    await page.evaluate(() => { for (const b of document.querySelectorAll('button:disabled')) b.disabled = false; });
    const refused = page.waitForResponse((r) => r.request().method() === 'POST');
    await button('Pause').click();
    assert.equal((await refused).status(), 403);
    await h.hasText(page.locator('#error'), /read-only/);
    assert.deepEqual(await h.pausedGroups(url(), q), []);
  });

  // 27. The token typed in the header is kept for the tab: after a reload it is still there
  //     and an action works with it.
  test('the token is kept across a reload', T, async () => {
    const q = newQueue();
    await h.enqueue(url(), q, [{ type: 'nobody', group: 'kept' }]);
    const dash = await h.startDashboard(url(), q, { token: 'kept-token' });
    await open(dash, '/group?g=kept');
    await h.hasText(page.locator('#group-state'), 'pending');
    await page.locator('#token').fill('kept-token');
    await page.locator('#token').press('Tab');  // (the change event stores it)
    await page.reload();
    await h.hasText(page.locator('#group-state'), 'pending');
    assert.equal(await page.locator('#token').inputValue(), 'kept-token');
    await button('Pause').click();
    await h.hasText(page.locator('#group-state'), 'paused');
  });
});

describe('a job by id', () => {
  // 13. A dead-lettered job by id: state dead and the error it died of.
  test('a dead letter by id shows dead and its error', T, async () => {
    const q = newQueue();
    await withDeadLetters(q, failing([{ id: 'dead-1', group: 'dg' }]));
    const dash = await h.startDashboard(url(), q, { token: 't' });
    await open(dash, '/job?id=dead-1');
    await h.hasText(page.locator('#job-state'), 'dead');
    await h.hasText(page.locator('#job-error'), FAILED_AS_ASKED);
    await h.hasText(page.locator('dt:text-is("runs") + dd'), '1');
  });

  // 14. A running job (sleep 20 s) by id: state running and the worker running it (once the
  //     worker has reported it: every second; the page is reloaded until then).
  test('a running job by id shows running and its worker', T, async () => {
    const q = newQueue();
    const workerId = `w-${q}`;
    await h.startWorker(url(), q, { id: workerId });
    await h.enqueue(url(), q, [{ type: 'sleep', group: 'rg', id: 'long-1', payload: { ms: 20000 } }]);
    const dash = await h.startDashboard(url(), q, { token: 't' });
    await open(dash, '/job?id=long-1&group=rg');
    await reloadUntil('job long-1 to show as running',
      () => h.hasText(page.locator('#job-state'), 'running', 1500));
    await h.hasText(page.locator('dt:text-is("running on") + dd'), new RegExp(`^${workerId} since `));
  });

  // 31. Kept jobs (enqueued with a keep) by id: one waiting behind others in its group, one
  //     delayed, and one done once a worker ran it.
  test('a kept job by id shows pending, delayed and done', T, async () => {
    const q = newQueue();
    const hour = 3600000;
    await h.enqueue(url(), q, [
      ...[1, 2, 3].map((i) => ({ type: 'nobody', group: 'kg', id: `k-${i}`, keep_ms: hour, payload: { i } })),
      { type: 'nobody', id: 'k-late', delay_ms: hour, keep_ms: hour },
      { type: 'sleep', id: 'k-quick', keep_ms: hour, payload: { ms: 1 } }]);
    const dash = await h.startDashboard(url(), q, { token: 't' });
    await open(dash, '/job?id=k-3');
    await h.hasText(page.locator('#job-state'), 'pending');
    await h.hasText(page.locator('#job-type'), 'nobody');
    assert.deepEqual(JSON.parse(await page.locator('#job-record').textContent()).payload, { i: 3 });
    await open(dash, '/job?id=k-late');
    await h.hasText(page.locator('#job-state'), 'delayed');
    assert.ok((await page.locator('#job-at').textContent()).length > 0);
    await h.startWorker(url(), q, {});
    await open(dash, '/job?id=k-quick');
    await reloadUntil('job k-quick to show as done',
      () => h.hasText(page.locator('#job-state'), 'done', 1500));
    await h.hasText(page.locator('dt:text-is("completed") + dd'), /\d/);
  });

  // 32. A kept job cancelled from its page (with the token): its state shows cancelled, the
  //     Cancel button is gone, and the CLI says so too.
  test('a kept job is cancelled from its page', T, async () => {
    const q = newQueue();
    const hour = 3600000;
    await h.enqueue(url(), q, [{ type: 'nobody', group: 'cg', id: 'c-1', keep_ms: hour },
      { type: 'nobody', group: 'cg', id: 'c-2', keep_ms: hour }]);
    const dash = await h.startDashboard(url(), q, { token: 'cancel-token' });
    await open(dash, '/job?id=c-2');
    await h.hasText(page.locator('#job-state'), 'pending');
    await page.locator('#token').fill('cancel-token');
    await button('Cancel').click();
    await h.hasText(page.locator('#job-state'), 'cancelled');
    assert.equal(await button('Cancel').count(), 0);
    assert.match(await h.jobrt(['job', '--redis', url(), '-q', q, 'c-2']), /^state cancelled$/m);
  });

  // 15. An id that is nowhere: the not-found message, on the page and in #error.
  test('an unknown id shows the not-found message', T, async () => {
    const q = newQueue();
    const dash = await h.startDashboard(url(), q, { token: 't' });
    await open(dash, '/job?id=no-such-job');
    const notFound = /^job 'no-such-job' is not dead-lettered nor running, and not kept/;
    await h.hasText(page.locator('#job p'), notFound);
    await h.hasText(page.locator('#error'), notFound);
    assert.equal(await page.locator('#job-state').count(), 0);
  });
});

describe('dead letters', () => {
  // 16. The list: a row per letter with its group, type, error and runs.
  test('lists the dead letters with their errors', T, async () => {
    const q = newQueue();
    await withDeadLetters(q, [...failing([{ id: 'x1', group: 'a' }, { id: 'x2', group: 'b' }]),
      { type: 'sleep', id: 'x3', group: 'c', max_attempts: 1, payload: { ms: -1 } }]);
    const dash = await h.startDashboard(url(), q, { token: 't' });
    await open(dash, '/dead');
    await h.hasCount(rows('dead'), 3);
    const expected = { x1: ['a', FAILED_AS_ASKED], x2: ['b', FAILED_AS_ASKED], x3: ['c', NEGATIVE_MS] };
    for (const [id, [group, error]] of Object.entries(expected)) {
      const row = deadRow(id);
      assert.equal(await cell(row, 1).textContent(), id);
      assert.equal(await cell(row, 2).textContent(), group);
      assert.equal(await cell(row, 3).textContent(), 'sleep');
      assert.equal(await cell(row, 4).textContent(), error);
      assert.equal(await cell(row, 6).textContent(), '1');
    }
  });

  // 17. Filter by type: only the stock_arrival letter (a permanent failure of that handler).
  test('filter by type', T, async () => {
    const q = newQueue();
    await withDeadLetters(q, [...failing([{ id: 's1', group: 'a' }, { id: 's2', group: 'b' }]),
      { type: 'stock_arrival', id: 'st1', group: 'wheat', payload: {} }], { plugins: ['jobrt_stock_arrival.so'] });
    const dash = await h.startDashboard(url(), q, { token: 't' });
    await open(dash, '/dead');
    await h.hasCount(rows('dead'), 3);
    await page.locator('input[name="type"]').fill('stock_arrival');
    await button('Filter').click();
    await page.waitForURL(/type=stock_arrival/);
    await h.hasCount(rows('dead'), 1);
    assert.equal(await cell(deadRow('st1'), 3).textContent(), 'stock_arrival');
    assert.match(await cell(deadRow('st1'), 4).textContent(), /^stock_arrival: payload needs/);
  });

  // 18. Filter by error text (case ignored): "NEGATIVE" finds the one letter, "failed as asked"
  //     the two others.
  test('filter by error text', T, async () => {
    const q = newQueue();
    await withDeadLetters(q, [...failing([{ id: 'f1', group: 'a' }, { id: 'f2' }]),
      { type: 'sleep', id: 'n1', group: 'c', max_attempts: 1, payload: { ms: -1 } }]);
    const dash = await h.startDashboard(url(), q, { token: 't' });
    await open(dash, '/dead');
    await h.hasCount(rows('dead'), 3);
    await page.locator('input[name="text"]').fill('NEGATIVE');
    await button('Filter').click();
    await h.hasCount(rows('dead'), 1);
    assert.equal(await deadRow('n1').count(), 1);
    await page.locator('input[name="text"]').fill('failed as asked');
    await button('Filter').click();
    await h.hasCount(rows('dead'), 2);
    assert.deepEqual((await attrs(rows('dead'), 'data-id')).sort(), ['f1', 'f2']);
  });

  // 19. A letter's id shows its whole record as JSON below its row, and hides it again.
  test('shows a letter as JSON', T, async () => {
    const q = newQueue();
    await withDeadLetters(q, failing([{ id: 'j1', group: 'jg', note: 'look at me' }]));
    const dash = await h.startDashboard(url(), q, { token: 't' });
    await open(dash, '/dead');
    await h.hasCount(rows('dead'), 1);
    const detail = page.locator('table#dead tr.detail');
    assert.equal(await detail.isVisible(), false);
    await deadRow('j1').getByRole('link', { name: 'j1' }).click();
    await detail.waitFor({ state: 'visible' });
    const letter = JSON.parse(await detail.locator('pre').textContent());
    assert.equal(letter.id, 'j1');
    assert.equal(letter.group, 'jg');
    assert.equal(letter.type, 'sleep');
    assert.deepEqual(letter.payload, { ms: 1, fail: true, note: 'look at me' });
    assert.equal(letter.runs, 1);
    assert.equal(letter.error, FAILED_AS_ASKED);
    await deadRow('j1').getByRole('link', { name: 'j1' }).click();
    await detail.waitFor({ state: 'hidden' });
  });

  // 20. Requeue the selected letter: it leaves the list and the dead count, and its job is
  //     pending again (no worker runs: it would fail it again).
  test('requeue selected', T, async () => {
    const q = newQueue();
    await withDeadLetters(q, failing([{ id: 'r1', group: 'a' }, { id: 'r2', group: 'b' }, { id: 'r3', group: 'c' }]));
    const dash = await h.startDashboard(url(), q, { token: 'requeue-token' });
    await open(dash, '/dead');
    await h.hasCount(rows('dead'), 3);
    await page.locator('#token').fill('requeue-token');
    await page.getByLabel('select r2').check();
    await button('Requeue selected').click();
    await h.hasCount(rows('dead'), 2);
    assert.deepEqual((await attrs(rows('dead'), 'data-id')).sort(), ['r1', 'r3']);
    const s = await h.stats(url(), q);
    assert.equal(s.dead, 2);
    assert.equal(s.groups, 1);
    assert.deepEqual((await h.deadLetters(url(), q)).map((d) => d.id).sort(), ['r1', 'r3']);
  });

  // 21. Purge all shown, with a filter: the letters shown go, the one filtered out stays.
  test('purge all shown', T, async () => {
    const q = newQueue();
    await withDeadLetters(q, [...failing([{ id: 'p1', group: 'a' }, { id: 'p2', group: 'b' }]),
      { type: 'sleep', id: 'keep', group: 'c', max_attempts: 1, payload: { ms: -1 } }]);
    const dash = await h.startDashboard(url(), q, { token: 'purge-token' });
    await open(dash, '/dead?text=failed+as+asked');
    await h.hasCount(rows('dead'), 2);
    await page.locator('#token').fill('purge-token');
    await button('Purge all shown').click();
    await h.hasCount(rows('dead'), 0);
    assert.equal((await h.stats(url(), q)).dead, 1);
    assert.deepEqual((await h.deadLetters(url(), q)).map((d) => d.id), ['keep']);
  });

  // 26. 50 letters a page: 60 letters are 50 rows and "More", then 60 rows and no "More".
  test('pages through the dead letters with More', T, async () => {
    const q = newQueue();
    await withDeadLetters(q, failing(Array.from({ length: 60 }, (_, i) => ({ id: `m${i}` }))));
    const dash = await h.startDashboard(url(), q, { token: 't' });
    await open(dash, '/dead');
    await h.hasCount(rows('dead'), 50);
    await page.locator('#more').click();
    await h.hasCount(rows('dead'), 60);
    await page.locator('#more').waitFor({ state: 'hidden' });
    assert.equal(new Set(await attrs(rows('dead'), 'data-id')).size, 60);
  });
});

describe('pages', () => {
  // 22. Markup in a group name and a payload is shown as text on the groups, group, dead
  //     letters and job pages: no element made of it, no dialog, no script run, no CSP
  //     violation (which an injected inline handler would cause).
  test('escapes markup from the queue', T, async () => {
    const q = newQueue();
    const EVIL = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">';
    await page.addInitScript(() => {
      window.__violations = 0;
      document.addEventListener('securitypolicyviolation', () => { window.__violations++; });
    });
    const nothingRan = async (where) => {
      assert.equal(await page.evaluate(() => typeof window.__pwned), 'undefined', `${where}: a script ran`);
      assert.equal(await page.evaluate(() => window.__violations), 0, `${where}: CSP violation`);
      assert.equal(await page.locator('main img, main script, #error img').count(), 0, `${where}: markup made`);
      assert.deepEqual(dialogs, [], `${where}: a dialog opened`);
    };
    await h.enqueue(url(), q, failing([{ id: 'evil-1', group: EVIL, html: EVIL }]));
    const dash = await h.startDashboard(url(), q, { token: 't' });

    await open(dash, '/groups');
    await allRows('groups', 1);
    assert.deepEqual(await attrs(rows('groups'), 'data-group'), [EVIL]);
    assert.equal(await cell(rows('groups').first(), 0).textContent(), EVIL);
    await nothingRan('groups');

    await open(dash, '/group?g=' + encodeURIComponent(EVIL));
    await h.hasText(page.locator('#group-name'), EVIL);
    assert.equal(JSON.parse(await page.locator('#head').textContent()).payload.html, EVIL);
    await nothingRan('group');

    await h.startWorker(url(), q);
    await h.deadCount(url(), q, 1);
    await open(dash, '/dead');
    await h.hasCount(rows('dead'), 1);
    assert.equal(await cell(deadRow('evil-1'), 2).textContent(), EVIL);
    await deadRow('evil-1').getByRole('link', { name: 'evil-1' }).click();
    const letter = JSON.parse(await page.locator('table#dead tr.detail pre').textContent());
    assert.equal(letter.group, EVIL);
    assert.equal(letter.payload.html, EVIL);
    await nothingRan('dead letters');

    await open(dash, '/job?id=evil-1');
    await h.hasText(page.locator('#job-state'), 'dead');
    assert.ok((await page.locator('#job').textContent()).includes(EVIL));
    await nothingRan('job');
  });

  // 23. The workers page: a running worker's row with its pid and concurrency.
  test('lists a running worker with its pid and concurrency', T, async () => {
    const q = newQueue();
    const workerId = `w-${q}`;
    const worker = await h.startWorker(url(), q, { id: workerId, concurrency: 3 });
    const dash = await h.startDashboard(url(), q, { token: 't' });
    const row = page.locator(`table#workers tr[data-worker="${workerId}"]`);
    await open(dash, '/workers');
    await reloadUntil('the worker to be listed', () => h.hasCount(row, 1, 1500));
    assert.equal(await cell(row, 0).textContent(), workerId);
    assert.notEqual(await cell(row, 1).textContent(), '');
    assert.equal(await cell(row, 2).textContent(), String(worker.pid));
    assert.equal(await cell(row, 3).textContent(), '3');
    assert.equal(await cell(row, 4).textContent(), '0');
    assert.match(await cell(row, 5).textContent(), /^\d+\.\d s ago$/);
    await open(dash, '/');
    await h.hasText(figure(q, 'workers'), '1');
  });

  // 28. On loopback the dashboard answers only to loopback names (DNS rebinding): the pages
  //     work as http://localhost:PORT/, and a request naming another host is refused (421).
  test('answers only to loopback host names', T, async () => {
    const q = newQueue();
    await h.enqueueMany(url(), q, 4, 2);
    const dash = await h.startDashboard(url(), q, { token: 't' });
    await page.goto(dash.url.replace('//127.0.0.1:', '//localhost:') + '#/');
    await h.hasText(figure(q, 'groups'), '2');
    const port = new URL(dash.url).port;
    assert.equal(await h.statusWithHost(dash.url, `127.0.0.1:${port}`), 200);
    assert.equal(await h.statusWithHost(dash.url, `rebound.example:${port}`), 421);
    assert.equal(await h.statusWithHost(dash.url + 'app.js', 'rebound.example'), 421);
  });

  // 30. Redis goes away while the page is open, and comes back (a relay the test cuts and
  //     mends): #error names the store meanwhile, the live figures return afterwards, and then
  //     the error goes.
  test('recovers when Redis comes back', T, async (t) => {
    const q = newQueue();
    await h.enqueueMany(url(), q, 6, 3);
    const relay = await h.relay(url());
    t.after(() => relay.close());
    const dash = await h.startDashboard(relay.url, q, { token: 't' });
    await open(dash, '/');
    await h.hasText(figure(q, 'groups'), '3');
    relay.cut();
    await h.hasText(page.locator('#error'), /store/, 12000);
    await h.hasCount(figure(q, 'groups'), 0);  // (the queue's section shows the error instead)
    relay.mend();
    await h.hasText(figure(q, 'groups'), '3', 15000);
    await h.hasText(page.locator('#error'), '', 5000);
    assert.equal(await page.locator('#error').isVisible(), false);
  });

  // 24. A store that does not answer (--redis names a closed port): #error names the store's
  //     failure within ~10 s, and the pages still respond to navigation.
  test('shows an error when Redis is down, and still navigates', T, async () => {
    const q = newQueue();
    const port = await h.closedPort();
    const dash = await h.startDashboard(`redis://127.0.0.1:${port}`, q, { token: 't' });
    await open(dash, '/');
    await h.hasText(page.locator('#error'), /store/, 12000);
    assert.equal(await page.locator('#error').isVisible(), true);
    assert.match(await page.locator('#error').textContent(), /Connection refused/);
    await page.locator('nav a[data-page="workers"]').click();
    await page.waitForURL(/#\/workers$/);
    await h.hasText(page.locator('main h2'), `Workers of ${q}`, 3000);
    await page.locator('nav a[data-page="dead"]').click();
    await h.hasText(page.locator('main h2'), `Dead letters of ${q}`, 3000);
    await h.hasText(page.locator('#error'), /store/, 12000);
  });
});

describe('schedules', () => {
  // A cron schedule and an interval one, added with the CLI: the page shows each one's timing,
  // job, group and next firing; Remove (with the token) takes one away, and the CLI agrees.
  test('lists the schedules, and removes one with the token', T, async () => {
    const q = newQueue();
    await h.jobrt(['schedule', 'add', 'nightly', '--redis', url(), '-q', q, '--cron', '0 3 * * *', '--tz',
      'Europe/Paris', '-t', 'report', '-g', 'tenant:7']);
    await h.jobrt(['schedule', 'add', 'tick', '--redis', url(), '-q', q, '--every', '1h', '-t', 'sleep']);
    const dash = await h.startDashboard(url(), q, { token: 'schedule-token' });
    await open(dash, '/schedules');
    await allRows('schedules', 2);
    const nightly = page.locator('table#schedules tr[data-schedule="nightly"]');
    const tick = page.locator('table#schedules tr[data-schedule="tick"]');
    await h.hasText(cell(nightly, 1), "cron '0 3 * * *' in Europe/Paris");
    await h.hasText(cell(nightly, 2), 'report');
    await h.hasText(cell(nightly, 3), 'tenant:7');
    await h.hasText(cell(tick, 1), 'every 1h');
    await h.hasText(cell(tick, 3), '-');
    assert.match(await cell(tick, 5).innerText(), /in [\d.]+ (s|min)|due/);  // (at the next whole hour)
    await page.locator('#token').fill('schedule-token');
    await tick.getByRole('button', { name: 'Remove' }).click();
    await h.hasCount(rows('schedules'), 1);
    const listed = JSON.parse(await h.jobrt(['schedule', 'list', '--redis', url(), '-q', q, '--json']));
    assert.deepEqual(listed.map((s) => s.name), ['nightly']);
    await h.jobrt(['schedule', 'remove', '--redis', url(), '-q', q, 'nightly']);
  });
});
