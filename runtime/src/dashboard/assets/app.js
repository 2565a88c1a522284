// The jobrt dashboard: a page per view, drawn from the JSON API under api/ (docs/DASHBOARD.md).
// Whatever comes from the queue (payloads, errors, group names) is put in the page as text,
// never as markup.
'use strict';

const state = { queues: [], queue: '', actions: false, readOnly: false, events: null, overview: null, liveError: false };
const main = document.getElementById('main');

// An element with attributes (on* are listeners) and children (strings become text).
function el(tag, attrs, ...children) {
  const e = tag === 'svg' || tag === 'polyline' || tag === 'text' || tag === 'line'
    ? document.createElementNS('http://www.w3.org/2000/svg', tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function showError(text) {
  const box = document.getElementById('error');
  box.textContent = text || '';
  box.hidden = !text;
}

// A call to the API: its JSON, or an Error with the API's words (also shown on the page).
async function api(path, options) {
  let res;
  try {
    res = await fetch('api/' + path, options);
  } catch (e) {
    showError('The dashboard does not answer: ' + e.message);
    throw e;
  }
  const body = await res.json().catch(() => ({ error: 'answer is not JSON (HTTP ' + res.status + ')' }));
  if (!res.ok) {
    const err = new Error(body.error || ('HTTP ' + res.status));
    err.status = res.status;
    showError(err.message);
    throw err;
  }
  showError('');
  return body;
}

function act(path, body) {
  return api(path, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-Jobrt-Token': document.getElementById('token').value },
    body: JSON.stringify(body || {}),
  });
}

const enc = encodeURIComponent;
const q = () => 'queues/' + enc(state.queue) + '/';
const when = (ms) => (ms > 0 ? new Date(ms).toLocaleString() : '');
function ago(ms) {
  if (!(ms > 0)) return '';
  const s = Math.max(0, (Date.now() - ms) / 1000);
  return s < 120 ? s.toFixed(1) + ' s ago' : s < 7200 ? (s / 60).toFixed(1) + ' min ago' : (s / 3600).toFixed(1) + ' h ago';
}
const json = (v) => JSON.stringify(v, null, 2);
function params() {
  const h = location.hash.slice(1);
  const i = h.indexOf('?');
  return new URLSearchParams(i < 0 ? '' : h.slice(i + 1));
}
function go(page, p) {
  const s = new URLSearchParams(p || {}).toString();
  location.hash = '#/' + page + (s ? '?' + s : '');
}
function actionButton(label, cls, onclick) {
  return el('button', { class: cls, disabled: !state.actions, title: state.actions ? null : actionsOffWhy(), onclick }, label);
}
function actionsOffWhy() {
  return state.readOnly ? 'the dashboard is read-only' : 'actions are off: the dashboard has no token';
}

// --- overview ---

function card(label, n, id) {
  return el('div', { class: 'card', 'data-figure': id }, el('div', { class: 'n' }, n), el('div', { class: 'l' }, label));
}

function drawOverview(o) {
  const box = document.getElementById('figures');
  if (!box) return;
  box.replaceChildren();
  for (const qu of o.queues) {
    if (qu.error) {
      box.append(el('section', {}, el('h2', {}, qu.name), el('div', { class: 'state dead' }, qu.error)));
      continue;
    }
    const c = qu.counts;
    box.append(el('section', { 'data-queue': qu.name }, el('h2', {}, qu.name), el('div', { class: 'cards' },
      card('pending lanes', c.ready_lanes, 'ready'), card('running', c.running, 'running'),
      card('delayed', c.delayed, 'delayed'), card('dead letters', c.dead, 'dead'),
      card('paused or halted groups', c.paused, 'paused'), card('groups with jobs', c.groups, 'groups'),
      card('live workers', qu.workers + (qu.workers_more ? '+' : ''), 'workers'),
      card('completed', c.completed, 'completed'), card('failed', c.failed, 'failed'),
      card('latency', (qu.latency_ms / 1000).toFixed(1) + ' s', 'latency'))));
  }
}

async function overviewPage() {
  main.replaceChildren(el('div', { id: 'figures' }), el('h2', {}, 'Last hour: ' + state.queue),
    el('div', { id: 'chart' }, 'loading…'));
  if (state.overview) drawOverview(state.overview);
  let h;
  try {
    h = await api(q() + 'history?minutes=60');
  } catch (e) {
    const box = document.getElementById('chart');
    if (box) box.replaceChildren(el('p', { class: 'muted' }, 'The history could not be read: ' + e.message));
    return;
  }
  drawChart(h.points);
}

// Jobs per second and failures per minute between consecutive points.
function drawChart(points) {
  const box = document.getElementById('chart');
  if (!box) return;
  const rates = [];
  for (let i = 1; i < points.length; i++) {
    const a = points[i - 1], b = points[i];
    const s = (b.minute - a.minute) / 1000;
    rates.push({ t: b.minute, jobs: (b.counts.completed - a.counts.completed) / s,
      fails: (b.counts.failed - a.counts.failed) / (s / 60) });
  }
  if (rates.length === 0) {
    box.replaceChildren(el('p', { class: 'muted' }, 'No history yet: workers store a point a minute.'));
    return;
  }
  const W = 720, H = 200, P = 30;
  const t0 = rates[0].t, t1 = Math.max(rates[rates.length - 1].t, t0 + 60000);
  const top = Math.max(1, ...rates.map((r) => Math.max(r.jobs, r.fails)));
  const x = (t) => P + ((t - t0) / (t1 - t0)) * (W - 2 * P);
  const y = (v) => H - P - (Math.max(0, v) / top) * (H - 2 * P);
  const line = (key, cls) => el('polyline', { class: cls, points: rates.map((r) => x(r.t) + ',' + y(r[key])).join(' ') });
  box.replaceChildren(el('svg', { class: 'chart', width: W, height: H, viewBox: '0 0 ' + W + ' ' + H },
    line('jobs', 'jobs'), line('fails', 'fails'),
    el('text', { x: P, y: 14 }, 'jobs/s (blue), failures/min (red); top ' + top.toFixed(1)),
    el('text', { x: P, y: H - 8 }, new Date(t0).toLocaleTimeString()),
    el('text', { x: W - P - 60, y: H - 8 }, new Date(t1).toLocaleTimeString())),
  el('p', { class: 'muted', id: 'chart-points' }, rates.length + ' minutes'));
}

// --- groups ---

function groupState(g) {
  if (g.paused) return g.paused.halted ? 'halted' : 'paused';
  if (g.running || g.runs > 0) return 'running';
  if (g.waiting_until > 0) return 'delayed';
  return g.depth > 0 ? 'pending' : 'empty';
}

async function groupsPage() {
  const p = params();
  const prefix = p.get('prefix') || '';
  const input = el('input', { type: 'text', name: 'prefix', value: prefix, placeholder: 'group key or prefix' });
  const rows = el('tbody');
  const more = el('button', { id: 'more', hidden: true }, 'More');
  main.replaceChildren(el('h2', {}, 'Groups of ' + state.queue),
    el('form', { class: 'bar', onsubmit: (e) => { e.preventDefault(); go('groups', { prefix: input.value }); } },
      input, el('button', { type: 'submit' }, 'Search'),
      el('span', { class: 'muted' }, 'A key shows the group itself; a prefix lists the groups it starts.')),
    el('table', { id: 'groups' }, el('thead', {}, el('tr', {}, ['group', 'jobs', 'next job', 'state'].map((h) => el('th', {}, h)))), rows),
    more);
  if (prefix) {  // the group of that key, when there is one, first
    const g = await api(q() + 'group?name=' + enc(prefix));
    if (g.depth > 0 || g.paused) rows.append(groupRow(g));
  }
  let cursor = '';
  const shown = new Set([prefix]);  // (a listing may give a group twice)
  const load = () => fill(50, async () => {
    const page = await api(q() + 'groups?limit=50&prefix=' + enc(prefix) + '&cursor=' + enc(cursor));
    let added = 0;
    for (const g of page.groups) if (!shown.has(g.group)) { shown.add(g.group); rows.append(groupRow(g)); added++; }
    cursor = page.cursor;
    more.hidden = !cursor;
    return { added, more: !!cursor };
  });
  more.onclick = () => moreOf(more, load);
  await load();
}

// "More": off while the next part loads (one load at a time; tests wait for it to come back).
async function moreOf(button, load) {
  button.disabled = true;
  try {
    await load();
  } catch (e) {
    // (shown by api())
  }
  button.disabled = false;
}

// A page of a listing: the server reads a bounded part of the queue a call, so a call may bring
// fewer than a page (a rare prefix, a filter few letters pass); ask again until a page's worth
// came, the listing ended, or 60 ms went by ("More" goes on). `step` makes one call:
// {added, more}.
async function fill(want, step) {
  const start = performance.now();
  let got = 0;
  for (;;) {
    const r = await step();
    got += r.added;
    if (!r.more || got >= want || performance.now() - start > 60) break;
  }
}

function groupRow(g) {
  const head = g.head ? (g.head.type || '?') + ' ' + g.head.id : '';
  return el('tr', { 'data-group': g.group },
    el('td', {}, el('a', { href: '#/group?' + new URLSearchParams({ g: g.group }) }, g.group)),
    el('td', {}, g.depth), el('td', { class: 'mono' }, head),
    el('td', {}, el('span', { class: 'state ' + groupState(g) }, groupState(g))));
}

async function groupPage() {
  const name = params().get('g') || '';
  const g = await api(q() + 'group?name=' + enc(name));
  const st = groupState(g);
  const reload = () => groupPage();
  const doAct = (what, extra = '') => async () => {
    try {
      await act(q() + 'group/' + what + '?name=' + enc(name) + extra);
    } catch (e) {
      return;  // (shown by api())
    }
    await reload();
  };
  main.replaceChildren(el('h2', {}, 'Group ', el('span', { class: 'mono', id: 'group-name' }, name)),
    el('dl', { id: 'group' },
      el('dt', {}, 'state'), el('dd', {}, el('span', { class: 'state ' + st, id: 'group-state' }, st)),
      el('dt', {}, 'jobs'), el('dd', { id: 'group-depth' }, g.depth),
      g.paused && [el('dt', {}, g.paused.halted ? 'halted' : 'paused'),
        el('dd', {}, when(g.paused.at), g.paused.error ? [' — ', el('span', { class: 'mono', id: 'halt-error' }, g.paused.error)] : '')],
      g.waiting_until > 0 && [el('dt', {}, 'retry at'), el('dd', {}, when(g.waiting_until))],
      g.runs > 0 && [el('dt', {}, 'running now'), el('dd', { id: 'group-runs' }, g.runs + ' of its jobs, at once')],
      g.running && [el('dt', {}, 'lease holder'),
        el('dd', { id: 'holder' }, g.running.worker + ' (' + g.running.host + ', pid ' + g.running.pid + '), running since ' + ago(g.running.since))],
      g.head && [el('dt', {}, 'next job'), el('dd', {}, el('pre', { id: 'head' }, json(g.head)))]),
    el('form', { class: 'bar', onsubmit: (e) => e.preventDefault() },
      actionButton('Pause', 'act', doAct('pause')),
      actionButton('Resume', 'act', doAct('resume')),
      actionButton('Resume, skipping the halted job', 'danger', doAct('resume', '&skip=1'))));
}

// --- a job by id ---

async function jobPage() {
  const p = params();
  const id = p.get('id') || '', group = p.get('group') || '';
  const idIn = el('input', { type: 'text', name: 'id', value: id, placeholder: 'job id' });
  const groupIn = el('input', { type: 'text', name: 'group', value: group, placeholder: 'its group (optional)' });
  const out = el('div', { id: 'job' });
  main.replaceChildren(el('h2', {}, 'A job by id'),
    el('form', { class: 'bar', onsubmit: (e) => { e.preventDefault(); go('job', { id: idIn.value, group: groupIn.value }); } },
      idIn, groupIn, el('button', { type: 'submit' }, 'Find')), out);
  if (!id) return;
  let j;
  try {
    j = await api(q() + 'job?id=' + enc(id) + (group ? '&group=' + enc(group) : ''));
  } catch (e) {
    out.append(el('p', { class: 'muted' }, e.message));
    return;
  }
  const rows = [el('dt', {}, 'state'), el('dd', {}, el('span', { class: 'state ' + j.state, id: 'job-state' }, j.state))];
  if (j.running) rows.push(el('dt', {}, 'running on'), el('dd', {}, j.running.worker + ' since ' + ago(j.running.since)));
  if (j.at) rows.push(el('dt', {}, j.state === 'done' ? 'completed' : j.state === 'cancelled' ? 'cancelled' : 'due'),
    el('dd', { id: 'job-at' }, when(j.at)));
  if ('result' in j) rows.push(el('dt', {}, 'result'), el('dd', {}, el('pre', { id: 'job-result' }, json(j.result))));
  if (j.job) {
    rows.push(el('dt', {}, 'type'), el('dd', { id: 'job-type' }, j.job.type || ''),
      el('dt', {}, 'attempts'), el('dd', { id: 'job-attempts' }, j.job.attempts),
      el('dt', {}, 'record'), el('dd', {}, el('pre', { id: 'job-record' }, json(j.job))));
  }
  if (j.dead) {
    rows.push(el('dt', {}, 'error'), el('dd', {}, el('pre', { id: 'job-error' }, j.dead.error)),
      el('dt', {}, 'runs'), el('dd', {}, j.dead.runs), el('dt', {}, 'group'), el('dd', {}, j.dead.group),
      el('dt', {}, 'record'), el('dd', {}, el('pre', {}, json(j.dead))));
  }
  if (j.group) rows.push(el('dt', {}, 'group'), el('dd', {}, el('pre', {}, json(j.group))));
  out.append(el('dl', {}, rows));
  // A kept job that has not ended may be cancelled (a running one at its worker's next renewal).
  if (['pending', 'delayed', 'paused', 'halted', 'running'].includes(j.state) && j.job && j.job.keep_ms) {
    out.append(el('form', { class: 'bar', onsubmit: (e) => e.preventDefault() },
      actionButton('Cancel', 'danger', async () => {
        try {
          await act(q() + 'job/cancel?id=' + enc(id));
        } catch (e) {
          return;  // (shown by api())
        }
        await jobPage();
      })));
  }
}

// --- dead letters ---

async function deadPage() {
  const p = params();
  const f = { group: p.get('group') || '', type: p.get('type') || '', text: p.get('text') || '' };
  const inputs = Object.fromEntries(Object.keys(f).map((k) =>
    [k, el('input', { type: 'text', name: k, value: f[k], placeholder: k === 'text' ? 'error text' : k })]));
  const rows = el('tbody');
  const more = el('button', { id: 'more', hidden: true }, 'More');
  const shown = [];
  const selected = () => shown.filter((s) => s.box.checked).map((s) => s.id);
  const all = () => shown.map((s) => s.id);
  const run = (what, ids) => async () => {
    const chosen = ids();
    if (chosen.length === 0) return;
    try {
      // (at most 1,000 an action)
      for (let i = 0; i < chosen.length; i += 1000) await act(q() + 'dead/' + what, { ids: chosen.slice(i, i + 1000) });
    } catch (e) {
      return;  // (shown by api())
    }
    await deadPage();
  };
  main.replaceChildren(el('h2', {}, 'Dead letters of ' + state.queue),
    el('form', { class: 'bar', onsubmit: (e) => {
      e.preventDefault();
      go('dead', Object.fromEntries(Object.entries(inputs).map(([k, i]) => [k, i.value])));
    } }, Object.values(inputs), el('button', { type: 'submit' }, 'Filter')),
    el('form', { class: 'bar', onsubmit: (e) => e.preventDefault() },
      actionButton('Requeue selected', 'act', run('requeue', selected)),
      actionButton('Requeue all shown', 'act', run('requeue', all)),
      actionButton('Purge selected', 'danger', run('purge', selected)),
      actionButton('Purge all shown', 'danger', run('purge', all))),
    el('table', { id: 'dead' }, el('thead', {}, el('tr', {}, ['', 'id', 'group', 'type', 'error', 'when', 'runs'].map((h) => el('th', {}, h)))), rows),
    more);
  let cursor = '';
  const load = () => fill(50, async () => {
    const qs = new URLSearchParams({ ...f, cursor, limit: 50 });
    const page = await api(q() + 'dead?' + qs);
    for (const d of page.letters) {
      const box = el('input', { type: 'checkbox', 'aria-label': 'select ' + d.id });
      shown.push({ id: d.id, box });
      const detail = el('tr', { hidden: true, class: 'detail' }, el('td', { colspan: 7 }, el('pre', {}, json(d))));
      rows.append(el('tr', { 'data-id': d.id },
        el('td', {}, box),
        el('td', { class: 'mono' }, el('a', { href: '#', onclick: (e) => { e.preventDefault(); detail.hidden = !detail.hidden; } }, d.id)),
        el('td', {}, d.group), el('td', {}, d.type || '(unreadable)'), el('td', { class: 'mono' }, d.error),
        el('td', {}, when(d.at)), el('td', {}, d.runs)), detail);
    }
    cursor = page.cursor;
    more.hidden = !cursor;
    return { added: page.letters.length, more: !!cursor };
  });
  more.onclick = () => moreOf(more, load);
  await load();
}

// --- workers ---

async function workersPage() {
  const rows = el('tbody');
  const more = el('button', { id: 'more', hidden: true }, 'More');
  main.replaceChildren(el('h2', {}, 'Workers of ' + state.queue),
    el('table', { id: 'workers' }, el('thead', {}, el('tr', {}, ['id', 'host', 'pid', 'concurrency', 'running', 'heartbeat', 'started'].map((h) => el('th', {}, h)))), rows),
    more);
  let cursor = '';
  const load = async () => {
    const page = await api(q() + 'workers?cursor=' + enc(cursor));
    for (const w of page.workers) {
      rows.append(el('tr', { 'data-worker': w.id },
        el('td', { class: 'mono' }, w.id), el('td', {}, w.host), el('td', {}, w.pid), el('td', {}, w.concurrency),
        el('td', {}, w.running, w.jobs.length ? el('div', { class: 'muted' }, w.jobs.map((j) => (j.group || '-') + ' ' + j.type + ' ' + j.id).join(', ')) : ''),
        el('td', {}, (w.heartbeat_age_ms / 1000).toFixed(1) + ' s ago'), el('td', {}, when(w.started))));
    }
    cursor = page.cursor;
    more.hidden = !cursor;
  };
  more.onclick = () => moreOf(more, load);
  await load();
}

// --- schedules ---

function inTime(ms) {
  const s = (ms - Date.now()) / 1000;
  if (s <= 0) return 'due';
  return s < 120 ? 'in ' + s.toFixed(1) + ' s' : s < 7200 ? 'in ' + (s / 60).toFixed(1) + ' min' : 'in ' + (s / 3600).toFixed(1) + ' h';
}

async function schedulesPage() {
  const rows = el('tbody');
  const more = el('button', { id: 'more', hidden: true }, 'More');
  main.replaceChildren(el('h2', {}, 'Schedules of ' + state.queue),
    el('p', { class: 'muted' }, 'Repeatable jobs: each firing is enqueued once, by whichever worker comes first (docs/SCHEDULES.md).'),
    el('table', { id: 'schedules' }, el('thead', {}, el('tr', {}, ['name', 'when', 'job', 'group', 'catch-up', 'next firing', ''].map((h) => el('th', {}, h)))), rows),
    more);
  let cursor = '';
  const load = () => fill(50, async () => {
    const page = await api(q() + 'schedules?limit=50&cursor=' + enc(cursor));
    for (const s of page.schedules) {
      const remove = actionButton('Remove', 'danger', async () => {
        try {
          await act(q() + 'schedule/remove?name=' + enc(s.name));
        } catch (e) {
          return;  // (shown by api())
        }
        row.remove();
        detail.remove();
      });
      const detail = el('tr', { hidden: true, class: 'detail' }, el('td', { colspan: 7 }, el('pre', {}, json(s.job || s))));
      const row = el('tr', { 'data-schedule': s.name },
        el('td', { class: 'mono' }, el('a', { href: '#', onclick: (e) => { e.preventDefault(); detail.hidden = !detail.hidden; } }, s.name)),
        s.error ? el('td', { class: 'state dead', colspan: 4 }, 'unreadable: ' + s.error)
          : [el('td', {}, s.timing), el('td', {}, s.type), el('td', {}, s.group || '-'), el('td', {}, s.catch_up)],
        el('td', { title: when(s.next) }, when(s.next), el('div', { class: 'muted' }, inTime(s.next))),
        el('td', {}, remove));
      rows.append(row, detail);
    }
    cursor = page.cursor;
    more.hidden = !cursor;
    return { added: page.schedules.length, more: !!cursor };
  });
  more.onclick = () => moreOf(more, load);
  await load();
}

// --- frame ---

const pages = { '': overviewPage, groups: groupsPage, group: groupPage, job: jobPage, dead: deadPage, workers: workersPage, schedules: schedulesPage };

async function route() {
  const h = location.hash.slice(2);
  const name = h.split('?')[0];
  for (const a of document.querySelectorAll('nav a'))
    a.classList.toggle('on', a.dataset.page === (name === 'group' ? 'groups' : name || 'overview'));
  main.removeAttribute('data-loaded');
  try {
    await (pages[name] || overviewPage)();
  } catch (e) {
    // (shown by api())
  }
  main.setAttribute('data-loaded', '');  // (the page has what it asked for: for tests)
}

function live() {
  if (state.events) state.events.close();
  state.events = new EventSource('api/events');
  state.events.addEventListener('overview', (m) => {
    state.overview = JSON.parse(m.data);
    drawOverview(state.overview);
    // The store's error while it lasts; gone once every queue answers again (an error of
    // another kind, an action's, stays until the next call).
    const bad = state.overview.queues.find((qu) => qu.error);
    if (bad) {
      showError(bad.name + ': ' + bad.error);
      state.liveError = true;
    } else if (state.liveError) {
      showError('');
      state.liveError = false;
    }
  });
}

async function start() {
  const tokenIn = document.getElementById('token');
  tokenIn.value = sessionStorage.getItem('jobrt-token') || '';
  tokenIn.addEventListener('change', () => sessionStorage.setItem('jobrt-token', tokenIn.value));
  document.getElementById('token-box').addEventListener('submit', (e) => e.preventDefault());
  let o;
  try {
    o = await api('overview');
  } catch (e) {
    setTimeout(start, 2000);  // the dashboard itself went away: try again
    return;
  }
  state.overview = o;
  state.queues = o.queues.map((qu) => qu.name);
  state.actions = o.actions;
  state.readOnly = o.read_only;
  document.getElementById('mode').textContent = o.read_only ? 'read-only' : o.actions ? '' : 'actions off (no token)';
  document.getElementById('token-box').hidden = !o.actions;
  const sel = document.getElementById('queue');
  sel.replaceChildren(...state.queues.map((n) => el('option', { value: n }, n)));
  state.queue = sessionStorage.getItem('jobrt-queue') || state.queues[0];
  if (!state.queues.includes(state.queue)) state.queue = state.queues[0];
  sel.value = state.queue;
  sel.addEventListener('change', () => { state.queue = sel.value; sessionStorage.setItem('jobrt-queue', sel.value); route(); });
  window.addEventListener('hashchange', route);
  live();
  route();
}

start();
