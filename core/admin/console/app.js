// The idemsink console: a page per hash route over /api/v1 (openapi.json).
// No framework and no build step; every text from the server goes into the
// page as text, never as HTML. The token stays in this tab (sessionStorage).
'use strict';

const main = document.getElementById('main');
let refreshTimer = null;

// ---------------------------------------------------------------- helpers

// An element: h('td', {class: 'num'}, 'text', child, ...)
function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) e.append(c instanceof Node ? c : document.createTextNode(String(c ?? '')));
  return e;
}

function flash(text, kind) {
  const box = document.getElementById('flash');
  box.replaceChildren(h('div', {class: kind || 'info', 'data-testid': 'flash-' + (kind || 'info')}, text));
}

async function api(method, path, body) {
  const headers = {'Accept': 'application/json'};
  const token = sessionStorage.getItem('idemsink-token');
  if (token) headers['Authorization'] = 'Bearer ' + token;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const res = await fetch('/api/v1' + path, {method, headers, body: body === undefined ? undefined : JSON.stringify(body)});
  const data = await res.json().catch(() => ({error: res.statusText}));
  if (res.status === 401 && method === 'GET') { location.hash = '#/login'; throw new Error(data.error); }
  if (!res.ok) throw new Error(res.status + ': ' + (data.error || res.statusText));
  return data;
}

// An action with a note: runs it, says what came of it, refreshes the page.
function actionForm(label, run, {danger, testid, extra} = {}) {
  const note = h('input', {class: 'note', placeholder: 'note: why (kept in the operator log)', 'data-testid': testid + '-note'});
  const form = h('form', {class: 'inline'}, extra || [], note,
    h('button', {type: 'submit', class: danger ? 'danger' : '', 'data-testid': testid}, label));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    if (!note.value.trim()) { flash('Say why in the note first.', 'error'); return; }
    try {
      const r = await run(note.value.trim());
      flash(r.message || 'done', 'info');
      route();
    } catch (e) { flash(e.message, 'error'); }
  });
  return form;
}

function source(s) { return s ? `${s.topic}[${s.partition}]@${s.offset}` : ''; }
function bytes(b) { return !b ? '(none)' : (b.text !== undefined ? b.text : 'base64: ' + b.base64); }
function table(headers, rows) {
  return h('table', {}, h('tr', {}, headers.map((t) => h('th', {}, t))), rows);
}

// ---------------------------------------------------------------- pages

async function routesPage() {
  const routes = await api('GET', '/routes');
  main.replaceChildren(h('h1', {}, 'Routes'), table(
    ['route', 'topic', 'state', 'done/s', 'in flight', 'lag', 'done', 'dead letters', 'unknown', 'order holds'],
    routes.map((r) => h('tr', {'data-testid': 'route-' + r.name},
      h('td', {}, h('a', {href: '#/route/' + encodeURIComponent(r.name)}, r.name)), h('td', {}, r.topic),
      h('td', {class: r.paused || r.circuit_open ? 'bad' : 'good'},
        r.paused ? 'paused by ' + r.paused_by : r.circuit_open ? 'circuit open' : 'running'),
      h('td', {class: 'num'}, r.rate.toFixed(1)), h('td', {class: 'num'}, r.in_flight), h('td', {class: 'num'}, r.lag ?? 'unknown'),
      h('td', {class: 'num'}, r.counters.done),
      h('td', {class: 'num'}, h('a', {href: '#/letters?route=' + encodeURIComponent(r.name)}, r.dead_letters)),
      h('td', {class: 'num'}, h('a', {href: '#/unknowns?route=' + encodeURIComponent(r.name)}, r.unknown_now)),
      h('td', {class: 'num'}, r.order_holds)))));
  refreshTimer = setTimeout(route, 3000);
}

async function routePage(name) {
  const r = await api('GET', '/routes/' + encodeURIComponent(name));
  const path = '/routes/' + encodeURIComponent(name);
  main.replaceChildren(h('h1', {}, 'Route ' + r.name),
    h('div', {class: 'card'},
      h('p', {}, `topic ${r.topic} · group ${r.group} · database ${r.database} · `,
        h('span', {class: r.paused ? 'bad' : 'good', 'data-testid': 'route-state'},
          r.paused ? `paused by ${r.paused_by} at ${r.paused_at}` : 'running'),
        r.circuit_open ? h('span', {class: 'bad'}, ' · circuit open') : ''),
      h('p', {}, Object.entries(r.counters).map(([k, v]) => `${k} ${v}`).join(' · ')),
      r.paused
        ? actionForm('Resume', (note) => api('POST', path + '/resume', {note}), {testid: 'resume'})
        : actionForm('Pause', (note) => api('POST', path + '/pause', {note}), {testid: 'pause', danger: true})),
    h('h2', {}, 'Partitions'),
    table(['partition', 'committed', 'high watermark', 'lag', 'fetching', 'in memory', 'stalled'],
      (r.partitions || []).map((p) => h('tr', {},
        h('td', {}, `${p.topic}[${p.partition}]`), h('td', {class: 'num'}, p.committed),
        h('td', {class: 'num'}, p.high_watermark), h('td', {class: 'num'}, p.lag ?? 'unknown'), h('td', {}, p.fetching ? 'yes' : 'no'),
        h('td', {class: 'num'}, p.in_pipeline), h('td', {class: p.stalled ? 'bad' : ''}, p.stalled ? 'yes' : 'no')))));
}

