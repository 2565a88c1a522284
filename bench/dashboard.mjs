// Times the dashboard's pages in headless Chromium: each page loaded afresh `rounds` times, from
// the navigation until its content is on the screen; prints p50 and p95 per page as JSON lines.
// Usage: node bench/dashboard.mjs BASE_URL QUEUE ROUNDS LABEL
import { createRequire } from 'node:module';

const require = createRequire(new URL('../tests/dashboard/', import.meta.url));
const { chromium } = require('playwright-core');
const [base, queue, rounds = '20', label = ''] = process.argv.slice(2);

// Each page, and what says it is drawn.
const pages = [
  ['overview', '#/', `section[data-queue="${queue}"] [data-figure="groups"]`],
  ['overview chart', '#/', '#chart svg, #chart p'],
  ['groups', '#/groups', '#groups tbody tr'],
  ['groups by prefix', '#/groups?prefix=g12', '#groups tbody tr'],
  ['group', '#/group?g=g12', '#group-depth'],
  ['job by id', `#/job?id=${process.env.DEAD_ID || '1'}`, '#job-state, #job p.muted'],
  ['kept job by id', '#/job?id=kept-probe', '#job-state, #job p.muted'],
  ['dead letters', '#/dead', '#dead tbody tr'],
  ['dead letters filtered', '#/dead?type=sleep&text=FAILED', '#dead tbody tr'],
  ['dead letters, no match', '#/dead?text=no-such-error', 'main[data-loaded]'],
  ['groups, rare prefix', '#/groups?prefix=g99999', 'main[data-loaded]'],
  ['workers', '#/workers', '#workers thead'],
];

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
try {
  const context = await browser.newContext();
  await context.addInitScript((q) => sessionStorage.setItem('jobrt-queue', q), queue);
  const page = await context.newPage();
  for (const [name, hash, ready] of pages) {
    const took = [];
    for (let i = 0; i < Number(rounds); i++) {
      await page.goto('about:blank');
      const start = performance.now();
      await page.goto(base + hash);
      await page.waitForSelector(ready, { timeout: 10000 });
      took.push(performance.now() - start);
    }
    took.sort((a, b) => a - b);
    const at = (p) => took[Math.min(took.length - 1, Math.ceil(p * took.length) - 1)];
    console.log(JSON.stringify({ label, page: name, rounds: took.length, p50_ms: +at(0.5).toFixed(1), p95_ms: +at(0.95).toFixed(1) }));
  }
} finally {
  await browser.close();
}
