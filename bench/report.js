// Turns bench/run's raw output into results.csv, results.json, gnuplot plots (SVG) and, with
// --markdown FILE, the job-runtime section of FILE (between the bench/run markers).
//
//   node bench/report.js --raw RAW --out DIR --command CMD --seconds S [--markdown docs/BENCHMARKS.md]
//
// Every ratio is taken within one run (jobrt and the baseline measured on the same server in the
// same run), then summarised as the median and range over the runs.
'use strict';

const fs = require('fs');
const path = require('path');
const os = require('os');
const { execFileSync } = require('child_process');

const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
if (!args.raw || !args.out) {
  console.error('usage: node bench/report.js --raw RAW --out DIR --command CMD --seconds S [--markdown FILE]');
  process.exit(2);
}
const root = path.resolve(__dirname, '..');

// --- parse ------------------------------------------------------------------------------------
const records = [];
for (const line of fs.readFileSync(args.raw, 'utf8').split('\n')) {
  if (!line.trim()) continue;
  const r = { kinds: [] };
  for (const token of line.trim().split(/\s+/)) {
    const eq = token.indexOf('=');
    if (eq < 0) r.kinds.push(token);
    else r[token.slice(0, eq)] = token.slice(eq + 1);
  }
  r.kind = r.kinds[0];
  r.run = Number(r.run);
  // Records from before worker_options::follow existed ran the default.
  if (r.kind === 'throughput' && r.tool === 'jobrt' && r.follow === undefined) r.follow = 'after-commit';
  records.push(r);
}
const runs = [...new Set(records.map((r) => r.run))].sort((a, b) => a - b);
if (!runs.length) throw new Error(`no results in ${args.raw}`);

// --- scenarios --------------------------------------------------------------------------------
const num = (x) => (x === undefined ? undefined : Number(x));
const is = (r, fields) => Object.entries(fields).every(([k, v]) => String(r[k]) === String(v));
// A scenario: which records, and a label. One record per run.
const scenarios = [];
function scenario(id, label, fields) {
  scenarios.push({ id, label, fields });
}
scenario('jobrt_ungrouped', 'jobrt, ungrouped', { tool: 'jobrt', kind: 'throughput', groups: 0, concurrency: 100 });
// One group: by default a job starts once its predecessor's end is stored; pipelined, as soon as
// its predecessor succeeded (worker_options::follow). Records before the follow field were the default.
scenario('jobrt_g1', 'jobrt, 1 group', { tool: 'jobrt', kind: 'throughput', groups: 1, concurrency: 100, follow: 'after-commit' });
for (const burst of [4, 16])
  scenario(`jobrt_g1_pipelined${burst === 4 ? '' : burst}`, `jobrt, 1 group, follow: pipelined, burst ${burst}`, {
    tool: 'jobrt',
    kind: 'throughput',
    groups: 1,
    concurrency: 100,
    follow: 'pipelined',
    burst,
  });
scenario('jobrt_g1000', 'jobrt, 1,000 groups', { tool: 'jobrt', kind: 'throughput', groups: 1000, concurrency: 100 });
scenario('jobrt_g100000', 'jobrt, 100,000 groups', {
  tool: 'jobrt',
  kind: 'throughput',
  groups: 100000,
  concurrency: 100,
});
for (const c of [1, 10])
  for (const g of [0, 1000])
    scenario(`jobrt_${g ? 'g1000' : 'ungrouped'}_c${c}`, `jobrt, ${g ? '1,000 groups' : 'ungrouped'}, concurrency ${c}`, {
      tool: 'jobrt',
      kind: 'throughput',
      groups: g,
      concurrency: c,
    });
for (const g of [0, 1000, 100000])
  scenario(
    `jobrt2_${g ? `g${g}` : 'ungrouped'}`,
    `jobrt, ${g ? `${g.toLocaleString('en-US')} groups` : 'ungrouped'}, 2 worker processes`,
    { tool: 'jobrt2', kind: 'throughput2', groups: g },
  );