async function lettersPage(params) {
  const q = new URLSearchParams(params);
  const data = await api('GET', '/dead-letters?' + q.toString());
  const input = (name, placeholder) => h('input', {name, placeholder, value: params.get(name) || ''});
  const filter = h('form', {class: 'inline'}, input('route', 'route'), input('reason', 'reason'), input('key', 'biz_key'),
    input('since', 'since: 2h, 2026-11-30'), h('button', {type: 'submit', class: 'secondary'}, 'Filter'));
  filter.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const f = new URLSearchParams();
    for (const el of filter.querySelectorAll('input')) if (el.value) f.set(el.name, el.value);
    location.hash = '#/letters?' + f.toString();
  });
  main.replaceChildren(h('h1', {}, 'Dead letters'), filter, table(
    ['id', 'route', 'biz_key', 'reason', 'error', 'source', 'written', 'letter', 'claim now'],
    data.letters.map((l) => h('tr', {'data-testid': 'letter-' + l.id},
      h('td', {}, h('a', {href: '#/letter/' + l.id + '?route=' + encodeURIComponent(l.route), 'data-testid': 'open-letter-' + (l.biz_key || l.id)}, l.id)),
      h('td', {}, l.route), h('td', {}, l.biz_key ?? '(none)'), h('td', {}, l.reason), h('td', {}, l.error),
      h('td', {}, source(l.source)), h('td', {}, l.created_at), h('td', {}, l.state),
      h('td', {'data-testid': 'claim-status-' + l.id}, l.claim_status || '(no claim)')))));
}

async function letterPage(id, params) {
  const l = await api('GET', `/dead-letters/${id}?route=${encodeURIComponent(params.get('route') || '')}`);
  const replay = (dry_run) => (note) => api('POST', '/dead-letters/replay', {route: l.route, ids: [l.id], dry_run, note});
  main.replaceChildren(h('h1', {}, `Dead letter ${l.id} of route ${l.route}`),
    h('div', {class: 'card'},
      h('p', {}, `biz_key ${l.biz_key ?? '(none)'} · reason ${l.reason} · ${l.calls} call(s) · from ${source(l.source)}`),
      h('p', {}, 'error: ', l.error),
      h('p', {}, 'claim now: ', h('strong', {'data-testid': 'letter-claim-status'}, l.claim_status || '(no claim)'),
        ` · letter ${l.state}`, l.discard_note ? ` (${l.discard_note})` : ''),
      l.decoded ? [
        h('h2', {}, 'Decoded'),
        l.decoded.problem ? h('p', {'data-testid': 'letter-decode-problem'}, l.decoded.problem) : '',
        h('pre', {'data-testid': 'letter-decoded-value'}, JSON.stringify(l.decoded.value, null, 2)),
        l.decoded.key !== null ? h('pre', {'data-testid': 'letter-decoded-key'}, JSON.stringify(l.decoded.key, null, 2)) : '',
      ] : '',
      h('h2', {}, l.decoded ? 'Value as written' : 'Value'), h('pre', {'data-testid': 'letter-value'}, bytes(l.value)),
      h('h2', {}, 'Key'), h('pre', {}, bytes(l.key)),
      h('h2', {}, 'Headers'), table(['name', 'value'], l.headers.map((x) => h('tr', {}, h('td', {}, x.name), h('td', {}, bytes(x.value))))),
      h('h2', {}, 'Replay'),
      actionForm('Replay (dry run)', replay(true), {testid: 'replay-dry'}),
      actionForm('Replay', replay(false), {testid: 'replay'}),
      h('h2', {}, 'Discard'),
      actionForm('Discard', (note) => api('POST', `/dead-letters/${l.id}/discard`, {route: l.route, note}), {testid: 'discard', danger: true})));
}

async function unknownsPage(params) {
  const data = await api('GET', '/unknowns?' + new URLSearchParams(params).toString());
  main.replaceChildren(h('h1', {}, 'Unknown and stuck claims'), table(
    ['route', 'biz_key', 'status', 'calls', 'last error', 'source', 'since'],
    data.unknowns.map((u) => h('tr', {},
      h('td', {}, u.route),
      h('td', {}, h('a', {href: '#/unknown/' + encodeURIComponent(u.idem_token), 'data-testid': 'open-unknown-' + u.biz_key}, u.biz_key)),
      h('td', {}, u.status), h('td', {class: 'num'}, u.calls), h('td', {}, u.last_error), h('td', {}, source(u.source)),
      h('td', {}, u.updated_at)))));
}

