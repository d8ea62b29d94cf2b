// Shared helpers for the IPv4 Games pages. Plain script, no modules, no dependencies.
// Data from the server is only ever put into the page with textContent or setAttribute.
'use strict';

var IG = (function () {
  // The server's name rule: 1–40 ASCII letters, digits and @/:.^+!-_*
  var NAME_RE = /^[A-Za-z0-9@\/:.^+!\-_*]{1,40}$/;
  var NAME_HELP = 'A name is 1–40 characters: letters A–Z a–z, digits 0–9 and @ / : . ^ + ! - _ *';

  function validName(name) {
    return NAME_RE.test(name);
  }

  // Why a name is not valid, in words; '' when it is.
  function nameProblem(name) {
    if (name.length === 0) return 'Please enter a name. ' + NAME_HELP + '.';
    if (name.length > 40) return 'That name is ' + name.length + ' characters long; the limit is 40.';
    var bad = [];
    for (var i = 0; i < name.length; i++) {
      var c = name.charAt(i);
      if (!/[A-Za-z0-9@\/:.^+!\-_*]/.test(c) && bad.indexOf(c) < 0) bad.push(c);
    }
    if (bad.length) {
      var shown = bad.slice(0, 5).map(function (c) {
        return c === ' ' ? 'space' : '“' + c + '”';
      });
      return 'Not allowed: ' + shown.join(', ') + '. ' + NAME_HELP + '.';
    }
    return '';
  }

  // FNV-1a over the name's characters, then mixed: a stable 32-bit hash, so a name keeps its colour.
  function hash(name) {
    var h = 0x811c9dc5;
    for (var i = 0; i < name.length; i++) {
      h ^= name.charCodeAt(i);
      h = Math.imul(h, 0x01000193) >>> 0;
    }
    // murmur3's finaliser: similar names still land on far-apart colours.
    h ^= h >>> 16; h = Math.imul(h, 0x85ebca6b);
    h ^= h >>> 13; h = Math.imul(h, 0xc2b2ae35);
    h ^= h >>> 16;
    return h >>> 0;
  }

  function hslToRgb(h, s, l) {
    s /= 100; l /= 100;
    var k = function (n) { return (n + h / 30) % 12; };
    var a = s * Math.min(l, 1 - l);
    var f = function (n) {
      return l - a * Math.max(-1, Math.min(k(n) - 3, Math.min(9 - k(n), 1)));
    };
    return [f(0), f(8), f(4)];
  }

  var colorCache = Object.create(null);
  // {bg, fg}: background from the name's hash, foreground black or white, whichever reads better.
  function colorFor(name) {
    var c = colorCache[name];
    if (c) return c;
    var h = hash(name);
    var hue = h % 360;
    var sat = 55 + ((h >>> 9) % 30);
    var light = 35 + ((h >>> 17) % 30);
    var rgb = hslToRgb(hue, sat, light);
    var lin = rgb.map(function (v) {
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    });
    var lum = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2];
    c = {
      bg: 'hsl(' + hue + ' ' + sat + '% ' + light + '%)',
      fg: lum > 0.22 ? '#111' : '#fff'
    };
    colorCache[name] = c;
    return c;
  }

  function userHref(name) {
    return 'user.html?name=' + encodeURIComponent(name);
  }

  function HttpError(status, text) {
    this.status = status;
    this.message = text || ('HTTP ' + status);
  }

  // fetch + JSON; rejects with HttpError on a non-2xx answer, TypeError on a network failure.
  function fetchJSON(url) {
    return fetch(url, { headers: { Accept: 'application/json' }, cache: 'no-store' }).then(function (r) {
      var date = Date.parse(r.headers.get('Date') || '');
      if (!isNaN(date)) noteServerTime(date / 1000);
      if (!r.ok) {
        return r.text().then(function (t) { throw new HttpError(r.status, t.trim()); });
      }
      return r.json();
    });
  }

  function describeError(e) {
    if (e instanceof HttpError) return 'the server answered ' + e.status + (e.message ? ' (' + e.message + ')' : '');
    return 'the server could not be reached';
  }

  // Small DOM builder: el('a', {href: x, className: 'y'}, 'text', child).
  function el(tag, props) {
    var n = document.createElement(tag);
    if (props) {
      for (var k in props) {
        if (k === 'className') n.className = props[k];
        else if (k === 'text') n.textContent = props[k];
        else n.setAttribute(k, props[k]);
      }
    }
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c == null) continue;
      n.appendChild(typeof c === 'string' ? document.createTextNode(c) : c);
    }
    return n;
  }

  // Server time minus local time. Every server time we see (a Date header, a "generated"
  // field) is at most the server's clock now: snapshots are only re-published when their
  // content changes, so "generated" may be old. The largest estimate is the best one.
  var skew = null;
  function noteServerTime(t) {
    if (typeof t !== 'number') return;
    var est = t - Date.now() / 1000;
    if (skew === null || est > skew) skew = est;
  }
  function serverNow() {
    return Date.now() / 1000 + (skew || 0);
  }

  function ago(t) {
    var d = Math.max(0, Math.round(serverNow() - t));
    if (d < 5) return 'just now';
    if (d < 60) return d + ' s ago';
    if (d < 3600) return Math.floor(d / 60) + ' min ago';
    if (d < 86400) return Math.floor(d / 3600) + ' h ago';
    return new Date(t * 1000).toLocaleDateString();
  }

  function timeEl(t) {
    var iso = new Date(t * 1000).toISOString();
    var n = el('time', { datetime: iso, title: new Date(t * 1000).toLocaleString(), 'data-t': String(t) });
    n.textContent = ago(t);
    return n;
  }

  // Refreshes every <time data-t> under root.
  function refreshTimes(root) {
    var ts = root.querySelectorAll('time[data-t]');
    for (var i = 0; i < ts.length; i++) {
      var txt = ago(Number(ts[i].getAttribute('data-t')));
      if (ts[i].textContent !== txt) ts[i].textContent = txt;
    }
  }

  // The 16×16 map of /8 blocks: 256 <a> elements, created once and updated in place.
  function buildMap(container) {
    var cells = [];
    var frag = document.createDocumentFragment();
    for (var b = 0; b < 256; b++) {
      var a = el('a', { className: 'cell', 'data-block': String(b) });
      a.appendChild(el('span', { className: 'num', 'aria-hidden': 'true', text: String(b) }));
      cells.push(a);
      frag.appendChild(a);
    }
    container.replaceChildren(frag);
    return cells;
  }

  // Sets a cell's state, touching the DOM only where something changed.
  function setCell(cell, state) {
    var key = JSON.stringify(state);
    if (cell._key === key) return;
    cell._key = key;
    if (state.href) cell.setAttribute('href', state.href); else cell.removeAttribute('href');
    cell.setAttribute('title', state.title);
    cell.setAttribute('aria-label', state.title.replace(/\n/g, '; '));
    if (state.bg) {
      cell.style.background = state.bg;
      cell.style.color = state.fg;
      cell.classList.add('held');
    } else {
      cell.style.background = '';
      cell.style.color = '';
      cell.classList.remove('held');
    }
    if (state.name) cell.setAttribute('data-name', state.name); else cell.removeAttribute('data-name');
    cell.classList.toggle('mark', !!state.mark);
    var num = cell.firstChild;
    var label = state.label != null ? String(state.label) : cell.getAttribute('data-block');
    if (num.textContent !== label) num.textContent = label;
  }

  // Calls fn (which returns a promise) every ms, never overlapping; paused while the tab is hidden.
  // Returns a function that runs it now.
  function poll(fn, ms) {
    var timer = null;
    var running = false;
    var again = false;
    function tick() {
      clearTimeout(timer);
      timer = null;
      if (running) { again = true; return; }
      if (document.hidden) return;
      running = true;
      Promise.resolve().then(fn).catch(function () {}).then(function () {
        running = false;
        if (again) { again = false; tick(); return; }
        if (!document.hidden) timer = setTimeout(tick, ms);
      });
    }
    document.addEventListener('visibilitychange', function () {
      if (!document.hidden && !running && timer === null) tick();
    });
    tick();
    return tick;
  }

  return {
    NAME_RE: NAME_RE,
    NAME_HELP: NAME_HELP,
    validName: validName,
    nameProblem: nameProblem,
    colorFor: colorFor,
    userHref: userHref,
    HttpError: HttpError,
    fetchJSON: fetchJSON,
    describeError: describeError,
    el: el,
    noteServerTime: noteServerTime,
    ago: ago,
    timeEl: timeEl,
    refreshTimes: refreshTimes,
    buildMap: buildMap,
    setCell: setCell,
    poll: poll
  };
})();