scenario('bullmq', 'BullMQ, ungrouped', { tool: 'peer', peer: 'bullmq', kind: 'throughput' });
scenario('bee', 'bee-queue, ungrouped', { tool: 'peer', peer: 'bee', kind: 'throughput' });
scenario('groupmq_g1000', 'GroupMQ, 1,000 groups', { tool: 'peer', peer: 'groupmq', kind: 'throughput', groups: 1000 });
scenario('groupmq_g1', 'GroupMQ, 1 group', { tool: 'peer', peer: 'groupmq', kind: 'throughput', groups: 1 });
scenario('roundtrip', 'a bare round trip: one client, one PING at a time', { tool: 'roundtrip', kind: 'roundtrip' });
scenario('handmade', 'hand-made design, its sleeps (2 s, 800 ms), 100 threads', {
  tool: 'handmade',
  kind: 'handmade',
  sleep_scale: 1,
});
const zeroDepths = [...new Set(records.filter((r) => r.kind === 'handmade' && r.sleep_scale === '0').map((r) => r.depth))];
for (const d of zeroDepths)
  scenario(`handmade0_${d}`, `hand-made design, no sleeps, 1 thread, ${Number(d).toLocaleString('en-US')} queued`, {
    tool: 'handmade',
    kind: 'handmade',
    sleep_scale: 0,
    depth: d,
  });
scenario('pickup_jobrt', 'jobrt, ungrouped', { tool: 'jobrt', kind: 'pickup', grouped: 'false' });
scenario('pickup_jobrt_grouped', 'jobrt, a new group each job', { tool: 'jobrt', kind: 'pickup', grouped: 'true' });
scenario('pickup_bee', 'bee-queue', { tool: 'peer', peer: 'bee', kind: 'pickup' });
scenario('pickup_bullmq', 'BullMQ', { tool: 'peer', peer: 'bullmq', kind: 'pickup' });
scenario('pickup_groupmq', 'GroupMQ, a new group each job', { tool: 'peer', peer: 'groupmq', kind: 'pickup' });
const depths = [...new Set(records.filter((r) => r.kind === 'handmade_depth').map((r) => Number(r.queued)))].sort(
  (a, b) => a - b,
);
for (const d of depths) {
  scenario(`depth_handmade_${d}`, `hand-made, ${d}`, { tool: 'handmade', kind: 'handmade_depth', queued: d });
  if (d !== 1000) scenario(`depth_jobrt_${d}`, `jobrt, ${d}`, { tool: 'jobrt', kind: 'depth', queued: d });
}

const byId = {};
for (const s of scenarios) {
  s.byRun = {};
  for (const r of records) if (is(r, s.fields)) s.byRun[r.run] = r;
  byId[s.id] = s;
}
const present = (id) => byId[id] && Object.keys(byId[id].byRun).length > 0;

// --- statistics -------------------------------------------------------------------------------
function median(values) {
  const v = values.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return undefined;
  return v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
}
function summary(values) {
  const v = values.filter((x) => Number.isFinite(x));
  if (!v.length) return undefined;
  return { median: median(v), min: Math.min(...v), max: Math.max(...v), values: v };
}
// One metric of one scenario over the runs.
const metric = (id, field) => summary(runs.map((run) => num(byId[id]?.byRun[run]?.[field])));
// A ratio taken within each run: f(run) for every run where it is defined.
const perRun = (f) => summary(runs.map((run) => f(run)));
const value = (id, field, run) => num(byId[id]?.byRun[run]?.[field]);
const ratio = (a, fa, b, fb) => perRun((run) => value(a, fa, run) / value(b, fb, run));

function fmtNum(x, digits) {
  if (x === undefined || !Number.isFinite(x)) return 'n/a';
  if (digits === undefined) digits = Math.abs(x) >= 100 ? 0 : Math.abs(x) >= 10 ? 1 : 2;
  return x.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
}
const cell = (s, digits, unit = '') =>
  s ? `${fmtNum(s.median, digits)}${unit} (${fmtNum(s.min, digits)}–${fmtNum(s.max, digits)})` : 'n/a';
const times = (s, digits) =>
  s ? `${fmtNum(s.median, digits)}× (${fmtNum(s.min, digits)}–${fmtNum(s.max, digits)})` : 'n/a';

