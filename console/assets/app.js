// Strata console: the browser side. Plain ES2020, no framework, no build step.
// Works under the console's CSP: no inline script/style, no eval, no inline
// handlers; every server-provided string goes through textContent/value.
'use strict';
(() => {
  const POLL_MS = 5000;
  const DASH = '\u2014';

  // ------------------------------------------------------------------ state
  const S = {
    session: null,
    csrf: null,
    view: null,          // the mounted view: {name, refresh(force), unmount()}
    busy: new Set(),     // keys of actions in flight (survive re-renders)
    tenantFilter: '',
    tenantSort: { key: 'name', dir: 1 },
    selectedBranch: new Map(), // tenant -> branch name
    collapsed: new Map(),      // tenant -> Set of collapsed branch names
    graphs: { range: 'hour', tenant: '' },
    sql: { tenant: '', endpoint: '', text: 'select now();', timeout: '30' },
  };

  // ------------------------------------------------------------------ DOM helpers
  const $ = (sel, root = document) => root.querySelector(sel);
  const enc = encodeURIComponent;

  function appendKids(el, kids) {
    for (const k of kids) {
      if (k === null || k === undefined || k === false) continue;
      if (Array.isArray(k)) appendKids(el, k);
      else el.append(k instanceof Node ? k : String(k));
    }
  }

  function setProps(el, props) {
    for (const k in props) {
      const v = props[k];
      if (v === undefined || v === null || v === false) continue;
      switch (k) {
        case 'class': el.setAttribute('class', v); break;
        case 'text': el.textContent = String(v); break;
        case 'testid': el.dataset.testid = v; break;
        case 'data':
          for (const d in v) if (v[d] !== null && v[d] !== undefined) el.dataset[d] = String(v[d]);
          break;
        case 'value': el.value = String(v); break;
        case 'checked': case 'disabled': case 'hidden': case 'selected': case 'required': case 'readOnly':
          el[k] = true; break;
        case 'style': throw new Error('inline style is not allowed under the CSP');
        default: el.setAttribute(k, v === true ? '' : String(v));
      }
    }
  }

  // h('tag', {props}, ...children): children first so that select.value works.
  function h(tag, props, ...kids) {
    const el = document.createElement(tag);
    appendKids(el, kids);
    if (props) setProps(el, props);
    return el;
  }

  const SVGNS = 'http://www.w3.org/2000/svg';
  function sv(tag, attrs, ...kids) {
    const el = document.createElementNS(SVGNS, tag);
    if (attrs) for (const k in attrs) if (attrs[k] !== null && attrs[k] !== undefined) el.setAttribute(k, String(attrs[k]));
    appendKids(el, kids);
    return el;
  }

  // Puts rows into `tbody`, reusing each row whose data did not change
  // (`items`: {key, sig, build}): a poll that moves one branch's LSN
  // rebuilds that row, not the page's thousand. When the rows are the same
  // keys in the same order, changed ones are swapped in place; otherwise
  // the body is replaced with the (mostly reused) rows.
  function patchRows(tbody, items, cache) {
    const next = new Map();
    const rows = items.map(it => {
      const old = cache.get(it.key);
      const tr = old && old.sig === it.sig ? old.tr : it.build();
      next.set(it.key, { sig: it.sig, tr });
      return tr;
    });
    const current = tbody.children;
    const inPlace = current.length === rows.length && items.every((it, i) => {
      const old = cache.get(it.key);
      return old && current[i] === old.tr;
    });
    if (inPlace) {
      for (let i = 0; i < rows.length; i++) if (current[i] !== rows[i]) current[i].replaceWith(rows[i]);
    } else {
      const frag = document.createDocumentFragment();
      frag.append(...rows);
      tbody.replaceChildren(frag);
    }
    cache.clear();
    for (const [k, v] of next) cache.set(k, v);
  }

  function badge(text, cls, testid) {
    return h('span', { class: 'badge ' + cls, testid }, text);
  }

  function stateClass(state) {
    const s = String(state == null ? '' : state).toLowerCase();
    if (['running', 'ok', 'active', 'attached', 'healthy', 'up'].includes(s)) return 'b-ok';
    if (s === 'suspended') return 'b-susp';
    if (['starting', 'restarting', 'stopping', 'attaching', 'loading', 'activating', 'degraded'].includes(s)) return 'b-warn';
    if (['stopped', 'unknown', 'detached', ''].includes(s)) return 'b-off';
    if (['down', 'broken', 'failed', 'error', 'crashed', 'dead'].includes(s)) return 'b-bad';
    return 'b-other';
  }

  // Keep keyboard focus (and an input's selection) on "the same" control
  // across a re-render of `container`.
  function focusKey(container) {
    const a = document.activeElement;
    if (!a || a === document.body || !container.contains(a)) return null;
    const row = a.closest('[data-name]');
    return {
      row: row ? row.dataset.name : null,
      sig: (a.dataset.testid || '') + '|' + (a.dataset.action || a.dataset.act || '') + '|' + a.tagName,
      sel: (a.tagName === 'INPUT' && a.selectionStart != null) ? [a.selectionStart, a.selectionEnd] : null,
    };
  }
  function restoreFocus(container, key) {
    if (!key) return;
    const rows = key.row === null ? [container] : container.querySelectorAll('[data-name]');
    for (const row of rows) {
      if (key.row !== null && row.dataset.name !== key.row) continue;
      for (const el of row.querySelectorAll('button, input, a, select')) {
        const sig = (el.dataset.testid || '') + '|' + (el.dataset.action || el.dataset.act || '') + '|' + el.tagName;
        if (sig === key.sig) {
          el.focus({ preventScroll: true });
          if (key.sel && el.setSelectionRange) { try { el.setSelectionRange(key.sel[0], key.sel[1]); } catch (_) { /* ignore */ } }
          return;
        }
      }
    }
  }

  // Replace a select's options only when they changed; keep the value.
  function syncOptions(select, opts, fallback) {
    const sig = JSON.stringify(opts);
    if (select.dataset.sig === sig) return;
    const old = select.value;
    const frag = document.createDocumentFragment();
    for (const o of opts) frag.append(h('option', { value: o.value }, o.label));
    select.replaceChildren(frag);
    select.dataset.sig = sig;
    if (opts.some(o => o.value === old)) select.value = old;
    else if (fallback !== undefined && opts.some(o => o.value === fallback)) select.value = fallback;
  }

  // ------------------------------------------------------------------ formatting
  const p2 = n => String(n).padStart(2, '0');
  const isNum = v => v !== null && v !== undefined && v !== '' && Number.isFinite(Number(v));

  function fmtBytes(n) {
    if (!isNum(n)) return DASH;
    n = Number(n);
    let v = Math.abs(n);
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB'];
    let i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    const s = i === 0 ? String(Math.round(v)) : v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
    return (n < 0 ? '-' : '') + s + ' ' + u[i];
  }
  function fmtCount(n) {
    if (n === null || n === undefined || n === '') return DASH;
    if (!isNum(n)) return String(n);
    const s = String(Number(n));
    return /^-?\d{4,}$/.test(s) ? s.replace(/\B(?=(\d{3})+$)/g, ',') : s;
  }
  function fmtDur(s) {
    if (!isNum(s)) return DASH;
    s = Math.round(Number(s));
    if (s === 0) return '0s';
    const parts = [];
    let rest = Math.abs(s);
    for (const [n, u] of [[86400, 'd'], [3600, 'h'], [60, 'm'], [1, 's']]) {
      if (rest >= n) { parts.push(Math.floor(rest / n) + u); rest %= n; }
    }
    return (s < 0 ? '-' : '') + parts.slice(0, 2).join(' ');
  }
  function fmtSecs(v) {
    if (!isNum(v)) return DASH;
    v = Number(v);
    const a = Math.abs(v);
    if (a === 0) return '0 s';
    if (a < 0.001) return (v * 1e6).toFixed(0) + ' µs';
    if (a < 1) return (v * 1000).toFixed(a < 0.01 ? 2 : a < 0.1 ? 1 : 0) + ' ms';
    if (a < 60) return v.toFixed(a < 10 ? 2 : 1) + ' s';
    return fmtDur(v);
  }
  function toDate(v) {
    if (v === null || v === undefined || v === '') return null;
    let d;
    if (typeof v === 'number') d = new Date(v > 1e12 ? v : v * 1000);
    else if (/^\d+(\.\d+)?$/.test(String(v))) d = new Date(Number(v) * 1000);
    else d = new Date(String(v));
    return Number.isNaN(d.getTime()) ? null : d;
  }
  function fmtTime(v, noSeconds) {
    const d = toDate(v);
    if (!d) return v === null || v === undefined || v === '' ? DASH : String(v);
    const s = `${d.getFullYear()}-${p2(d.getMonth() + 1)}-${p2(d.getDate())} ${p2(d.getHours())}:${p2(d.getMinutes())}`;
    return noSeconds ? s : s + ':' + p2(d.getSeconds());
  }
  function fmtClock(v) {
    const d = toDate(v);
    return d ? `${p2(d.getHours())}:${p2(d.getMinutes())}:${p2(d.getSeconds())}` : DASH;
  }
  const fmtHM = unix => { const d = new Date(unix * 1000); return p2(d.getHours()) + ':' + p2(d.getMinutes()); };
  function fmtBool(v) {
    if (v === true) return 'yes';
    if (v === false) return 'no';
    if (v === null || v === undefined || v === '') return DASH;
    return String(v);
  }
  const fmtText = v => (v === null || v === undefined || v === '') ? DASH : (typeof v === 'object' ? JSON.stringify(v) : String(v));
  const LSN_RE = /^[0-9A-Fa-f]{1,8}\/[0-9A-Fa-f]{1,8}$/;
  function rfc3339Local(d) {
    const off = -d.getTimezoneOffset();
    const sign = off >= 0 ? '+' : '-';
    const a = Math.abs(off);
    return `${d.getFullYear()}-${p2(d.getMonth() + 1)}-${p2(d.getDate())}T${p2(d.getHours())}:${p2(d.getMinutes())}:${p2(d.getSeconds())}${sign}${p2(Math.floor(a / 60))}:${p2(a % 60)}`;
  }
  function browserOffset() { return rfc3339Local(new Date()).slice(19); }
  // "2025-01-31T14:05[:SS]" (a datetime-local value, taken in the browser's
  // time zone) or a full RFC 3339 time with Z/offset. Returns null if neither.
  function toRfc3339(text) {
    const t = text.trim();
    let m = /^(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.\d+)?)?$/.exec(t);
    if (m) {
      const d = new Date(+m[1], +m[2] - 1, +m[3], +m[4], +m[5], +(m[6] || 0));
      return Number.isNaN(d.getTime()) ? null : rfc3339Local(d);
    }
    m = /^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2})(:\d{2}(?:\.\d+)?)?([Zz]|[+-]\d{2}:\d{2})$/.exec(t);
    if (!m) return null;
    const r = `${m[1]}T${m[2]}${m[3] || ':00'}${m[4]}`;
    return Number.isNaN(new Date(r).getTime()) ? null : r;
  }

  // ------------------------------------------------------------------ API
  class ApiError extends Error {
    constructor(status, msg, data) { super(msg); this.status = status; this.data = data || null; }
  }

  async function api(method, path, body) {
    return (await request(method, path, body)).data;
  }

  // The answer and its raw text (views compare the text to skip re-renders).
  async function request(method, path, body) {
    const headers = { accept: 'application/json' };
    const opts = { method, headers, credentials: 'same-origin', cache: 'no-store' };
    if (method !== 'GET') {
      headers['content-type'] = 'application/json';
      if (S.csrf) headers['x-csrf-token'] = S.csrf;
      opts.body = JSON.stringify(body === undefined ? {} : body);
    }
    let res;
    try {
      res = await fetch(path, opts);
    } catch (e) {
      throw new ApiError(0, 'cannot reach the console: ' + (e && e.message ? e.message : e));
    }
    const text = await res.text();
    let data = null;
    if (text) { try { data = JSON.parse(text); } catch (_) { data = undefined; } }
    if (res.status === 401 && path !== '/api/login' && path !== '/api/session') {
      sessionExpired();
      throw new ApiError(401, 'session expired');
    }
    if (!res.ok) {
      const msg = data && typeof data.error === 'string' ? data.error : `HTTP ${res.status} ${res.statusText}`.trim();
      throw new ApiError(res.status, msg, data);
    }
    if (data === undefined) throw new ApiError(res.status, 'the console answered something that is not JSON');
    return { data, text };
  }

  const canAct = () => !!S.session && S.session.role !== 'viewer';
  const isAdmin = () => !!S.session && S.session.role === 'admin';

  // ------------------------------------------------------------------ message area
  function showMessage(kind, title, lines) {
    const m = $('#message');
    m.replaceChildren(
      h('div', { class: 'msg-head' },
        h('strong', { class: 'msg-title' }, title),
        h('button', { type: 'button', class: 'msg-close link', 'aria-label': 'Dismiss message', data: { act: 'dismiss' } }, '\u00d7')),
      lines && lines.length ? h('pre', { class: 'msg-lines' }, lines.join('\n')) : null);
    m.className = 'message msg-' + kind;
    m.hidden = false;
  }
  function clearMessage() {
    const m = $('#message');
    m.hidden = true;
    m.replaceChildren();
  }

  function setBusy(btn, on) {
    if (!btn) return;
    btn.disabled = on;
    btn.classList.toggle('busy', on);
    if (on) btn.setAttribute('aria-busy', 'true'); else btn.removeAttribute('aria-busy');
  }

  // Run one action: busy button, message with the answer's lines, refresh.
  async function runAction(btn, key, title, fn) {
    if (S.busy.has(key)) return false;
    S.busy.add(key);
    setBusy(btn, true);
    showMessage('pending', title + ' \u2026', []);
    let ok = false;
    try {
      const r = await fn();
      const lines = r && Array.isArray(r.lines) ? r.lines.map(String) : [];
      showMessage('ok', title + ': done', lines);
      ok = true;
    } catch (e) {
      if (e.status !== 401) showMessage('error', title + ': failed', [e.message]);
    } finally {
      S.busy.delete(key);
      setBusy(btn, false);
      if (S.view && S.session) S.view.refresh(true);
    }
    return ok;
  }

  // ------------------------------------------------------------------ dialog
  let dialogResolve = null;
  function openDialog({ title, text, input, value, ok, danger }) {
    const dlg = $('#dialog');
    if (typeof dlg.showModal !== 'function') {
      return Promise.resolve(input ? window.prompt(text, value || '') : window.confirm(text));
    }
    if (dialogResolve) { dialogResolve(null); dialogResolve = null; }
    $('#dialog-title').textContent = title || '';
    $('#dialog-text').textContent = text || '';
    const inp = $('#dialog-input');
    inp.hidden = !input;
    inp.value = value || '';
    const okBtn = $('#dialog-ok');
    okBtn.textContent = ok || 'OK';
    okBtn.classList.toggle('danger', !!danger);
    return new Promise(resolve => {
      dialogResolve = resolve;
      dlg.showModal();
      if (input) { inp.focus(); inp.select(); } else okBtn.focus();
    });
  }
  function closeDialog(result) {
    const dlg = $('#dialog');
    const r = dialogResolve;
    dialogResolve = null;
    if (dlg.open) dlg.close();
    if (r) r(result);
  }
  const confirmDialog = (title, text, ok, danger) => openDialog({ title, text, ok, danger }).then(v => !!v);
  const promptDialog = (title, text, value, ok) => openDialog({ title, text, input: true, value, ok });

  function initDialog() {
    const dlg = $('#dialog');
    $('#dialog-form').addEventListener('submit', ev => {
      ev.preventDefault();
      const inp = $('#dialog-input');
      if (!inp.hidden) {
        const v = inp.value.trim();
        if (!v) { inp.focus(); return; }
        closeDialog(v);
      } else closeDialog(true);
    });
    $('#dialog-cancel').addEventListener('click', () => closeDialog(null));
    dlg.addEventListener('cancel', ev => { ev.preventDefault(); closeDialog(null); });
  }

  // ------------------------------------------------------------------ session
  function showLogin(msg) {
    stopView();
    S.session = null;
    S.csrf = null;
    $('#topbar').hidden = true;
    $('#view').replaceChildren();
    clearMessage();
    const err = $('#login-error');
    err.textContent = msg || '';
    err.hidden = !msg;
    $('#login-password').value = '';
    $('#login-token').value = '';
    $('#login').hidden = false;
    setBusy($('#login-submit'), false);
    const u = $('#login-user');
    (u.value ? $('#login-password') : u).focus();
  }

  function sessionExpired() {
    if (!S.session) return;
    if (dialogResolve) closeDialog(null);
    showLogin('session expired');
  }

  function startSession(s) {
    S.session = s;
    S.csrf = s.csrf || S.csrf;
    $('#login').hidden = true;
    $('#login-error').hidden = true;
    $('#topbar').hidden = false;
    $('#who-user').textContent = s.user == null ? '' : String(s.user);
    const role = $('#who-role');
    role.textContent = s.role == null ? '' : String(s.role);
    document.body.classList.toggle('role-viewer', s.role === 'viewer');
    $('[data-testid="nav-audit"]').hidden = s.role !== 'admin';
    $('[data-testid="nav-sql"]').hidden = s.role === 'viewer';
    route();
  }

  async function checkSession() {
    try {
      const s = await api('GET', '/api/session');
      startSession(s);
    } catch (e) {
      showLogin(e.status === 401 ? '' : e.message);
    }
  }

  function initLogin() {
    $('#login-form').addEventListener('submit', async ev => {
      ev.preventDefault();
      const btn = $('#login-submit');
      const err = $('#login-error');
      const token = $('#login-token').value.trim();
      const user = $('#login-user').value.trim();
      const password = $('#login-password').value;
      let body;
      if (token) body = { token };
      else if (user && password) body = { user, password };
      else {
        err.textContent = 'Enter a user name and password, or a management token.';
        err.hidden = false;
        return;
      }
      setBusy(btn, true);
      err.hidden = true;
      try {
        let s = await api('POST', '/api/login', body);
        if (!s || !s.csrf) s = await api('GET', '/api/session');
        startSession(s);
      } catch (e) {
        err.textContent = e.status === 401 || e.status === 403
          ? (e.message && !/^HTTP /.test(e.message) ? e.message : 'wrong user, password or token')
          : e.message;
        err.hidden = false;
      } finally {
        setBusy(btn, false);
      }
    });
    $('#logout').addEventListener('click', async () => {
      const btn = $('#logout');
      setBusy(btn, true);
      try { await api('POST', '/api/logout'); } catch (_) { /* logged out either way */ }
      setBusy(btn, false);
      showLogin('');
    });
  }

  // ------------------------------------------------------------------ routing & polling
  function parseRoute() {
    const raw = location.hash.replace(/^#/, '');
    const [pathPart] = raw.split('?');
    let parts;
    try { parts = pathPart.split('/').filter(Boolean).map(decodeURIComponent); } catch (_) { parts = ['?']; }
    if (!parts.length) return { name: 'tenants' };
    switch (parts[0]) {
      case 'tenants': return { name: 'tenants' };
      case 'tenant': return parts[1] ? { name: 'tenant', tenant: parts[1] } : { name: 'tenants' };
      case 'services': return { name: 'services' };
      case 'graphs': return { name: 'graphs', tenant: parts[1] };
      case 'sql': return { name: 'sql', tenant: parts[1], endpoint: parts[2] };
      case 'audit': return { name: 'audit' };
      default: return { name: 'notfound' };
    }
  }

  function stopView() {
    if (S.view && S.view.unmount) S.view.unmount();
    S.view = null;
  }

  function route() {
    if (!S.session) return;
    stopView();
    if (dialogResolve) closeDialog(null);
    clearMessage();
    const r = parseRoute();
    const nav = r.name === 'tenant' ? 'tenants' : r.name;
    for (const a of document.querySelectorAll('.nav a')) {
      const on = a.dataset.nav === nav;
      a.classList.toggle('active', on);
      if (on) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
    }
    const root = $('#view');
    root.replaceChildren();
    const factory = VIEWS[r.name] || NotFoundView;
    const view = factory(r);
    S.view = view;
    view.mount(root);
    document.title = (view.title || 'Strata') + ' \u00b7 Strata console';
    view.refresh(true);
  }

  function poll() {
    if (!S.session || !S.view || document.visibilityState !== 'visible') return;
    S.view.refresh(false);
  }

  // A view's loader: fetch, skip the render when the data (sampled_at aside)
  // did not change, show a load error without dropping what is on screen.
  const SAMPLED_RE = /"sampled_at"\s*:\s*("(?:[^"\\]|\\.)*"|[-+\d.eE]+|null)/;

  function makeLoader(view, urlFn, render, errEl, stampEl) {
    let seq = 0;
    let inflight = false;
    let lastKey = null;
    return async function refresh(force) {
      if (inflight && !force) return;
      const my = ++seq;
      inflight = true;
      try {
        const url = urlFn();
        const { data, text } = await request('GET', url);
        if (S.view !== view || my !== seq) return;
        // the data without its sampling time: unchanged data is not re-rendered
        const key = url + '\n' + text.replace(SAMPLED_RE, '');
        if (force || key !== lastKey) {
          lastKey = key;
          render(data);
        }
        if (stampEl) {
          stampEl.textContent = !data || !('sampled_at' in data) ? 'updated ' + fmtClock(Date.now())
            : data.sampled_at ? 'sampled ' + fmtClock(data.sampled_at) : 'waiting for the first reading of the cluster';
        }
        if (errEl) {
          // the console keeps the last good reading when one fails: say so
          if (data && typeof data.error === 'string' && data.error) {
            errEl.textContent = 'The last reading of the cluster failed (showing the one before): ' + data.error;
            errEl.hidden = false;
          } else errEl.hidden = true;
        }
      } catch (e) {
        if (S.view !== view || my !== seq || e.status === 401) return;
        if (errEl) { errEl.textContent = 'Could not load: ' + e.message; errEl.hidden = false; }
      } finally {
        if (my === seq) inflight = false;
      }
    };
  }

  function viewHead(title, ...extra) {
    const stamp = h('span', { class: 'stamp dim' });
    const err = h('div', { class: 'errbox', role: 'alert', hidden: true });
    const head = h('div', { class: 'viewhead' }, h('h1', null, title), ...extra, stamp);
    return { head, stamp, err };
  }

  function tableWrap(table, cls) {
    return h('div', { class: 'tablewrap' + (cls ? ' ' + cls : '') }, table);
  }

  function thead(cols) {
    return h('thead', null, h('tr', null, cols.map(c => {
      if (typeof c === 'string') return h('th', { scope: 'col' }, c);
      return h('th', { scope: 'col', class: c.cls, title: c.title, data: c.sort ? { sort: c.sort } : null }, c.label);
    })));
  }

  // ------------------------------------------------------------------ view: tenants
  const TENANT_COLS = [
    { label: 'Tenant', sort: 'name' },
    { label: 'Tenant ID', sort: 'tenant_id' },
    { label: 'State', sort: 'state' },
    { label: 'PG', sort: 'pg_version', cls: 'num' },
    { label: 'Attached', sort: 'attached' },
    { label: 'Branches', sort: 'branches', cls: 'num' },
    { label: 'Running', sort: 'endpoints_running', cls: 'num', title: 'endpoints running' },
    { label: 'Suspended', sort: 'endpoints_suspended', cls: 'num', title: 'endpoints suspended' },
    { label: 'Logical size', sort: 'logical_bytes', cls: 'num' },
    { label: 'WAL held', sort: 'wal_held_bytes', cls: 'num' },
    { label: 'Local layers', sort: 'local_layer_bytes', cls: 'num' },
    { label: 'Remote layers', sort: 'remote_layer_bytes', cls: 'num' },
  ];
  const collator = new Intl.Collator(undefined, { numeric: true, sensitivity: 'base' });

  function TenantsView() {
    const view = { name: 'tenants', title: 'Tenants' };
    let tbody, filter, countEl, theadEl, tenants = [];
    const { head, stamp, err } = viewHead('Tenants');

    function applyFilter() {
      const q = filter.value.trim().toLowerCase();
      let shown = 0;
      for (const tr of tbody.rows) {
        const hide = !!q && !tr.dataset.search.includes(q);
        tr.classList.toggle('hidden', hide);
        if (!hide) shown++;
      }
      countEl.textContent = q ? `${shown} of ${tenants.length} tenants` : `${tenants.length} tenants`;
    }

    function sortRows(list) {
      const { key, dir } = S.tenantSort;
      return list.slice().sort((a, b) => {
        const x = a[key], y = b[key];
        const xn = x === null || x === undefined, yn = y === null || y === undefined;
        if (xn || yn) return xn && yn ? 0 : xn ? 1 : -1;
        if (typeof x === 'number' && typeof y === 'number') return (x - y) * dir;
        return collator.compare(String(x), String(y)) * dir;
      });
    }

    const rowCache = new Map();
    function renderRows() {
      const fk = focusKey(tbody);
      const items = sortRows(tenants).map(t => ({ key: String(t.name), sig: JSON.stringify(t), build: () => tenantRow(t) }));
      if (items.length) patchRows(tbody, items, rowCache);
      else { rowCache.clear(); tbody.replaceChildren(h('tr', { class: 'empty' }, h('td', { colspan: TENANT_COLS.length }, 'No tenants.'))); }
      for (const th of theadEl.querySelectorAll('th[data-sort]')) {
        const on = th.dataset.sort === S.tenantSort.key;
        th.classList.toggle('sorted', on);
        th.setAttribute('aria-sort', on ? (S.tenantSort.dir > 0 ? 'ascending' : 'descending') : 'none');
      }
      applyFilter();
      restoreFocus(tbody, fk);
    }

    function tenantRow(t) {
      const name = String(t.name);
      const tid = t.tenant_id == null ? '' : String(t.tenant_id);
      return (h('tr', { testid: 'tenant-row', data: { name, search: (name + ' ' + tid).toLowerCase() } },
        h('td', { class: 'strong' }, h('a', { href: '#/tenant/' + enc(name) }, name)),
        h('td', { class: 'mono small', title: tid || null }, tid ? tid.slice(0, 12) + (tid.length > 12 ? '\u2026' : '') : DASH),
        h('td', null, badge(fmtText(t.state), stateClass(t.state))),
        h('td', { class: 'num' }, fmtText(t.pg_version)),
        h('td', null, fmtBool(t.attached)),
        h('td', { class: 'num' }, fmtCount(t.branches)),
        h('td', { class: 'num' }, fmtCount(t.endpoints_running)),
        h('td', { class: 'num' }, fmtCount(t.endpoints_suspended)),
        h('td', { class: 'num' }, fmtBytes(t.logical_bytes)),
        h('td', { class: 'num' }, fmtBytes(t.wal_held_bytes)),
        h('td', { class: 'num' }, fmtBytes(t.local_layer_bytes)),
        h('td', { class: 'num' }, fmtBytes(t.remote_layer_bytes))));
    }

    view.mount = root => {
      filter = h('input', { type: 'search', id: 'tenant-filter', testid: 'tenant-filter', placeholder: 'Filter by name or ID', 'aria-label': 'Filter tenants', autocomplete: 'off', spellcheck: 'false' });
      filter.value = S.tenantFilter;
      countEl = h('span', { class: 'dim' });
      theadEl = thead(TENANT_COLS);
      tbody = h('tbody');
      const table = h('table', { class: 'grid', testid: 'tenants-table' }, theadEl, tbody);
      root.append(head, h('div', { class: 'toolbar' }, filter, countEl), err, tableWrap(table, 'tall'));
      filter.addEventListener('input', () => { S.tenantFilter = filter.value; applyFilter(); });
      theadEl.addEventListener('click', ev => {
        const th = ev.target.closest('th[data-sort]');
        if (!th) return;
        const key = th.dataset.sort;
        S.tenantSort = { key, dir: S.tenantSort.key === key ? -S.tenantSort.dir : 1 };
        renderRows();
      });
    };
    view.refresh = makeLoader(view, () => '/api/overview', data => {
      tenants = Array.isArray(data.tenants) ? data.tenants : [];
      renderRows();
    }, err, stamp);
    return view;
  }

  // ------------------------------------------------------------------ view: one tenant
  // Order branches as a tree: depth-first, children under their parent.
  function buildTree(branches) {
    const byName = new Map();
    for (const b of branches) byName.set(b.name, b);
    const kids = new Map();
    const roots = [];
    for (const b of branches) {
      if (b.parent !== null && b.parent !== undefined && b.parent !== b.name && byName.has(b.parent)) {
        let a = kids.get(b.parent);
        if (!a) kids.set(b.parent, a = []);
        a.push(b);
      } else roots.push(b);
    }
    const cmp = (x, y) => (x.name === 'main' ? -1 : y.name === 'main' ? 1 : collator.compare(String(x.name), String(y.name)));
    roots.sort(cmp);
    for (const a of kids.values()) a.sort(cmp);
    const out = [];
    const seen = new Set();
    const walk = root => {
      const stack = [[root, 0]];
      while (stack.length) {
        const [b, d] = stack.pop();
        if (seen.has(b.name)) continue;
        seen.add(b.name);
        const k = kids.get(b.name) || [];
        out.push({ b, depth: d, kids: k.length, desc: 0 });
        for (let i = k.length - 1; i >= 0; i--) stack.push([k[i], d + 1]);
      }
    };
    for (const r of roots) walk(r);
    for (const b of branches) if (!seen.has(b.name)) walk(b); // cycles: show anyway
    // descendants count = size of each subtree in the DFS order
    const st = [];
    for (let i = 0; i < out.length; i++) {
      while (st.length && out[st[st.length - 1]].depth >= out[i].depth) { const j = st.pop(); out[j].desc = i - j - 1; }
      st.push(i);
    }
    while (st.length) { const j = st.pop(); out[j].desc = out.length - j - 1; }
    return out;
  }

  const BRANCH_COLS = ['Branch', { label: 'Branch point', title: 'ancestor LSN and its time (point_time, else created_at)' },
    { label: 'Last LSN', title: 'last record LSN' }, { label: 'Logical', cls: 'num', title: 'logical size' }, { label: 'PITR', cls: 'num', title: 'PITR window' },
    { label: 'GC cutoff / waits for', title: 'GC cutoff LSN, and what holds GC back' },
    { label: 'Layers', title: 'local / remote bytes; L0, L1 and image layer files' },
    { label: 'Attached', title: 'attached pageserver and generation' },
    { label: 'Safekeepers', title: 'flush / commit LSN' }, { label: '', cls: 'actions' }];
  const EP_COLS = ['Endpoint', 'Branch', 'Role', 'State', 'Host', 'Connection', { label: 'Replica lag', cls: 'num' },
    { label: 'Suspend after', cls: 'num' }, { label: 'Restarts', title: 'restarts and the last cause' }, { label: '', cls: 'actions' }];

  function TenantView(r) {
    const T = r.tenant;
    const view = { name: 'tenant', title: T };
    let branches = [], endpoints = [], tenant = null;
    let treeBody, epBody, storageEl, titleMeta, branchCount, epCount, bForm, eForm;
    if (!S.collapsed.has(T)) S.collapsed.set(T, new Set());
    const collapsed = S.collapsed.get(T);
    const { head, stamp, err } = viewHead(T);

    // --- branch form
    function buildBranchForm() {
      const name = h('input', { id: 'bf-name', testid: 'branch-name', required: true, autocomplete: 'off', spellcheck: 'false', placeholder: 'feature-x' });
      const parent = h('select', { id: 'bf-parent', testid: 'branch-parent' });
      const mode = v => h('input', { type: 'radio', name: 'bf-point', value: v, checked: v === 'now', id: 'bf-point-' + v });
      const mNow = mode('now'), mLsn = mode('lsn'), mTime = mode('time');
      const at = h('input', { id: 'bf-at', testid: 'branch-at', class: 'mono', placeholder: '0/16B3748', autocomplete: 'off', spellcheck: 'false', 'aria-label': 'Branch point LSN' });
      const atTime = h('input', { id: 'bf-at-time', testid: 'branch-at-time', class: 'mono', placeholder: 'YYYY-MM-DDTHH:MM or RFC 3339', autocomplete: 'off', spellcheck: 'false', 'aria-label': 'Branch point time' });
      const picker = h('input', { type: 'datetime-local', step: '1', id: 'bf-picker', 'aria-label': 'Pick the branch point time' });
      const submit = h('button', { type: 'submit', class: 'primary', testid: 'branch-submit' }, 'Create branch');
      const cancel = h('button', { type: 'button', data: { act: 'cancel' } }, 'Cancel');
      const form = h('form', { class: 'panel form', testid: 'branch-form', hidden: true, novalidate: true, 'aria-label': 'New branch' },
        h('h3', null, 'New branch'),
        h('div', { class: 'form-row' },
          h('label', { class: 'field', for: 'bf-name' }, h('span', null, 'Name'), name),
          h('label', { class: 'field', for: 'bf-parent' }, h('span', null, 'Parent'), parent)),
        h('fieldset', { class: 'point' },
          h('legend', null, 'Branch point'),
          h('label', { class: 'radio', for: 'bf-point-now' }, mNow, ' now (the parent\u2019s last record)'),
          h('div', { class: 'radio-row' }, h('label', { class: 'radio', for: 'bf-point-lsn' }, mLsn, ' at LSN'), at),
          h('div', { class: 'radio-row' }, h('label', { class: 'radio', for: 'bf-point-time' }, mTime, ' at time'), atTime, picker,
            h('span', { class: 'dim small' }, `times without an offset are in your browser\u2019s zone (UTC${browserOffset()})`))),
        h('div', { class: 'form-buttons' }, submit, cancel));
      at.addEventListener('input', () => { mLsn.checked = !!at.value.trim() || mLsn.checked; });
      atTime.addEventListener('input', () => { mTime.checked = !!atTime.value.trim() || mTime.checked; });
      picker.addEventListener('change', () => {
        if (!picker.value) return;
        const v = toRfc3339(picker.value);
        if (v) { atTime.value = v; mTime.checked = true; }
      });
      cancel.addEventListener('click', () => { form.hidden = true; });
      form.addEventListener('submit', async ev => {
        ev.preventDefault();
        const n = name.value.trim();
        if (!n) { showMessage('error', 'New branch', ['Give the branch a name.']); name.focus(); return; }
        const body = { name: n, parent: parent.value || null, at: null, at_time: null };
        if (mLsn.checked) {
          const l = at.value.trim();
          if (!LSN_RE.test(l)) { showMessage('error', 'New branch', [`"${l}" is not an LSN (like 0/16B3748).`]); at.focus(); return; }
          body.at = l.toUpperCase();
        } else if (mTime.checked) {
          const t = toRfc3339(atTime.value);
          if (!t) { showMessage('error', 'New branch', [`"${atTime.value.trim()}" is not a time (YYYY-MM-DDTHH:MM[:SS] or RFC 3339).`]); atTime.focus(); return; }
          body.at_time = t;
        }
        const ok = await runAction(submit, 'branch-create:' + T, `create branch ${n}`,
          () => api('POST', `/api/tenants/${enc(T)}/branches`, body));
        if (ok) {
          form.hidden = true;
          name.value = ''; at.value = ''; atTime.value = ''; picker.value = ''; mNow.checked = true;
        }
      });
      form.open = parentName => {
        form.hidden = false;
        const names = branches.map(b => b.name);
        const sel = S.selectedBranch.get(T);
        const want = parentName || (sel && names.includes(sel) ? sel : names.includes('main') ? 'main' : names[0]);
        if (want !== undefined) parent.value = want;
        form.scrollIntoView({ block: 'nearest' });
        name.focus();
      };
      form.sync = () => {
        syncOptions(parent, branches.map(b => ({ value: b.name, label: b.name })), 'main');
      };
      return form;
    }

    // --- endpoint form
    function buildEndpointForm() {
      const name = h('input', { id: 'ef-name', testid: 'endpoint-name', required: true, autocomplete: 'off', spellcheck: 'false', placeholder: 'ep-2' });
      const branch = h('select', { id: 'ef-branch', testid: 'endpoint-branch' });
      const replicaOf = h('select', { id: 'ef-replica-of', testid: 'endpoint-replica-of' });
      const suspend = h('input', { id: 'ef-suspend', testid: 'endpoint-suspend-after', type: 'number', min: '0', step: '1', placeholder: 'default', inputmode: 'numeric' });
      const submit = h('button', { type: 'submit', class: 'primary', testid: 'endpoint-submit' }, 'Create endpoint');
      const cancel = h('button', { type: 'button' }, 'Cancel');
      const form = h('form', { class: 'panel form', testid: 'endpoint-form', hidden: true, novalidate: true, 'aria-label': 'New endpoint' },
        h('h3', null, 'New endpoint'),
        h('div', { class: 'form-row' },
          h('label', { class: 'field', for: 'ef-name' }, h('span', null, 'Name'), name),
          h('label', { class: 'field', for: 'ef-branch' }, h('span', null, 'Branch'), branch),
          h('label', { class: 'field', for: 'ef-replica-of' }, h('span', null, 'Replica of'), replicaOf),
          h('label', { class: 'field', for: 'ef-suspend' }, h('span', null, 'Suspend after (s)'), suspend)),
        h('p', { class: 'dim small' }, 'Suspend after: empty for the cluster\u2019s default, 0 for never.'),
        h('div', { class: 'form-buttons' }, submit, cancel));
      replicaOf.addEventListener('change', () => {
        const ep = endpoints.find(e => e.name === replicaOf.value);
        if (ep && ep.branch) branch.value = ep.branch;
      });
      cancel.addEventListener('click', () => { form.hidden = true; });
      form.addEventListener('submit', async ev => {
        ev.preventDefault();
        const n = name.value.trim();
        if (!n) { showMessage('error', 'New endpoint', ['Give the endpoint a name.']); name.focus(); return; }
        const sa = suspend.value.trim();
        if (sa && !/^\d+$/.test(sa)) { showMessage('error', 'New endpoint', ['Suspend after is a whole number of seconds.']); suspend.focus(); return; }
        const body = { name: n, branch: branch.value || null, replica_of: replicaOf.value || null, suspend_after_secs: sa ? Number(sa) : null };
        const ok = await runAction(submit, 'endpoint-create:' + T, `create endpoint ${n}`,
          () => api('POST', `/api/tenants/${enc(T)}/endpoints`, body));
        if (ok) { form.hidden = true; name.value = ''; suspend.value = ''; replicaOf.value = ''; }
      });
      form.open = () => {
        form.hidden = false;
        const sel = S.selectedBranch.get(T);
        if (sel && branches.some(b => b.name === sel)) branch.value = sel;
        form.scrollIntoView({ block: 'nearest' });
        name.focus();
      };
      form.sync = () => {
        syncOptions(branch, branches.map(b => ({ value: b.name, label: b.name })), 'main');
        syncOptions(replicaOf, [{ value: '', label: '(none: a writer)' }].concat(
          endpoints.map(e => ({ value: e.name, label: `${e.name} (${e.branch})` }))), '');
      };
      return form;
    }

    // --- branch tree rows
    function branchRow(n, act, selected) {
      const b = n.b;
      const name = String(b.name);
      const isCollapsed = collapsed.has(name);
      const tr = h('tr', { testid: 'branch-node', data: { name, depth: n.depth }, class: name === selected ? 'selected' : null });
      const nameCell = h('td', { class: 'tree-name' });
      nameCell.style.setProperty('--depth', String(Math.min(n.depth, 60)));
      if (n.kids) {
        nameCell.append(h('button', { type: 'button', class: 'twisty', data: { act: 'toggle' }, 'aria-expanded': String(!isCollapsed), 'aria-label': (isCollapsed ? 'Expand ' : 'Collapse ') + name }, isCollapsed ? '\u25b8' : '\u25be'));
      } else {
        nameCell.append(h('span', { class: 'twisty-spacer', 'aria-hidden': 'true' }, n.depth ? '\u2514' : '\u2022'));
      }
      nameCell.append(h('span', { class: 'bname', title: name + (b.timeline_id ? '\ntimeline ' + b.timeline_id : '') }, name));
      if (b.divergent) {
        const why = typeof b.divergent === 'string' ? b.divergent : '';
        nameCell.append(' ', h('span', { class: 'badge b-bad', title: why ? 'divergent: ' + why : 'divergent' }, 'divergent'));
      }
      if (isCollapsed && n.desc) nameCell.append(h('span', { class: 'dim small' }, ` +${n.desc}`));
      const waits = Array.isArray(b.gc_waits_for) ? b.gc_waits_for : [];
      const L = b.layers || {};
      const sks = Array.isArray(b.safekeepers) ? b.safekeepers : [];
      tr.append(
        nameCell,
        h('td', { class: 'nowrap' },
          h('span', { class: 'mono', title: 'branch point (ancestor LSN)' }, b.parent == null ? DASH : fmtText(b.ancestor_lsn)), h('br'),
          b.point_time != null
            ? h('span', { class: 'small dim', title: 'branch point time ' + String(b.point_time) }, fmtTime(b.point_time))
            : h('span', { class: 'small dim', title: b.created_at != null ? 'created at ' + String(b.created_at) : null },
              b.created_at != null ? 'created ' + fmtTime(b.created_at, true) : DASH)),
        h('td', null, h('span', { class: 'mono' }, fmtText(b.last_record_lsn)),
          isNum(b.ingest_lag_bytes) && Number(b.ingest_lag_bytes) > 0
            ? h('span', { class: 'wait small dim', title: 'WAL the safekeepers committed that the pageserver has not ingested' }, 'lag ' + fmtBytes(b.ingest_lag_bytes))
            : null),
        h('td', { class: 'num' }, fmtBytes(b.logical_bytes)),
        h('td', { class: 'num' }, fmtDur(b.pitr_window_secs)),
        h('td', null,
          h('span', { class: 'mono', title: 'GC cutoff LSN' }, fmtText(b.gc_cutoff_lsn)),
          waits.length
            ? waits.map(w => h('span', { class: 'wait small', title: `GC waits for ${fmtText(w.what)} at ${fmtText(w.lsn)}` },
              fmtText(w.what), ' ', h('span', { class: 'mono' }, fmtText(w.lsn))))
            : h('span', { class: 'wait small dim' }, 'waits for nothing')),
        h('td', { class: 'small nowrap' },
          h('span', { title: 'local / remote bytes' }, `${fmtBytes(L.local_bytes)} / ${fmtBytes(L.remote_bytes)}`), h('br'),
          h('span', { class: 'dim' }, `L0 ${fmtCount(L.l0)} \u00b7 L1 ${fmtCount(L.l1)} \u00b7 img ${fmtCount(L.image)}`)),
        h('td', { class: 'small nowrap' }, fmtBool(b.attached), b.generation != null ? h('span', { class: 'dim' }, ` gen ${b.generation}`) : null),
        safekeepersCell(sks),
        h('td', { class: 'actions nowrap' }, act ? [
          h('button', { type: 'button', class: 'small-btn', data: { act: 'child' }, testid: 'branch-child', title: `new branch from ${name}` }, 'Branch\u2026'),
          b.parent != null ? h('button', { type: 'button', class: 'small-btn', testid: 'reset-branch', data: { act: 'reset' }, disabled: S.busy.has(`reset:${T}:${name}`), title: `reset ${name} to ${b.parent}` }, 'Reset to parent') : null,
        ] : null));
      return tr;
    }

    // One line when the safekeepers agree (the usual case), else one each.
    function safekeepersCell(sks) {
      if (!sks.length) return h('td', { class: 'small' }, DASH);
      const title = 'flush / commit LSN\n' + sks.map(s => `${fmtText(s.name)}: ${fmtText(s.flush_lsn)} / ${fmtText(s.commit_lsn)}`).join('\n');
      const same = sks.every(s => s.flush_lsn === sks[0].flush_lsn && s.commit_lsn === sks[0].commit_lsn);
      if (same) {
        return h('td', { class: 'small nowrap', title },
          h('span', { class: 'mono' }, `${fmtText(sks[0].flush_lsn)} / ${fmtText(sks[0].commit_lsn)}`),
          h('span', { class: 'dim' }, ` \u00d7${sks.length}`));
      }
      return h('td', { class: 'small nowrap', title }, sks.map((s, i) => [i ? h('br') : null, fmtText(s.name), ' ',
        h('span', { class: 'mono' }, `${fmtText(s.flush_lsn)} / ${fmtText(s.commit_lsn)}`)]));
    }

    const treeCache = new Map();
    function renderTree() {
      const fk = focusKey(treeBody);
      const nodes = buildTree(branches);
      const act = canAct();
      const selected = S.selectedBranch.get(T);
      const items = [];
      for (let i = 0; i < nodes.length; i++) {
        const n = nodes[i];
        const name = String(n.b.name);
        // Everything the row shows depends on: its data and its place.
        const sig = JSON.stringify([n.b, n.depth, !!n.kids, n.desc, act, name === selected, collapsed.has(name),
          S.busy.has(`reset:${T}:${name}`)]);
        items.push({ key: name, sig, build: () => branchRow(n, act, selected) });
        if (n.kids && collapsed.has(name)) i += n.desc;
      }
      if (items.length) patchRows(treeBody, items, treeCache);
      else { treeCache.clear(); treeBody.replaceChildren(h('tr', { class: 'empty' }, h('td', { colspan: BRANCH_COLS.length }, 'No branches.'))); }
      branchCount.textContent = `(${branches.length})`;
      restoreFocus(treeBody, fk);
    }

    // --- endpoints rows
    function endpointRow(e, act) {
      const name = String(e.name);
      const btn = (action, label, title) => h('button', {
        type: 'button', class: 'small-btn' + (S.busy.has(`ep:${name}:${action}`) ? ' busy' : ''), testid: 'endpoint-action',
        data: { action }, title, disabled: S.busy.has(`ep:${name}:${action}`),
      }, label);
      const isReplica = e.role === 'replica';
      const lag = isReplica || isNum(e.replica_lag_bytes) || isNum(e.replica_lag_seconds)
        ? `${fmtBytes(e.replica_lag_bytes)} \u00b7 ${fmtSecs(e.replica_lag_seconds)}` : DASH;
      const host = [e.host, e.site ? `(${e.site})` : null].filter(Boolean).join(' ');
      return h('tr', { testid: 'endpoint-row', data: { name } },
        h('td', { class: 'strong nowrap' }, name,
          act ? h('a', { class: 'sql-link small', href: `#/sql/${enc(T)}/${enc(name)}`, title: `SQL on ${name}` }, 'SQL') : null),
        h('td', { class: 'mono' }, fmtText(e.branch)),
        h('td', { class: 'nowrap' }, fmtText(e.role),
          e.replica_of ? h('span', { class: 'dim small' }, ' of ', h('span', { class: 'mono' }, String(e.replica_of))) : null),
        h('td', null, badge(e.state == null ? '' : String(e.state), stateClass(e.state), 'endpoint-state')),
        h('td', { class: 'small nowrap' }, host || DASH),
        h('td', { class: 'connstr-cell' }, e.connstr
          ? [h('input', { class: 'connstr mono', readOnly: true, value: e.connstr, 'aria-label': `connection string of ${name}`, title: e.connstr }),
            h('button', { type: 'button', class: 'small-btn', testid: 'copy-connstr' }, 'Copy')]
          : DASH),
        h('td', { class: 'num nowrap' }, lag),
        h('td', { class: 'num' }, e.suspend_after_secs === 0 ? 'never' : fmtDur(e.suspend_after_secs)),
        h('td', { class: 'nowrap', title: e.last_cause ? 'last cause: ' + e.last_cause : null }, fmtCount(e.restarts),
          e.last_cause ? h('span', { class: 'dim small cause' }, String(e.last_cause)) : null),
        h('td', { class: 'actions nowrap' }, act ? [
          btn('start', 'Start', `start ${name}`),
          btn('stop', 'Stop', `stop ${name}`),
          btn('suspend', 'Suspend', `suspend ${name}`),
          isReplica ? btn('promote', 'Promote', `promote ${name} to the branch's writer`) : null,
          btn('replica', 'Add replica', `start a replica of ${name}`),
        ] : null));
    }

    function renderEndpoints() {
      const fk = focusKey(epBody);
      const act = canAct();
      const frag = document.createDocumentFragment();
      const sorted = endpoints.slice().sort((a, b) => collator.compare(String(a.name), String(b.name)));
      for (const e of sorted) frag.append(endpointRow(e, act));
      if (!endpoints.length) frag.append(h('tr', { class: 'empty' }, h('td', { colspan: EP_COLS.length }, 'No endpoints.')));
      epBody.replaceChildren(frag);
      epCount.textContent = `(${endpoints.length})`;
      restoreFocus(epBody, fk);
    }

    function renderStorage() {
      const t = tenant || {};
      let local = 0, remote = 0, l0 = 0, l1 = 0, img = 0, logical = 0, divergent = 0;
      const waits = new Map();
      for (const b of branches) {
        const L = b.layers || {};
        local += Number(L.local_bytes) || 0; remote += Number(L.remote_bytes) || 0;
        l0 += Number(L.l0) || 0; l1 += Number(L.l1) || 0; img += Number(L.image) || 0;
        logical += Number(b.logical_bytes) || 0;
        if (b.divergent) divergent++;
        for (const w of (Array.isArray(b.gc_waits_for) ? b.gc_waits_for : [])) {
          const k = fmtText(w.what);
          waits.set(k, (waits.get(k) || 0) + 1);
        }
      }
      const running = endpoints.filter(e => e.state === 'running').length;
      const suspended = endpoints.filter(e => e.state === 'suspended').length;
      const kv = (label, value, cls) => [h('dt', null, label), h('dd', { class: cls || null }, value)];
      storageEl.replaceChildren();
      appendKids(storageEl, [
        kv('Logical size', fmtBytes(t.logical_bytes)),
        kv('WAL held', fmtBytes(t.wal_held_bytes)),
        kv('Local layers', fmtBytes(t.local_layer_bytes != null ? t.local_layer_bytes : local)),
        kv('Remote layers', fmtBytes(t.remote_layer_bytes != null ? t.remote_layer_bytes : remote)),
        kv('Layer files', `L0 ${fmtCount(l0)} \u00b7 L1 ${fmtCount(l1)} \u00b7 image ${fmtCount(img)}`),
        kv('Sum of branches\u2019 logical sizes', fmtBytes(logical)),
        kv('Branches', `${fmtCount(branches.length)}${divergent ? ` (${divergent} divergent)` : ''}`),
        kv('Endpoints', `${fmtCount(endpoints.length)}: ${running} running, ${suspended} suspended`),
        kv('GC waits for', waits.size ? [...waits].map(([k, c]) => `${k} \u00d7${c}`).join(', ') : 'nothing')]);
    }

    function renderHead() {
      const t = tenant || {};
      titleMeta.replaceChildren(
        h('span', { class: 'mono small', title: 'tenant id' }, fmtText(t.tenant_id)),
        badge(fmtText(t.state), stateClass(t.state)),
        h('span', { class: 'small' }, 'PG ', fmtText(t.pg_version)),
        h('span', { class: 'small' }, 'attached: ', fmtBool(t.attached)));
    }

    async function onTreeClick(ev) {
      const btn = ev.target.closest('button');
      const tr = ev.target.closest('tr[data-name]');
      if (!tr) return;
      const name = tr.dataset.name;
      if (!btn) {
        if (ev.target.closest('a, input, select')) return;
        S.selectedBranch.set(T, name);
        for (const row of treeBody.querySelectorAll('tr.selected')) row.classList.remove('selected');
        tr.classList.add('selected');
        return;
      }
      const act = btn.dataset.act;
      if (act === 'toggle') {
        if (collapsed.has(name)) collapsed.delete(name); else collapsed.add(name);
        renderTree();
        return;
      }
      if (act === 'child') { eForm.hidden = true; bForm.open(name); return; }
      if (act === 'reset') {
        const b = branches.find(x => x.name === name);
        const parent = b && b.parent != null ? b.parent : 'its parent';
        const ok = await confirmDialog('Reset branch', `Reset branch \u201c${name}\u201d to its parent \u201c${parent}\u201d? What was written on \u201c${name}\u201d is discarded.`, 'Reset', true);
        if (!ok) return;
        await runAction(btn, `reset:${T}:${name}`, `reset ${name} to ${parent}`,
          () => api('POST', `/api/tenants/${enc(T)}/branches/${enc(name)}/reset`));
      }
    }

    async function onEndpointClick(ev) {
      const btn = ev.target.closest('button');
      if (!btn || !epBody.contains(btn)) return;
      const tr = btn.closest('tr[data-name]');
      if (!tr) return;
      const name = tr.dataset.name;
      if (btn.dataset.testid === 'copy-connstr') { copyConnstr(btn); return; }
      const action = btn.dataset.action;
      if (!action) return;
      if (action === 'replica') {
        const ep = endpoints.find(e => e.name === name);
        if (!ep) return;
        const rn = await promptDialog('Add replica', `Name of the new replica of \u201c${name}\u201d (branch ${ep.branch}):`, suggestName(`${name}-replica`), 'Create replica');
        if (!rn) return;
        await runAction(btn, `ep:${name}:replica`, `create replica ${rn} of ${name}`,
          () => api('POST', `/api/tenants/${enc(T)}/endpoints`, { name: rn, branch: ep.branch, replica_of: name, suspend_after_secs: null }));
        return;
      }
      await runAction(btn, `ep:${name}:${action}`, `${action} ${name}`,
        () => api('POST', `/api/endpoints/${enc(name)}/${action}`));
    }

    function suggestName(base) {
      const names = new Set(endpoints.map(e => e.name));
      if (!names.has(base)) return base;
      for (let i = 2; ; i++) if (!names.has(`${base}-${i}`)) return `${base}-${i}`;
    }

    view.mount = root => {
      titleMeta = h('span', { class: 'head-meta' });
      head.insertBefore(titleMeta, stamp);
      head.prepend(h('a', { href: '#/', class: 'back', title: 'all tenants' }, '\u2190 Tenants'));
      bForm = buildBranchForm();
      eForm = buildEndpointForm();
      const act = canAct();
      const newBranch = h('button', { type: 'button', testid: 'new-branch', class: 'primary' }, 'New branch');
      const newEp = h('button', { type: 'button', testid: 'new-endpoint' }, 'New endpoint');
      newBranch.addEventListener('click', () => { eForm.hidden = true; bForm.open(); });
      newEp.addEventListener('click', () => { bForm.hidden = true; eForm.open(); });
      treeBody = h('tbody');
      epBody = h('tbody');
      branchCount = h('span', { class: 'dim' });
      epCount = h('span', { class: 'dim' });
      storageEl = h('dl', { class: 'kv-grid' });
      appendKids(root, [head, err,
        act ? h('div', { class: 'toolbar' }, newBranch, newEp, h('span', { class: 'dim small' }, 'Click a branch to make it the default parent.')) : null,
        bForm, eForm,
        h('h2', null, 'Branches ', branchCount),
        tableWrap(h('table', { class: 'grid tree' + (act ? '' : ' no-actions'), testid: 'branch-tree' }, thead(BRANCH_COLS), treeBody), 'tall'),
        h('h2', null, 'Endpoints ', epCount),
        tableWrap(h('table', { class: 'grid' + (act ? '' : ' no-actions'), testid: 'endpoints-table' }, thead(EP_COLS), epBody)),
        h('h2', null, 'Storage'),
        h('div', { class: 'panel' }, storageEl)]);
      treeBody.addEventListener('click', onTreeClick);
      epBody.addEventListener('click', onEndpointClick);
    };
    view.refresh = makeLoader(view, () => `/api/tenants/${enc(T)}`, data => {
      tenant = data.tenant || null;
      branches = Array.isArray(data.branches) ? data.branches : [];
      endpoints = Array.isArray(data.endpoints) ? data.endpoints : [];
      renderHead();
      renderTree();
      renderEndpoints();
      renderStorage();
      bForm.sync();
      eForm.sync();
    }, err, stamp);
    return view;
  }

  async function copyConnstr(btn) {
    const input = btn.parentElement.querySelector('input.connstr');
    if (!input) return;
    let ok = false;
    if (navigator.clipboard && window.isSecureContext) {
      try { await navigator.clipboard.writeText(input.value); ok = true; } catch (_) { ok = false; }
    }
    if (!ok) {
      input.focus();
      input.select();
      try { ok = document.execCommand('copy'); } catch (_) { ok = false; }
    }
    const old = 'Copy';
    btn.textContent = ok ? 'Copied' : 'Selected: press Ctrl+C';
    btn.classList.toggle('copied', ok);
    setTimeout(() => { btn.textContent = old; btn.classList.remove('copied'); }, 1500);
  }

  // ------------------------------------------------------------------ view: services
  const HEALTH_CLASS = { ok: 'b-ok', down: 'b-bad', restarting: 'b-warn', unknown: 'b-off' };

  function ServicesView() {
    const view = { name: 'services', title: 'Services' };
    const { head, stamp, err } = viewHead('Services');
    let body, summary;
    const SVC_COLS = ['Service', 'Kind', 'Health', 'State', 'PID', 'Restarts', 'Last exit', 'Ports', 'Details'];

    function svcRow(s) {
      const ports = s.ports && typeof s.ports === 'object' ? Object.entries(s.ports) : [];
      const detail = Array.isArray(s.detail) ? s.detail : [];
      const health = s.health == null ? 'unknown' : String(s.health);
      return h('tr', { testid: 'service-row', data: { name: s.name } },
        h('td', { class: 'mono strong' }, fmtText(s.name)),
        h('td', null, fmtText(s.kind)),
        h('td', null, badge(health, HEALTH_CLASS[health] || 'b-other')),
        h('td', null, fmtText(s.state)),
        h('td', { class: 'num mono' }, fmtText(s.pid)),
        h('td', { class: 'num' }, fmtCount(s.restarts)),
        h('td', { class: 'small' }, fmtText(s.last_exit)),
        h('td', { class: 'small' }, ports.length ? ports.map(([k, v], i) => [i ? ' \u00b7 ' : null, k, ' ', h('span', { class: 'mono' }, fmtText(v))]) : DASH),
        h('td', { class: 'small' }, detail.length ? h('dl', { class: 'kv-inline' }, detail.map(d => {
          const v = fmtText(d.value);
          return [h('dt', null, fmtText(d.label)), h('dd', { class: LSN_RE.test(v) || /^[0-9a-f]{16,}$/i.test(v) ? 'mono' : null }, v)];
        })) : DASH));
    }

    function hostBlock(host, list) {
      const down = list.filter(s => s.health === 'down').length;
      return h('div', { class: 'host panel' },
        h('h3', null, h('span', { class: 'mono' }, host), ' ',
          h('span', { class: 'dim small' }, `${list.length} service${list.length === 1 ? '' : 's'}`),
          down ? [' ', badge(`${down} down`, 'b-bad')] : null),
        list.length
          ? tableWrap(h('table', { class: 'grid svc' }, thead(SVC_COLS), h('tbody', null, list.map(svcRow))))
          : h('p', { class: 'dim small' }, 'No services.'));
    }

    function render(data) {
      const services = Array.isArray(data.services) ? data.services : [];
      const sites = Array.isArray(data.sites) ? data.sites : [];
      const byName = new Map(services.map(s => [s.name, s]));
      const placed = new Set();
      const frag = document.createDocumentFragment();
      const counts = {};
      for (const s of services) { const k = s.health || 'unknown'; counts[k] = (counts[k] || 0) + 1; }
      summary.replaceChildren(h('span', null, `${services.length} services`),
        ...Object.entries(counts).map(([k, c]) => badge(`${c} ${k}`, HEALTH_CLASS[k] || 'b-other')));
      for (const site of sites) {
        const sec = h('section', { class: 'site' }, h('h2', null, 'Site ', h('span', { class: 'mono' }, fmtText(site.site))));
        for (const host of (Array.isArray(site.hosts) ? site.hosts : [])) {
          const list = (Array.isArray(host.services) ? host.services : []).map(n => {
            placed.add(n);
            return byName.get(n) || { name: n, health: 'unknown', state: 'not reported' };
          });
          sec.append(hostBlock(fmtText(host.host), list));
        }
        frag.append(sec);
      }
      const rest = services.filter(s => !placed.has(s.name));
      if (rest.length) {
        const groups = new Map();
        for (const s of rest) {
          const k = `${s.site == null ? '' : s.site}\u0000${s.host == null ? '' : s.host}`;
          if (!groups.has(k)) groups.set(k, []);
          groups.get(k).push(s);
        }
        const sec = h('section', { class: 'site' }, h('h2', null, sites.length ? 'Other services' : 'Services'));
        for (const [k, list] of groups) {
          const [site, host] = k.split('\u0000');
          sec.append(hostBlock((host || 'unknown host') + (site ? ` (${site})` : ''), list));
        }
        frag.append(sec);
      }
      if (!services.length && !sites.length) frag.append(h('p', { class: 'dim' }, 'No services.'));
      body.replaceChildren(frag);
    }

    view.mount = root => {
      summary = h('div', { class: 'summary' });
      body = h('div', { class: 'sites' });
      root.append(h('div', { testid: 'services-view' }, head, err, summary, body));
    };
    view.refresh = makeLoader(view, () => '/api/overview', render, err, stamp);
    return view;
  }

  // ------------------------------------------------------------------ charts
  const CH = 170, ML = 62, MR = 10, MT = 10, MB = 22;

  function unitScale(unit, maxAbs) {
    maxAbs = Math.abs(maxAbs) || 0;
    if (unit === 'bytes' || unit === 'bytes/s') {
      const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
      let i = 0;
      while (maxAbs >= 1024 && i < u.length - 1) { maxAbs /= 1024; i++; }
      return { div: Math.pow(1024, i), suffix: u[i] + (unit === 'bytes/s' ? '/s' : '') };
    }
    if (unit === 's') {
      if (maxAbs > 0 && maxAbs < 0.001) return { div: 1e-6, suffix: 'µs' };
      if (maxAbs < 1) return { div: 1e-3, suffix: 'ms' };
      return { div: 1, suffix: 's' };
    }
    if (unit === 'tx/s' && maxAbs >= 10000) return { div: 1000, suffix: 'k tx/s' };
    return { div: 1, suffix: unit || '' };
  }
  function fmtNum(v) {
    const a = Math.abs(v);
    if (a === 0) return '0';
    if (a >= 100) return v.toFixed(0);
    if (a >= 10) return String(+v.toFixed(1));
    if (a >= 1) return String(+v.toFixed(2));
    return String(+v.toPrecision(2));
  }
  function fmtUnit(v, unit) {
    if (!isNum(v)) return 'no data';
    const sc = unitScale(unit, v);
    return fmtNum(Number(v) / sc.div) + ' ' + sc.suffix;
  }
  function niceStep(raw) {
    if (!(raw > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const f = raw / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * p;
  }
  function niceTicks(lo, hi) {
    if (!(hi > lo)) { hi = lo > 0 ? lo * 2 : lo + 1; lo = Math.min(0, lo); }
    const step = niceStep((hi - lo) / 3);
    const a = Math.floor(lo / step) * step, b = Math.ceil(hi / step) * step;
    const ticks = [];
    for (let t = a; t <= b + step / 2; t += step) ticks.push(+t.toPrecision(12));
    return { lo: a, hi: b, ticks };
  }
  function timeStep(span) {
    for (const s of [300, 600, 900, 1800, 3600, 7200, 10800, 14400, 21600, 43200, 86400]) if (span / s <= 6) return s;
    return 86400 * Math.ceil(span / 86400 / 6);
  }

  function buildChart(series, range, now, CW) {
    const pts = (Array.isArray(series.points) ? series.points : [])
      .filter(p => Array.isArray(p) && isNum(p[0]))
      .map(p => [Number(p[0]), isNum(p[1]) ? Number(p[1]) : null])
      .sort((a, b) => a[0] - b[0]);
    const span = range === 'day' ? 86400 : 3600;
    let t1 = isNum(now) ? Number(now) : (pts.length ? pts[pts.length - 1][0] : Date.now() / 1000);
    let t0 = t1 - span;
    if (pts.length) { t0 = Math.min(t0, pts[0][0]); t1 = Math.max(t1, pts[pts.length - 1][0]); }
    let vmin = 0, vmax = 0, any = false;
    for (const [, v] of pts) if (v !== null) { any = true; if (v > vmax) vmax = v; if (v < vmin) vmin = v; }
    const sc = unitScale(series.unit, Math.max(Math.abs(vmax), Math.abs(vmin)));
    const tk = niceTicks(vmin / sc.div, vmax / sc.div);
    const pw = CW - ML - MR, ph = CH - MT - MB;
    const x = t => ML + (t - t0) / ((t1 - t0) || 1) * pw;
    const y = v => MT + (1 - (v / sc.div - tk.lo) / ((tk.hi - tk.lo) || 1)) * ph;
    const f = n => n.toFixed(1);

    const svg = sv('svg', { viewBox: `0 0 ${CW} ${CH}`, class: 'chart-svg', role: 'img', 'aria-label': `${series.label || series.name}, ${range}` });
    const grid = sv('g', { class: 'grid-lines' });
    for (const t of (any ? tk.ticks : [tk.lo])) {
      const yy = f(y(t * sc.div));
      grid.append(sv('line', { x1: ML, x2: CW - MR, y1: yy, y2: yy }));
      grid.append(sv('text', { x: ML - 5, y: f(y(t * sc.div) + 3.5), 'text-anchor': 'end', class: 'tick' }, `${fmtNum(t)} ${sc.suffix}`));
    }
    const step = timeStep(t1 - t0);
    const off = -new Date(t1 * 1000).getTimezoneOffset() * 60;
    for (let t = Math.ceil((t0 + off) / step) * step - off; t <= t1; t += step) {
      const xx = f(x(t));
      grid.append(sv('line', { x1: xx, x2: xx, y1: CH - MB, y2: CH - MB + 4, class: 'xtick' }));
      grid.append(sv('text', { x: xx, y: CH - 6, 'text-anchor': 'middle', class: 'tick' }, fmtHM(t)));
    }
    grid.append(sv('line', { x1: ML, x2: CW - MR, y1: CH - MB, y2: CH - MB, class: 'axis' }));
    svg.append(grid);

    // line segments, broken at null points
    let line = '', area = '', seg = [];
    const base = f(y(Math.max(tk.lo, Math.min(0, tk.hi)) * sc.div));
    const dots = [];
    const flush = () => {
      if (seg.length === 1) dots.push(seg[0]);
      else if (seg.length > 1) {
        line += 'M' + seg.map(p => p.join(',')).join('L');
        area += `M${seg[0][0]},${base}L` + seg.map(p => p.join(',')).join('L') + `L${seg[seg.length - 1][0]},${base}Z`;
      }
      seg = [];
    };
    for (const [t, v] of pts) {
      if (v === null) flush(); else seg.push([f(x(t)), f(y(v))]);
    }
    flush();
    if (area) svg.append(sv('path', { d: area, class: 'area' }));
    if (line) svg.append(sv('path', { d: line, class: 'line' }));
    for (const [cx, cy] of dots) svg.append(sv('circle', { cx, cy, r: 1.8, class: 'dot' }));
    if (!any) svg.append(sv('text', { x: ML + pw / 2, y: MT + ph / 2, 'text-anchor': 'middle', class: 'nodata' }, 'no data'));
    const hoverLine = sv('line', { class: 'hover-line', x1: 0, x2: 0, y1: MT, y2: CH - MB, visibility: 'hidden' });
    const hoverDot = sv('circle', { class: 'hover-dot', r: 3, cx: 0, cy: 0, visibility: 'hidden' });
    svg.append(hoverLine, hoverDot);
    let last = null;
    for (let i = pts.length - 1; i >= 0; i--) if (pts[i][1] !== null) { last = pts[i]; break; }
    return { svg, meta: { pts, t0, t1, x, y, pw, cw: CW, unit: series.unit, hoverLine, hoverDot, last } };
  }

  // ------------------------------------------------------------------ view: graphs
  function GraphsView(r) {
    const view = { name: 'graphs', title: 'Graphs' };
    if (r.tenant) S.graphs.tenant = r.tenant;
    // a session limited to some tenants sees graphs of one of them, not of all
    const limited = S.session && Array.isArray(S.session.tenants) ? S.session.tenants.map(String).sort(collator.compare) : null;
    if (limited && !limited.includes(S.graphs.tenant)) S.graphs.tenant = limited[0] || '';
    const { head, stamp, err } = viewHead('Graphs');
    let gridEl, tenantSel, hourBtn, dayBtn, resizeObs = null;
    const metas = new Map();

    function url() {
      const q = new URLSearchParams({ range: S.graphs.range });
      if (S.graphs.tenant) q.set('tenant', S.graphs.tenant);
      return '/api/graphs?' + q.toString();
    }
    function setRangeButtons() {
      hourBtn.setAttribute('aria-pressed', String(S.graphs.range === 'hour'));
      dayBtn.setAttribute('aria-pressed', String(S.graphs.range === 'day'));
    }
    let lastData = null, lastWidth = 0;
    function render(data) {
      lastData = data;
      const range = data.range || S.graphs.range;
      const series = Array.isArray(data.series) ? data.series : [];
      metas.clear();
      // figures first, to measure the width the charts get; then the SVGs
      // at that pixel width (text keeps its size at any window width)
      const figs = series.map(s => {
        const readout = h('span', { class: 'readout' });
        const holder = h('div', { class: 'chart-holder' });
        const fig = h('figure', { class: 'chart panel', testid: 'graph', data: { name: s.name } },
          h('figcaption', null, h('span', { class: 'chart-title' }, fmtText(s.label || s.name)), readout), holder);
        return { s, fig, readout, holder };
      });
      gridEl.replaceChildren(...figs.map(f => f.fig));
      if (!series.length) gridEl.append(h('p', { class: 'dim' }, 'No series.'));
      lastWidth = gridEl.clientWidth;
      const width = figs.length ? Math.max(240, Math.round(figs[0].holder.clientWidth)) : 400;
      for (const { s, fig, readout, holder } of figs) {
        const { svg, meta } = buildChart(s, range, data.now, width);
        readout.textContent = meta.last ? fmtUnit(meta.last[1], s.unit) : 'no data';
        meta.readout = readout;
        meta.lastText = readout.textContent;
        holder.append(svg);
        metas.set(fig, meta);
      }
      // keep the readout under a mouse that rests on a chart across refreshes
      if (lastPt) hover({ target: document.elementFromPoint(lastPt.clientX, lastPt.clientY), clientX: lastPt.clientX, clientY: lastPt.clientY });
    }
    let lastPt = null;
    function hover(ev) {
      lastPt = { clientX: ev.clientX, clientY: ev.clientY };
      const fig = ev.target && ev.target.closest ? ev.target.closest('figure.chart') : null;
      for (const [f, m] of metas) if (f !== fig) unhover(m);
      if (!fig) return;
      const m = metas.get(fig);
      if (!m || !m.pts.length) return;
      const svg = fig.querySelector('svg');
      const rect = svg.getBoundingClientRect();
      const vx = (ev.clientX - rect.left) * m.cw / rect.width;
      const t = m.t0 + (vx - ML) / m.pw * (m.t1 - m.t0);
      let lo = 0, hi = m.pts.length - 1;
      while (lo < hi) { const mid = (lo + hi) >> 1; if (m.pts[mid][0] < t) lo = mid + 1; else hi = mid; }
      if (lo > 0 && Math.abs(m.pts[lo - 1][0] - t) < Math.abs(m.pts[lo][0] - t)) lo--;
      const [pt, pv] = m.pts[lo];
      const px = m.x(pt).toFixed(1);
      m.hoverLine.setAttribute('x1', px); m.hoverLine.setAttribute('x2', px);
      m.hoverLine.setAttribute('visibility', 'visible');
      if (pv !== null) {
        m.hoverDot.setAttribute('cx', px); m.hoverDot.setAttribute('cy', m.y(pv).toFixed(1));
        m.hoverDot.setAttribute('visibility', 'visible');
      } else m.hoverDot.setAttribute('visibility', 'hidden');
      m.readout.textContent = `${fmtHM(pt)}  ${fmtUnit(pv, m.unit)}`;
      m.readout.classList.add('hovering');
    }
    function unhover(m) {
      m.hoverLine.setAttribute('visibility', 'hidden');
      m.hoverDot.setAttribute('visibility', 'hidden');
      if (m.readout.classList.contains('hovering')) { m.readout.textContent = m.lastText; m.readout.classList.remove('hovering'); }
    }
    async function loadTenants() {
      try {
        const ov = await api('GET', '/api/overview');
        if (S.view !== view) return;
        const names = (Array.isArray(ov.tenants) ? ov.tenants : []).map(t => String(t.name)).sort(collator.compare);
        syncOptions(tenantSel, (limited ? [] : [{ value: '', label: 'all tenants' }]).concat(names.map(n => ({ value: n, label: n }))), S.graphs.tenant);
        if (names.includes(S.graphs.tenant)) tenantSel.value = S.graphs.tenant;
        else if (!limited) tenantSel.value = '';
        if (tenantSel.value !== S.graphs.tenant) { S.graphs.tenant = tenantSel.value; view.refresh(true); }
      } catch (_) { /* the select keeps "all tenants" */ }
    }

    view.mount = root => {
      hourBtn = h('button', { type: 'button', testid: 'range-hour', class: 'seg' }, 'Last hour');
      dayBtn = h('button', { type: 'button', testid: 'range-day', class: 'seg' }, 'Last day');
      tenantSel = h('select', { id: 'graph-tenant', 'aria-label': 'Tenant' }, limited ? null : h('option', { value: '' }, 'all tenants'));
      if (S.graphs.tenant) tenantSel.append(h('option', { value: S.graphs.tenant }, S.graphs.tenant));
      tenantSel.value = S.graphs.tenant;
      gridEl = h('div', { class: 'graphs-grid' });
      root.append(h('div', { testid: 'graphs-view' }, head, err,
        h('div', { class: 'toolbar' },
          h('div', { class: 'segmented', role: 'group', 'aria-label': 'Range' }, hourBtn, dayBtn),
          h('label', { class: 'inline', for: 'graph-tenant' }, 'Tenant ', tenantSel)),
        gridEl));
      setRangeButtons();
      const setRange = rg => { S.graphs.range = rg; setRangeButtons(); view.refresh(true); };
      hourBtn.addEventListener('click', () => setRange('hour'));
      dayBtn.addEventListener('click', () => setRange('day'));
      tenantSel.addEventListener('change', () => { S.graphs.tenant = tenantSel.value; view.refresh(true); });
      gridEl.addEventListener('mousemove', hover);
      if (typeof ResizeObserver === 'function') {
        let pending = false;
        resizeObs = new ResizeObserver(() => {
          if (pending || !lastData) return;
          pending = true;
          requestAnimationFrame(() => {
            pending = false;
            if (S.view === view && lastData && gridEl.clientWidth !== lastWidth) render(lastData);
          });
        });
        resizeObs.observe(gridEl);
      }
      gridEl.addEventListener('mouseleave', () => { lastPt = null; for (const m of metas.values()) unhover(m); });
      loadTenants();
    };
    view.unmount = () => { if (resizeObs) resizeObs.disconnect(); };
    view.refresh = makeLoader(view, url, render, err, stamp);
    return view;
  }

  // ------------------------------------------------------------------ view: SQL
  const PAGE = 50;

  function SqlView(r) {
    const view = { name: 'sql', title: 'SQL' };
    if (r.tenant) S.sql.tenant = r.tenant;
    if (r.endpoint) S.sql.endpoint = r.endpoint;
    let tenantSel, epSel, text, timeout, runBtn, errBox, out, info;
    let results = [];
    let epSeq = 0;

    async function loadTenants() {
      try {
        const ov = await api('GET', '/api/overview');
        if (S.view !== view) return;
        const names = (Array.isArray(ov.tenants) ? ov.tenants : []).map(t => String(t.name)).sort(collator.compare);
        syncOptions(tenantSel, [{ value: '', label: 'choose a tenant' }].concat(names.map(n => ({ value: n, label: n }))));
        if (names.includes(S.sql.tenant)) tenantSel.value = S.sql.tenant;
        else if (names.length === 1) tenantSel.value = names[0];
        else tenantSel.value = '';
        await loadEndpoints();
      } catch (e) {
        if (e.status !== 401 && S.view === view) showError('Could not load tenants: ' + e.message);
      }
    }
    async function loadEndpoints() {
      const t = tenantSel.value;
      S.sql.tenant = t;
      const my = ++epSeq;
      if (!t) { syncOptions(epSel, [{ value: '', label: 'choose a tenant first' }]); return; }
      syncOptions(epSel, [{ value: '', label: 'loading\u2026' }]);
      try {
        const d = await api('GET', `/api/tenants/${enc(t)}`);
        if (S.view !== view || my !== epSeq) return;
        const eps = (Array.isArray(d.endpoints) ? d.endpoints : []).slice().sort((a, b) => collator.compare(String(a.name), String(b.name)));
        syncOptions(epSel, eps.length
          ? eps.map(e => ({ value: String(e.name), label: `${e.name} (${e.role || '?'}, ${e.state || '?'})` }))
          : [{ value: '', label: 'no endpoints' }]);
        const names = eps.map(e => String(e.name));
        if (names.includes(S.sql.endpoint)) epSel.value = S.sql.endpoint;
        else {
          const running = eps.find(e => e.state === 'running');
          epSel.value = running ? String(running.name) : (names[0] || '');
        }
        S.sql.endpoint = epSel.value;
      } catch (e) {
        if (e.status !== 401 && S.view === view && my === epSeq) {
          syncOptions(epSel, [{ value: '', label: 'could not load endpoints' }]);
          showError('Could not load endpoints: ' + e.message);
        }
      }
    }

    function showError(msg) { errBox.textContent = msg; errBox.hidden = false; }

    function renderPage(block) {
      const res = results[block.dataset.idx];
      const rows = Array.isArray(res.rows) ? res.rows : [];
      const ncols = Array.isArray(res.columns) ? res.columns.length : 0;
      const maxPage = Math.max(0, Math.ceil(rows.length / PAGE) - 1);
      res.page = Math.min(Math.max(0, res.page || 0), maxPage);
      const start = res.page * PAGE;
      const end = Math.min(rows.length, start + PAGE);
      const frag = document.createDocumentFragment();
      for (let i = start; i < end; i++) {
        const row = Array.isArray(rows[i]) ? rows[i] : [];
        const tr = h('tr');
        for (let c = 0; c < ncols; c++) {
          const v = row[c];
          if (v === null || v === undefined) tr.append(h('td', null, h('span', { class: 'null' }, 'NULL')));
          else {
            const s = typeof v === 'object' ? JSON.stringify(v) : String(v);
            tr.append(h('td', { title: s.length > 60 ? s.slice(0, 2000) : null }, s));
          }
        }
        frag.append(tr);
      }
      block.querySelector('tbody').replaceChildren(frag);
      block.querySelector('[data-testid="sql-page-info"]').textContent =
        rows.length ? `rows ${start + 1}\u2013${end} of ${rows.length}` : 'no rows';
      block.querySelector('[data-testid="sql-prev"]').disabled = res.page === 0;
      block.querySelector('[data-testid="sql-next"]').disabled = res.page >= maxPage;
    }

    function renderResults(ans) {
      results = Array.isArray(ans.results) ? ans.results : [];
      const frag = document.createDocumentFragment();
      results.forEach((res, idx) => {
        res.page = 0;
        const cols = Array.isArray(res.columns) ? res.columns : [];
        const rows = Array.isArray(res.rows) ? res.rows : [];
        const block = h('div', { class: 'sql-result panel', testid: 'sql-result', data: { idx } },
          h('div', { class: 'result-head' },
            h('strong', { class: 'mono' }, fmtText(res.command)),
            h('span', { class: 'dim' }, `${fmtCount(res.row_count)} row${res.row_count === 1 ? '' : 's'}`),
            res.truncated ? h('span', { class: 'note' }, `truncated: the console sent the first ${fmtCount(rows.length)} rows`) : null));
        if (cols.length) {
          block.append(
            tableWrap(h('table', { class: 'grid sql-table' }, thead(cols.map(String)), h('tbody'))),
            h('div', { class: 'pager' },
              h('button', { type: 'button', class: 'small-btn', testid: 'sql-prev', 'aria-label': 'previous page' }, '\u2039 Prev'),
              h('span', { class: 'small', testid: 'sql-page-info', 'aria-live': 'polite' }),
              h('button', { type: 'button', class: 'small-btn', testid: 'sql-next', 'aria-label': 'next page' }, 'Next \u203a')));
        }
        frag.append(block);
      });
      out.replaceChildren(frag);
      for (const block of out.querySelectorAll('.sql-result')) if (block.querySelector('tbody')) renderPage(block);
    }

    async function run() {
      if (runBtn.disabled) return;
      errBox.hidden = true;
      const endpoint = epSel.value;
      const sql = text.value;
      if (!endpoint) { showError('Choose an endpoint.'); return; }
      if (!sql.trim()) { showError('Write a statement.'); text.focus(); return; }
      const tv = timeout.value.trim();
      if (tv && !/^\d+$/.test(tv)) { showError('The timeout is a whole number of seconds.'); timeout.focus(); return; }
      S.sql.endpoint = endpoint;
      setBusy(runBtn, true);
      results = [];
      out.replaceChildren();
      info.textContent = 'running\u2026';
      const t0 = performance.now();
      try {
        const ans = await api('POST', '/api/sql', { endpoint, sql, timeout_secs: tv ? Number(tv) : null });
        if (S.view !== view) return;
        const ms = isNum(ans.elapsed_ms) ? Number(ans.elapsed_ms) : Math.round(performance.now() - t0);
        const n = Array.isArray(ans.results) ? ans.results.length : 0;
        info.replaceChildren(h('span', null, `${n} result${n === 1 ? '' : 's'} in ${fmtCount(ms)} ms on `), h('span', { class: 'mono' }, endpoint));
        const notices = Array.isArray(ans.notices) ? ans.notices : [];
        renderResults(ans);
        if (notices.length) out.prepend(h('pre', { class: 'notices' }, notices.map(fmtText).join('\n')));
      } catch (e) {
        if (e.status === 401 || S.view !== view) return;
        info.textContent = `failed after ${Math.round(performance.now() - t0)} ms`;
        const d = e.data || {};
        const extra = [d.sqlstate ? `SQLSTATE ${d.sqlstate}` : null, isNum(d.position) ? `at character ${d.position}` : null].filter(Boolean);
        showError(e.message + (extra.length ? `\n(${extra.join(', ')})` : ''));
      } finally {
        setBusy(runBtn, false);
      }
    }

    view.mount = root => {
      if (!canAct()) {
        root.append(h('div', { class: 'viewhead' }, h('h1', null, 'SQL')), h('p', { class: 'errbox' }, 'A viewer may not run SQL.'));
        return;
      }
      tenantSel = h('select', { id: 'sql-tenant', testid: 'sql-tenant' }, h('option', { value: '' }, 'loading\u2026'));
      epSel = h('select', { id: 'sql-endpoint', testid: 'sql-endpoint' }, h('option', { value: '' }, 'choose a tenant first'));
      timeout = h('input', { id: 'sql-timeout', testid: 'sql-timeout', type: 'number', min: '1', step: '1', value: S.sql.timeout, class: 'narrow' });
      runBtn = h('button', { type: 'button', class: 'primary', testid: 'sql-run', title: 'Ctrl+Enter / \u2318+Enter' }, 'Run');
      text = h('textarea', { id: 'sql-text', testid: 'sql-text', class: 'mono sql-text', rows: '8', spellcheck: 'false', autocapitalize: 'off', 'aria-label': 'SQL' });
      text.value = S.sql.text;
      errBox = h('div', { class: 'errbox', testid: 'sql-error', role: 'alert', hidden: true });
      info = h('span', { class: 'dim small' });
      out = h('div', { class: 'sql-results' });
      root.append(
        h('div', { class: 'viewhead' }, h('h1', null, 'SQL')),
        h('div', { class: 'toolbar sql-bar' },
          h('label', { class: 'inline', for: 'sql-tenant' }, 'Tenant ', tenantSel),
          h('label', { class: 'inline', for: 'sql-endpoint' }, 'Endpoint ', epSel),
          h('label', { class: 'inline', for: 'sql-timeout' }, 'Timeout (s) ', timeout)),
        text,
        h('div', { class: 'toolbar' }, runBtn, h('span', { class: 'dim small' }, 'Ctrl+Enter runs'), info),
        errBox, out);
      tenantSel.addEventListener('change', () => { S.sql.endpoint = ''; loadEndpoints(); });
      epSel.addEventListener('change', () => { S.sql.endpoint = epSel.value; });
      timeout.addEventListener('input', () => { S.sql.timeout = timeout.value; });
      text.addEventListener('input', () => { S.sql.text = text.value; });
      text.addEventListener('keydown', ev => {
        if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); run(); }
      });
      runBtn.addEventListener('click', run);
      out.addEventListener('click', ev => {
        const btn = ev.target.closest('button');
        if (!btn) return;
        const block = btn.closest('.sql-result');
        if (!block) return;
        const res = results[block.dataset.idx];
        if (btn.dataset.testid === 'sql-next') res.page++;
        else if (btn.dataset.testid === 'sql-prev') res.page--;
        else return;
        renderPage(block);
      });
      loadTenants();
      text.focus();
    };
    view.refresh = () => {};
    return view;
  }

  // ------------------------------------------------------------------ view: audit
  const AUDIT_ORDER = ['ts', 'at', 'time', 'user', 'scope', 'action', 'outcome', 'reason', 'detail', 'interface', 'service', 'tenant_id', 'timeline_id', 'jti'];
  const OUTCOME_CLASS = { allowed: 'b-ok', done: 'b-ok', refused: 'b-bad', failed: 'b-bad' };

  function AuditView() {
    const view = { name: 'audit', title: 'Audit' };
    const { head, stamp, err } = viewHead('Audit log');
    let wrap;
    function render(data) {
      const entries = Array.isArray(data.entries) ? data.entries : [];
      const objs = entries.every(e => e && typeof e === 'object' && !Array.isArray(e));
      let cols;
      if (objs) {
        const seen = new Set();
        cols = [];
        for (const e of entries) for (const k of Object.keys(e)) if (!seen.has(k)) { seen.add(k); cols.push(k); }
        const rank = k => { const i = AUDIT_ORDER.indexOf(k); return i < 0 ? AUDIT_ORDER.length : i; };
        cols = cols.map((k, i) => [k, i]).sort((a, b) => rank(a[0]) - rank(b[0]) || a[1] - b[1]).map(x => x[0]);
      } else cols = ['entry'];
      const tbody = h('tbody');
      const frag = document.createDocumentFragment();
      for (const e of entries) {
        const tr = h('tr');
        if (objs) {
          for (const c of cols) {
            const v = e[c];
            const timeish = /(^|_)(at|time|ts|when)$/.test(c) && (typeof v === 'number' || typeof v === 'string');
            if (c === 'outcome' && typeof v === 'string') {
              tr.append(h('td', null, badge(v, OUTCOME_CLASS[v] || 'b-other')));
            } else {
              tr.append(h('td', { class: timeish ? 'nowrap' : /_id$|^jti$/.test(c) ? 'mono small' : null, title: timeish ? String(v) : null },
                timeish ? fmtTime(v) : fmtText(v)));
            }
          }
        } else tr.append(h('td', { class: 'mono small' }, fmtText(e)));
        frag.append(tr);
      }
      if (!entries.length) frag.append(h('tr', { class: 'empty' }, h('td', { colspan: cols.length }, 'The audit log is empty.')));
      tbody.append(frag);
      wrap.replaceChildren(h('table', { class: 'grid', testid: 'audit-table' }, thead(cols), tbody));
    }
    view.mount = root => {
      wrap = tableWrap(h('table', { class: 'grid', testid: 'audit-table' }), 'tall');
      if (!isAdmin()) {
        root.append(head, h('p', { class: 'errbox' }, 'The audit log is for the cluster\u2019s operator (a management token).'));
        view.refresh = () => {};
        return;
      }
      root.append(head, err, wrap);
    };
    view.refresh = makeLoader(view, () => '/api/audit', render, err, stamp);
    return view;
  }

  function NotFoundView() {
    return {
      name: 'notfound', title: 'Not found',
      mount: root => root.append(h('div', { class: 'viewhead' }, h('h1', null, 'Not found')),
        h('p', null, 'No such page. ', h('a', { href: '#/' }, 'Back to the tenants.'))),
      refresh: () => {},
    };
  }

  const VIEWS = { tenants: TenantsView, tenant: TenantView, services: ServicesView, graphs: GraphsView, sql: SqlView, audit: AuditView };

  // ------------------------------------------------------------------ start
  function init() {
    initDialog();
    initLogin();
    $('#message').addEventListener('click', ev => {
      if (ev.target.closest('[data-act="dismiss"]')) clearMessage();
    });
    window.addEventListener('hashchange', route);
    document.addEventListener('visibilitychange', () => { if (document.visibilityState === 'visible') poll(); });
    setInterval(poll, POLL_MS);
    checkSession();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init);
  else init();
})();