async function unknownPage(token) {
  const u = await api('GET', '/unknowns/' + encodeURIComponent(token));
  const path = '/unknowns/' + encodeURIComponent(token);
  const hook = u.hook ? `${u.hook.answer}${u.hook.detail ? ' (' + u.hook.detail + ')' : ''}` : 'no answer (the route has no reconcile hook, or it did not answer in time)';
  main.replaceChildren(h('h1', {}, `Claim ${u.biz_key} of route ${u.route}`),
    h('div', {class: 'card'},
      h('p', {}, 'status ', h('strong', {'data-testid': 'unknown-status'}, u.status), ` · ${u.calls} call(s) · token ${u.idem_token}`),
      h('p', {}, 'last error: ', u.last_error),
      h('p', {}, 'the reconcile hook says now: ', h('strong', {'data-testid': 'hook-answer'}, hook)),
      h('h2', {}, 'Value'), h('pre', {}, bytes(u.value)),
      h('h2', {}, 'Settle it'),
      actionForm('Resolve as done', (note) => api('POST', path + '/resolve', {as: 'done', note}), {testid: 'resolve-done'}),
      actionForm('Resolve as failed', (note) => api('POST', path + '/resolve', {as: 'failed', note}), {testid: 'resolve-failed', danger: true}),
      actionForm('Ask again', (note) => api('POST', path + '/ask', {note}), {testid: 'ask'})));
}

async function holdsPage() {
  const data = await api('GET', '/holds');
  main.replaceChildren(h('h1', {}, 'Order holds'), table(['route', 'entity', 'held by', 'its claim', 'origin', 'since', ''],
    data.holds.map((x) => h('tr', {}, h('td', {}, x.route), h('td', {}, x.order_key), h('td', {}, x.held_by), h('td', {}, x.status),
      h('td', {}, x.origin), h('td', {}, x.since),
      h('td', {}, actionForm('Release', (note) => api('POST', '/holds/release', {route: x.route, order_key: x.order_key, note}), {testid: 'release-' + x.order_key}))))));
}

async function logPage() {
  const data = await api('GET', '/operator-log');
  main.replaceChildren(h('h1', {}, 'Operator log'), table(['when', 'who', 'role', 'action', 'route', 'records', 'note', 'result'],
    data.actions.map((a) => h('tr', {'data-testid': 'log-' + a.action},
      h('td', {}, a.at), h('td', {}, a.who), h('td', {}, a.role), h('td', {}, a.action), h('td', {}, a.route),
      h('td', {}, JSON.stringify(a.records)), h('td', {}, a.note), h('td', {}, a.result)))));
}

function loginPage() {
  main.replaceChildren(document.getElementById('login').content.cloneNode(true));
  document.getElementById('login-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    sessionStorage.setItem('idemsink-token', document.getElementById('token').value.trim());
    location.hash = '#/';
  });
  document.getElementById('anonymous').addEventListener('click', () => {
    sessionStorage.removeItem('idemsink-token');
    location.hash = '#/';
  });
}

// ---------------------------------------------------------------- routing

async function route() {
  clearTimeout(refreshTimer);
  const [path, query] = location.hash.slice(1).split('?');
  const params = new URLSearchParams(query || '');
  const parts = (path || '/').split('/').filter(Boolean).map(decodeURIComponent);
  try {
    if (parts[0] === 'login') return loginPage();
    const me = await api('GET', '/whoami');
    document.getElementById('who').textContent = `${me.name} (${me.role}${me.routes.length ? ': ' + me.routes.join(', ') : ''})`;
    if (parts.length === 0) await routesPage();
    else if (parts[0] === 'route') await routePage(parts[1]);
    else if (parts[0] === 'letters') await lettersPage(params);
    else if (parts[0] === 'letter') await letterPage(parts[1], params);
    else if (parts[0] === 'unknowns') await unknownsPage(params);
    else if (parts[0] === 'unknown') await unknownPage(parts[1]);
    else if (parts[0] === 'holds') await holdsPage();
    else if (parts[0] === 'log') await logPage();
    else main.replaceChildren(h('p', {}, 'No such page.'));
  } catch (e) {
    if (!location.hash.startsWith('#/login')) flash(e.message, 'error');
  }
}

document.getElementById('logout').addEventListener('click', () => {
  sessionStorage.removeItem('idemsink-token');
  location.hash = '#/login';
});
window.addEventListener('hashchange', () => { document.getElementById('flash').replaceChildren(); route(); });
route();