// --- raw results: CSV and JSON ------------------------------------------------------------------
fs.mkdirSync(args.out, { recursive: true });
const fields = new Set();
for (const r of records) for (const k of Object.keys(r)) if (k !== 'kinds') fields.add(k);
const columns = ['run', 'tool', 'kind', ...[...fields].filter((k) => !['run', 'tool', 'kind'].includes(k)).sort()];
fs.writeFileSync(
  path.join(args.out, 'results.csv'),
  [columns.join(','), ...records.map((r) => columns.map((c) => (r[c] === undefined ? '' : r[c])).join(','))].join('\n') +
    '\n',
);
const summaries = {};
for (const s of scenarios) {
  if (!present(s.id)) continue;
  summaries[s.id] = { label: s.label, fields: s.fields, metrics: {} };
  const keys = new Set();
  for (const r of Object.values(s.byRun)) for (const k of Object.keys(r)) keys.add(k);
  for (const k of keys) {
    const m = metric(s.id, k);
    if (m && !['run', 'n', 'groups', 'group_concurrency', 'concurrency', 'depth', 'queued', 'threads'].includes(k)) summaries[s.id].metrics[k] = m;
  }
}

// --- goals ------------------------------------------------------------------------------------
const goals = [];
function goal(text, s, test, bound) {
  const met = s ? (test === '>=' ? s.median >= bound : s.median <= bound) : undefined;
  goals.push({ text, ratio: s, test, bound, met });
}
// A figure shown beside a goal for contrast: not judged.
function contrast(text, s) {
  goals.push({ text, ratio: s, contrast: true });
}
goal('1,000 groups, 1 process, concurrency 100: jobs/s ÷ GroupMQ over 1,000 groups', ratio('jobrt_g1000', 'jobs_per_sec', 'groupmq_g1000', 'jobs_per_sec'), '>=', 4);
goal('the same ÷ BullMQ', ratio('jobrt_g1000', 'jobs_per_sec', 'bullmq', 'jobs_per_sec'), '>=', 4);
goal('the same ÷ bee-queue', ratio('jobrt_g1000', 'jobs_per_sec', 'bee', 'jobs_per_sec'), '>=', 2);
goal(
  '1 group (one job at a time, in order), follow: pipelined, burst 16: jobs/s ÷ GroupMQ with 1 group',
  ratio('jobrt_g1_pipelined16', 'jobs_per_sec', 'groupmq_g1', 'jobs_per_sec'),
  '>=',
  4,
);
contrast('(the same with the default burst of 4)', ratio('jobrt_g1_pipelined', 'jobs_per_sec', 'groupmq_g1', 'jobs_per_sec'));
contrast(
  '(the same with the defaults, follow: after-commit and burst 4: a round trip per job)',
  ratio('jobrt_g1', 'jobs_per_sec', 'groupmq_g1', 'jobs_per_sec'),
);
goal('enqueue jobs/s, ungrouped ÷ bee-queue', ratio('jobrt_ungrouped', 'enqueue_per_sec', 'bee', 'enqueue_per_sec'), '>=', 2);
goal('enqueue jobs/s, 1,000 groups ÷ bee-queue', ratio('jobrt_g1000', 'enqueue_per_sec', 'bee', 'enqueue_per_sec'), '>=', 2);
goal('Redis memory per queued job, ungrouped ÷ bee-queue', ratio('jobrt_ungrouped', 'mem_bytes_per_job', 'bee', 'mem_bytes_per_job'), '<=', 0.6);
goal('Redis memory per queued job, 1,000 groups ÷ bee-queue', ratio('jobrt_g1000', 'mem_bytes_per_job', 'bee', 'mem_bytes_per_job'), '<=', 0.6);
goal('idle pickup p50, ungrouped ÷ bee-queue', ratio('pickup_jobrt', 'p50_us', 'pickup_bee', 'p50_us'), '<=', 0.6);
goal('idle pickup p50, grouped ÷ bee-queue', ratio('pickup_jobrt_grouped', 'p50_us', 'pickup_bee', 'p50_us'), '<=', 0.6);
goal('1,000 groups, concurrency 100: jobs/s ÷ the hand-made design at its sleeps (100 threads)', ratio('jobrt_g1000', 'jobs_per_sec', 'handmade', 'jobs_per_sec'), '>=', 1000);
const deepest = depths[depths.length - 1];
if (deepest && deepest !== 1000) {
  goal(
    `claim cost flat with depth: jobrt's claim at ${deepest.toLocaleString('en-US')} queued ÷ at 1,000 (taken as flat when ≤ 1.2)`,
    ratio(`depth_jobrt_${deepest}`, 'claim_usec_p50', `depth_jobrt_${deepest}`, 'shallow_claim_usec_p50'),
    '<=',
    1.2,
  );
  goal(
    `(for contrast) the hand-made design's claim at ${deepest.toLocaleString('en-US')} queued ÷ at 1,000: grows`,
    ratio(`depth_handmade_${deepest}`, 'claim_usec_p50', 'depth_handmade_1000', 'claim_usec_p50'),
    '>=',
    2,
  );
}

fs.writeFileSync(
  path.join(args.out, 'results.json'),
  JSON.stringify({ command: args.command, runs, scenarios: summaries, goals, records }, null, 1) + '\n',
);

// --- plots ------------------------------------------------------------------------------------
const gnuplotOk = (() => {
  try {
    execFileSync('gnuplot', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();
if (!gnuplotOk) throw new Error('gnuplot is missing (bench/run installs gnuplot-nox)');
const terminal = "set terminal svg size 900,520 dynamic font 'sans,11' background '#ffffff'";
const quote = (s) => `"${s.replace(/"/g, "'")}"`;
function plot(name, data, script) {
  const dat = path.join(args.out, `${name}.dat`);
  fs.writeFileSync(dat, data);
  // Names relative to the output directory, so `gnuplot NAME.gp` run there redraws a plot.
  const gp = `${terminal}\nset output ${quote(`${name}.svg`)}\n${script.replace(/DATA/g, quote(`${name}.dat`))}\n`;
  fs.writeFileSync(path.join(args.out, `${name}.gp`), gp);
  execFileSync('gnuplot', [`${name}.gp`], { cwd: args.out, stdio: ['ignore', 'ignore', 'inherit'] });
}
const throughputIds = scenarios
  .filter((s) => ['throughput', 'throughput2', 'handmade'].includes(s.fields.kind) && present(s.id))
  .map((s) => s.id);
plot(
  'throughput',
  throughputIds
    .map((id) => {
      const m = metric(id, 'jobs_per_sec');
      return `${quote(byId[id].label.replace(/,/g, ''))} ${m.median} ${m.min} ${m.max}`;
    })
    .join('\n') + '\n',
  [
    "set title 'Jobs/s, queued no-op jobs (median; bars: range)'",
    'set logscale x',
    "set xlabel 'jobs/s'",
    'set ytics nomirror',
    `set yrange [${throughputIds.length - 0.3}:-0.7]`,
    'set grid xtics',
    'set key off',
    'set lmargin 52',
    "set style fill solid 0.6",
    'plot DATA using 2:0:(0):2:($0-0.35):($0+0.35):yticlabels(1) with boxxyerror lc rgb \'#4477aa\', ' +
      "DATA using 2:0:3:4 with xerrorbars pt 0 lc rgb '#222222'",
  ].join('\n'),
);
const pickupIds = scenarios.filter((s) => s.fields.kind === 'pickup' && present(s.id)).map((s) => s.id);
const pcts = [10, 25, 50, 75, 90, 95, 99];
plot(
  'pickup',
  pcts.map((p) => [p, ...pickupIds.map((id) => metric(id, `p${p}_us`)?.median ?? 'NaN')].join(' ')).join('\n') + '\n',
  [
    "set title 'Idle pickup latency, enqueue to handler start, by percentile (median of the runs)'",
    "set xlabel 'percentile'",
    "set ylabel 'µs'",
    'set logscale y',
    'set grid',
    'set key top left',
    'set xtics (10, 25, 50, 75, 90, 95, 99)',
    'plot ' + pickupIds.map((id, i) => `DATA using 1:${i + 2} with linespoints lw 2 title ${quote(byId[id].label)}`).join(', '),
  ].join('\n'),
);
plot(
  'claim_depth',
  depths
    .map((d) => {
      const j = d === 1000 ? metric(`depth_jobrt_${deepest}`, 'shallow_claim_usec_p50') : metric(`depth_jobrt_${d}`, 'claim_usec_p50');
      const h = metric(`depth_handmade_${d}`, 'claim_usec_p50');
      return `${d} ${j?.median ?? 'NaN'} ${h?.median ?? 'NaN'}`;
    })
    .join('\n') + '\n',
  [
    "set title 'Redis server time of one claim against queue depth (median of the runs; log-log)'",
    "set xlabel 'jobs queued'",
    "set ylabel 'µs of server time per claim'",
    'set logscale xy',
    'set grid',
    'set key top left',
    "plot DATA using 1:2 with linespoints lw 2 title 'jobrt: one claim script call of 10 jobs', " +
      "DATA using 1:3 with linespoints lw 2 title 'hand-made design: one claim of one job (SETNX … LREM)'",
  ].join('\n'),
);

console.error(`bench/report.js: ${records.length} results, ${runs.length} run(s); CSV, JSON and plots in ${args.out}`);
if (!args.markdown) process.exit(0);

// --- markdown ---------------------------------------------------------------------------------
const sh = (cmd, argv) => {
  try {
    return execFileSync(cmd, argv, { encoding: 'utf8' }).trim();
  } catch {
    return 'unknown';
  }
};
const lock = JSON.parse(fs.readFileSync(path.join(root, 'bench/peers/package-lock.json'), 'utf8'));
const version = (p) => lock.packages[`node_modules/${p}`]?.version ?? 'unknown';
const cpu = os.cpus()[0]?.model ?? 'unknown';
const rel = (f) => path.relative(path.join(root, 'docs'), path.join(args.out, f));
const first = (id) => Object.values(byId[id]?.byRun ?? {})[0];
const nOf = (id) => (first(id) ? Number(first(id).n || first(id).depth).toLocaleString('en-US') : 'n/a');

const L = [];
L.push('<!-- bench/run begin: everything down to "bench/run end" is written by bench/report.js -->');
L.push('## The job runtime against the hand-made design and its peers');
L.push('');
L.push(
  `Written by \`${args.command}\` (${Math.round(Number(args.seconds) / 60)} minutes) on ${fs.statSync(args.raw).mtime.toISOString().slice(0, 16).replace('T', ' ')} UTC. ` +
    `${runs.length} runs; every figure is the median of the runs with the range in brackets, and every ratio is taken ` +
    'within one run (both sides measured on the same server in the same run) before the median is taken.',
);
L.push('');
L.push(
  `Machine: ${os.cpus().length} × ${cpu}, ${(os.totalmem() / 2 ** 30).toFixed(1)} GiB, Linux ${os.release()}; ` +
    `${sh('redis-server', ['--version']).replace(/^Redis server /, 'redis-server ').split(' sha=')[0]}, ` +
    `${sh('c++', ['--version']).split('\n')[0]}, Node ${process.version}. ` +
    'One throw-away redis-server on loopback without persistence, pinned to core 0; every client (jobrt, the peers, ' +
    'the hand-made design) pinned to core 1. The machine is a VM shared with other work: single figures move by ±20%.',
);
L.push('');
L.push(
  `Peers (npm, pinned in \`bench/peers/package-lock.json\`): BullMQ ${version('bullmq')}, bee-queue ${version('bee-queue')}, ` +
    `GroupMQ ${version('groupmq')} (ioredis ${version('ioredis')}), driven by \`bench/peers/peer.js\` in one Node process ` +
    'each (producer and worker), no-op handlers, completed jobs removed. BullMQ and bee-queue run ungrouped (BullMQ\'s ' +
    'groups are commercial, bee-queue has none); GroupMQ, like jobrt, runs per-group FIFO. jobrt: `bench/jobs_bench.cpp`, ' +
    'one worker process with its producer (two worker processes: `fill`, then two `work` processes). The hand-made ' +
    'design: `bench/handmade_bench.cpp` (a shared list, `SETNX`+`EXPIRE` queue and group locks, `LINDEX` scan from the ' +
    'right, per-thread key, `LREM`; 2 s between rounds and 800 ms between lock retries).',
);
L.push('');
L.push(
  'Server-side costs come from the server\'s own counters, read before and after each phase: `INFO commandstats` ' +
    '(commands inside scripts count; INFO and CONFIG do not), `INFO cpu` (user + system), `INFO memory` (used_memory ' +
    'after the enqueue, per queued job). Worker CPU is the client process\'s own user + system time while it processed ' +
    '(getrusage; `process.cpuUsage()` for Node), per job.',
);
L.push('');
L.push(`Raw results: [results.csv](${rel('results.csv')}), [results.json](${rel('results.json')}), [raw.txt](${rel('raw.txt')}).`);
L.push('');

L.push(
  'Run it again: `bench/run` (RUNS=3 by default; it installs Node, npm, gnuplot and the pinned npm packages when ' +
    'missing, builds the benchmarks with `--parallel ${JOBS:-1}`, and rewrites this section). `bench/run --smoke` (or ' +
    '`scripts/bench-smoke.sh`, for CI) runs every scenario with small counts in well under 2 minutes and writes only ' +
    '`bench/results/smoke/`.',
);
L.push('');
L.push('### Against the goals');
L.push('');
L.push('| goal | measured (median of per-run ratios, range) | bound | |');
L.push('|---|---|---|---|');
for (const g of goals) {
  if (g.contrast) {
    L.push(`| ${g.text} | ${times(g.ratio, 2)} | | for contrast |`);
    continue;
  }
  L.push(`| ${g.text} | ${times(g.ratio, 2)} | ${g.test === '>=' ? '≥' : '≤'} ${g.bound} | ${g.met === undefined ? 'not measured' : g.met ? 'met' : '**not met**'} |`);
}
L.push('');

const unmet = goals.filter((g) => g.met === false);
if (unmet.length) {
  L.push(
    `Not met: ${unmet.map((g) => `${g.text.replace(/^the same/, 'jobrt over 1,000 groups')}, ${fmtNum(g.ratio.median, 2)}×`).join('; ')}.`,
  );
  if (present('jobrt_g1000') && present('jobrt2_g1000'))
    L.push(
      `In these runs one jobrt worker process kept neither its own core nor the server's busy (see "Where the time goes" ` +
        `below), which points at waiting on round trips (not measured directly); two worker processes over the same 1,000 groups did ` +
        `${fmtNum(metric('jobrt2_g1000', 'jobs_per_sec').median, 0)} jobs/s against ${fmtNum(metric('jobrt_g1000', 'jobs_per_sec').median, 0)} for one. ` +
        'One group runs strictly one job at a time, so there each job pays its claim and finish round trips in turn.',
    );
  L.push('');
}
if (present('jobrt_g1') && present('groupmq_g1') && present('roundtrip')) {
  const rtt = metric('roundtrip', 'rps');
  L.push(
    `One group, by default (\`follow: after-commit\`): a job starts only once its predecessor's end is stored, so no job ` +
      `runs again after its follower started, whatever crashes, and the group needs a round trip per job. In these runs one ` +
      `client sending nothing but PING, one at a time (\`redis-benchmark -c 1\`), did ${fmtNum(rtt.median, 0)} round trips/s ` +
      `(${fmtNum(rtt.min, 0)}–${fmtNum(rtt.max, 0)}): jobrt's one group ran at ` +
      `${times(ratio('jobrt_g1', 'jobs_per_sec', 'roundtrip', 'rps'), 2)} of that rate, and 4× GroupMQ's one group would be ` +
      `${times(perRun((run) => (4 * value('groupmq_g1', 'jobs_per_sec', run)) / value('roundtrip', 'rps', run)), 2)} of it.` +
      (present('jobrt_g1_pipelined')
        ? ` With \`follow: pipelined\` a burst's next job starts as soon as its predecessor succeeded and the ends are ` +
          `stored on the way (a lost lease replays the group from its first unstored end, docs/RELIABILITY.md): ` +
          `${times(ratio('jobrt_g1_pipelined', 'jobs_per_sec', 'roundtrip', 'rps'), 2)} of the round-trip rate with the ` +
          'default burst of 4, where a burst costs two round trips (its first keep\'s, then the rest of its ends with ' +
          'the request for the next burst), and ' +
          `${times(ratio('jobrt_g1_pipelined16', 'jobs_per_sec', 'roundtrip', 'rps'), 2)} with a burst of 16.`
        : ''),
  );
  L.push('');
}
L.push('### Throughput and costs per job');
L.push('');
L.push(`Jobs are enqueued first (batches of 1,000), then processed. Concurrency 100 unless the row says otherwise.`);
L.push('');
L.push('| scenario | jobs | jobs/s | enqueue jobs/s | Redis commands / job | Redis CPU / job (µs) | Redis memory / queued job (B) | worker CPU / job (µs) |');
L.push('|---|---|---|---|---|---|---|---|');
for (const id of throughputIds) {
  const s = byId[id];
  const jobsCol = s.fields.kind === 'handmade' ? `${nOf(id)} queued, ${fmtNum(metric(id, 'seconds')?.median, 0)} s` : nOf(id);
  L.push(
    `| ${s.label} | ${jobsCol} | ${cell(metric(id, 'jobs_per_sec'), s.fields.kind === 'handmade' ? 1 : 0)} | ${cell(metric(id, 'enqueue_per_sec'), 0)} | ` +
      `${cell(metric(id, 'cmds_per_job'))} | ${cell(metric(id, 'redis_cpu_us_per_job'))} | ${cell(metric(id, 'mem_bytes_per_job'), 0)} | ` +
      `${cell(metric(id, 'worker_cpu_us_per_job'))} |`,
  );
}
L.push('');
if (present('handmade')) {
  const h = metric('handmade', 'jobs_per_sec');
  const threads = Number(first('handmade').threads);
  L.push(
    `The hand-made design at its own sleeps did ${fmtNum(h.median, 1)} jobs/s with ${threads} threads, ` +
      `${fmtNum(h.median / threads, 3)} per thread, below the 0.5 per thread that its 2 s round pause ` +
      'alone would allow: the threads take the queue lock one at a time, and a thread that finds it taken sleeps ' +
      '800 ms before it tries again. Without sleeps, one thread shows what the claim itself costs as the list grows: ' +
      'the `LREM` walks the list.',
  );
  L.push('');
}
L.push(`![throughput by scenario](${rel('throughput.svg')})`);
L.push('');
L.push(
  'Where the time goes while jobs are processed: the share of a core that the server and the client process used ' +
    '(CPU per job × jobs/s, medians). A side near 1.0 is the limit; when neither is, the run is bound by round trips.',
);
L.push('');
L.push('| scenario | redis-server, share of its core | client process, share of its core |');
L.push('|---|---|---|');
for (const id of ['jobrt_ungrouped', 'jobrt_g1', 'jobrt_g1_pipelined', 'jobrt_g1_pipelined16', 'jobrt_g1000', 'jobrt_g100000', 'bullmq', 'bee', 'groupmq_g1000', 'groupmq_g1']) {
  if (!present(id)) continue;
  const share = (f) => perRun((run) => (value(id, f, run) * value(id, 'jobs_per_sec', run)) / 1e6);
  L.push(`| ${byId[id].label} | ${cell(share('process_cpu_us_per_job'), 2)} | ${cell(share('worker_cpu_us_per_job'), 2)} |`);
}
L.push('');

L.push('### jobrt ÷ each peer (per-run ratios: median and range)');
L.push('');
const peerCols = [
  ['BullMQ (jobrt ungrouped)', 'jobrt_ungrouped', 'bullmq', 'pickup_jobrt', 'pickup_bullmq'],
  ['bee-queue (jobrt ungrouped)', 'jobrt_ungrouped', 'bee', 'pickup_jobrt', 'pickup_bee'],
  ['GroupMQ, 1,000 groups', 'jobrt_g1000', 'groupmq_g1000', 'pickup_jobrt_grouped', 'pickup_groupmq'],
  ['GroupMQ, 1 group', 'jobrt_g1', 'groupmq_g1', null, null],
  ['GroupMQ, 1 group (jobrt pipelined, burst 16)', 'jobrt_g1_pipelined16', 'groupmq_g1', null, null],
];
L.push(`| measure | ${peerCols.map((c) => c[0]).join(' | ')} |`);
L.push(`|---|${peerCols.map(() => '---').join('|')}|`);
const rows = [
  ['jobs/s (higher is better)', 'jobs_per_sec'],
  ['enqueue jobs/s (higher is better)', 'enqueue_per_sec'],
  ['Redis commands / job (lower is better)', 'cmds_per_job'],
  ['Redis CPU / job (lower is better)', 'redis_cpu_us_per_job'],
  ['Redis memory / queued job (lower is better)', 'mem_bytes_per_job'],
  ['worker CPU / job (lower is better)', 'worker_cpu_us_per_job'],
];
for (const [label, f] of rows) L.push(`| ${label} | ${peerCols.map((c) => times(ratio(c[1], f, c[2], f), 2)).join(' | ')} |`);
for (const p of ['p50', 'p99'])
  L.push(
    `| idle pickup ${p} (lower is better) | ${peerCols.map((c) => (c[3] ? times(ratio(c[3], `${p}_us`, c[4], `${p}_us`), 2) : '')).join(' | ')} |`,
  );
L.push('');

L.push('### Idle pickup latency');
L.push('');
L.push(
  `An idle worker (concurrency 100); ${nOf('pickup_jobrt')} jobs enqueued one at a time, each after the previous one started; ` +
    'the time from the enqueue call to the handler\'s start, in the same process. Between a job\'s start and the next ' +
    'enqueue every driver waits 1 ms (the shortest Node timer), so the worker is idle in its blocking wait again.',
);
L.push('');
L.push('| queue | p50 (µs) | p90 (µs) | p99 (µs) |');
L.push('|---|---|---|---|');
for (const id of pickupIds)
  L.push(`| ${byId[id].label} | ${cell(metric(id, 'p50_us'), 0)} | ${cell(metric(id, 'p90_us'), 0)} | ${cell(metric(id, 'p99_us'), 0)} |`);
if (present('pickup_jobrt'))
  L.push(`| (bare \`LPUSH\` → \`BLMOVE\` wake-up, jobrt's client, taking turns with jobrt's pickup after the same 1 ms) | ${cell(metric('pickup_jobrt', 'bare_p50_us'), 0)} | | ${cell(metric('pickup_jobrt', 'bare_p99_us'), 0)} |`);
L.push('');
L.push(`![pickup latency by percentile](${rel('pickup.svg')})`);
L.push('');

L.push('### Claim cost against queue depth');
L.push('');
L.push(
  'jobrt: one queue 1,000 deep and one as deep as the row says; 100 claims of 10 jobs alternate between them, each ' +
    'call\'s server time read on its own (`CONFIG RESETSTAT`, claim, `INFO commandstats`). The hand-made design: one ' +
    'thread without sleeps claims one job at a time from a list that deep (1,000 groups, all free), the server time ' +
    'of all of the claim\'s commands summed the same way; the `LREM` walks the list from its head to the job at its tail.',
);
L.push('');
L.push('| jobs queued | jobrt claim of 10 (µs) | jobrt ÷ its 1,000-deep queue, same run | hand-made claim of 1 (µs) | hand-made ÷ at 1,000, same run |');
L.push('|---|---|---|---|---|');
for (const d of depths) {
  const j = d === 1000 ? metric(`depth_jobrt_${deepest}`, 'shallow_claim_usec_p50') : metric(`depth_jobrt_${d}`, 'claim_usec_p50');
  const jr = d === 1000 ? undefined : ratio(`depth_jobrt_${d}`, 'claim_usec_p50', `depth_jobrt_${d}`, 'shallow_claim_usec_p50');
  const hr = ratio(`depth_handmade_${d}`, 'claim_usec_p50', 'depth_handmade_1000', 'claim_usec_p50');
  L.push(
    `| ${d.toLocaleString('en-US')} | ${cell(j, 0)} | ${d === 1000 ? '1' : times(jr, 2)} | ${cell(metric(`depth_handmade_${d}`, 'claim_usec_p50'), 0)} | ${times(hr, 1)} |`,
  );
}
L.push('');
L.push(`![claim cost against depth](${rel('claim_depth.svg')})`);
L.push('');
L.push('<!-- bench/run end -->');

const md = fs.readFileSync(args.markdown, 'utf8');
const begin = md.indexOf('<!-- bench/run begin');
const end = md.indexOf('<!-- bench/run end -->');
if (begin < 0 || end < 0) throw new Error(`${args.markdown} has no bench/run markers`);
fs.writeFileSync(args.markdown, md.slice(0, begin) + L.join('\n') + md.slice(end + '<!-- bench/run end -->'.length));
console.error(`bench/report.js: wrote the job-runtime section of ${args.markdown}`);
