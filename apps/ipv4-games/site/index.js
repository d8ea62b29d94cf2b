// The board: your address, the claim form, the /8 map, the leaderboard and the live feed.
'use strict';

(function () {
  var $ = function (id) { return document.getElementById(id); };
  var el = IG.el;
  var WINDOWS = ['all', 'month', 'week', 'day', 'hour'];
  var WINDOW_WORDS = { all: 'all time', month: 'the last month', week: 'the last week', day: 'the last day', hour: 'the last hour' };

  var myBlock = -1;
  var cells = IG.buildMap($('map'));

  // ---- your address -------------------------------------------------------------------------
  fetch('/ip', { cache: 'no-store' }).then(function (r) {
    return r.text().then(function (t) {
      t = t.trim();
      if (r.ok && /^\d{1,3}(\.\d{1,3}){3}$/.test(t)) {
        $('ip').textContent = t;
        myBlock = Number(t.split('.')[0]);
        markMine();
      } else if (r.status === 400) {
        $('ip').textContent = 'an IPv6 address';
        showMsg('The game is IPv4 only: you are connected over IPv6, so there is nothing to claim from here.', 'err');
        $('claim-btn').disabled = true;
      } else {
        $('ip').textContent = 'an unknown address';
      }
    });
  }).catch(function () {
    $('ip').textContent = 'an unknown address (the server could not be reached)';
  });

  function markMine() {
    for (var b = 0; b < 256; b++) cells[b].classList.toggle('mine', b === myBlock);
  }

  // ---- the claim form -----------------------------------------------------------------------
  var form = $('claim-form');
  var input = $('name');
  var btn = $('claim-btn');
  try {
    var saved = localStorage.getItem('ipv4games.name');
    if (saved && IG.validName(saved) && !input.value) input.value = saved;
  } catch (e) { /* storage may be disabled */ }

  function showMsg(text, kind, link) {
    var m = $('claim-msg');
    m.className = 'msg' + (kind ? ' ' + kind : '');
    m.textContent = text;
    if (link) {
      m.appendChild(document.createTextNode(' '));
      m.appendChild(link);
    }
  }

  input.addEventListener('input', function () {
    if (input.getAttribute('aria-invalid') === 'true' && !IG.nameProblem(input.value)) {
      input.removeAttribute('aria-invalid');
      showMsg('');
    }
  });

  form.addEventListener('submit', function (ev) {
    ev.preventDefault();
    var name = input.value.trim();
    var problem = IG.nameProblem(name);
    if (problem) {
      input.setAttribute('aria-invalid', 'true');
      showMsg(problem, 'err');
      input.focus();
      return;
    }
    input.removeAttribute('aria-invalid');
    input.value = name;
    btn.disabled = true;
    showMsg('Claiming…', 'busy');
    fetch('/claim?name=' + encodeURIComponent(name), { headers: { Accept: 'text/plain' }, cache: 'no-store' })
      .then(function (r) {
        return r.text().then(function (t) {
          t = t.trim();
          if (r.ok) {
            try { localStorage.setItem('ipv4games.name', name); } catch (e) { /* ignore */ }
            showMsg(t || ('Claimed for ' + name + '.'), 'ok',
              el('a', { href: IG.userHref(name), text: 'See ' + name + '’s page' }));
            refreshFeed();
          } else if (r.status === 429) {
            showMsg('Too many claims from your address; wait a little and try again.' + (t ? ' (' + t + ')' : ''), 'err');
          } else if (r.status === 503) {
            var after = r.headers.get('Retry-After');
            showMsg('The server is busy' + (after ? '; try again in ' + after + ' s' : '; try again shortly') + '.', 'err');
          } else {
            showMsg('The claim failed: ' + r.status + (t ? ' — ' + t : '') + '.', 'err');
          }
        });
      })
      .catch(function () {
        showMsg('The claim failed: the server could not be reached.', 'err');
      })
      .then(function () { btn.disabled = false; });
  });

  // ---- the window selector ------------------------------------------------------------------
  var params = new URLSearchParams(location.search);
  var win = WINDOWS.indexOf(params.get('window')) >= 0 ? params.get('window') : 'all';
  var radios = document.querySelectorAll('input[name="window"]');
  for (var i = 0; i < radios.length; i++) {
    radios[i].checked = radios[i].value === win;
    radios[i].addEventListener('change', function (ev) {
      if (!ev.target.checked) return;
      win = ev.target.value;
      var u = new URL(location.href);
      if (win === 'all') u.searchParams.delete('window'); else u.searchParams.set('window', win);
      history.replaceState(null, '', u);
      lastScoreKey = '';
      $('score-status').textContent = 'Loading ' + WINDOW_WORDS[win] + '…';
      refreshScore();
    });
  }

  // ---- map and leaderboard ------------------------------------------------------------------
  var lastScoreKey = '';
  var lastLbKey = '';

  function scoreUrl(w) {
    return w === 'all' ? '/score' : '/score/' + w;
  }

  function loadScore() {
    var w = win;
    return IG.fetchJSON(scoreUrl(w)).then(function (s) {
      if (w !== win) return; // the window changed while this was in flight
      IG.noteServerTime(s.generated);
      var key = w + ':' + s.generated + ':' + s.total;
      var total = s.total || 0;
      $('score-status').textContent = total === 0
        ? 'No claims in ' + WINDOW_WORDS[w] + ' yet.'
        : total.toLocaleString() + ' claim' + (total === 1 ? '' : 's') + ' in ' + WINDOW_WORDS[w] +
          ' · ' + (s.blocks || []).length + ' of 256 /8s taken · updated ' + IG.ago(s.generated);
      $('score-status').classList.remove('err');
      if (key === lastScoreKey) return;
      lastScoreKey = key;
      renderMap(s.blocks || []);
      renderLeaderboard(s.leaderboard || []);
    }, function (e) {
      if (w !== win) return;
      $('score-status').textContent = 'Could not load the scores: ' + IG.describeError(e) + '. Retrying…';
      $('score-status').classList.add('err');
    });
  }

  function renderMap(blocks) {
    var byBlock = new Array(256);
    for (var i = 0; i < blocks.length; i++) {
      var bl = blocks[i];
      if (bl && bl.block >= 0 && bl.block < 256) byBlock[bl.block] = bl;
    }
    for (var b = 0; b < 256; b++) {
      var prefix = b + '.0.0.0/8 — ';
      var data = byBlock[b];
      var leaders = data && data.leaders || [];
      if (!leaders.length) {
        IG.setCell(cells[b], { title: prefix + 'unclaimed' });
        continue;
      }
      var top = leaders[0];
      var title = prefix + top.name + ' (' + top.count + ')';
      for (var j = 1; j < leaders.length; j++) title += '\n' + leaders[j].name + ' (' + leaders[j].count + ')';
      if (data.total) title += '\n' + data.total + ' claimed in all';
      var c = IG.colorFor(top.name);
      IG.setCell(cells[b], { title: title, href: IG.userHref(top.name), bg: c.bg, fg: c.fg, name: top.name });
    }
  }

  function renderLeaderboard(rows) {
    var key = JSON.stringify(rows);
    if (key === lastLbKey) return;
    lastLbKey = key;
    var body = $('lb-body');
    var frag = document.createDocumentFragment();
    for (var i = 0; i < rows.length; i++) {
      var r = rows[i];
      var c = IG.colorFor(r.name);
      var swatch = el('span', { className: 'swatch', 'aria-hidden': 'true' });
      swatch.style.background = c.bg;
      frag.appendChild(el('tr', null,
        el('td', { text: String(i + 1) }),
        el('td', null, swatch, el('a', { href: IG.userHref(r.name), text: r.name })),
        el('td', { className: 'n', text: Number(r.count).toLocaleString() }),
        el('td', { className: 'n', text: String(r.blocks) })));
    }
    body.replaceChildren(frag);
    $('lb-empty').hidden = rows.length > 0;
  }

  var refreshScore = IG.poll(loadScore, 3000);

  // ---- live feed ----------------------------------------------------------------------------
  var feed = $('feed');
  var items = new Map(); // key -> <li>
  var firstFeed = true;

  function loadFeed() {
    return IG.fetchJSON('/recent').then(function (data) {
      IG.noteServerTime(data.generated);
      var claims = data.claims || [];
      var keep = new Map();
      var order = [];
      for (var i = 0; i < claims.length; i++) {
        var c = claims[i];
        var key = c.ip + '|' + c.time + '|' + c.name;
        if (keep.has(key)) continue;
        var li = items.get(key);
        if (!li) {
          li = el('li', null,
            el('a', { href: IG.userHref(c.name), className: 'who', text: c.name }),
            ' claimed ',
            el('span', { className: 'addr', text: c.ip }),
            ' ',
            IG.timeEl(c.time));
          li.setAttribute('data-name', c.name);
          li.setAttribute('data-ip', c.ip);
          if (!firstFeed) li.className = 'new';
        }
        keep.set(key, li);
        order.push(li);
      }
      // Reconcile in place: insert new rows, move changed ones, drop the ones that fell off.
      for (var k = 0; k < order.length; k++) {
        if (feed.children[k] !== order[k]) feed.insertBefore(order[k], feed.children[k] || null);
      }
      while (feed.children.length > order.length) feed.removeChild(feed.lastChild);
      items = keep;
      firstFeed = false;
      IG.refreshTimes(feed);
      var st = $('feed-status');
      st.classList.remove('err');
      st.textContent = claims.length === 0 ? 'No claims yet. Be the first!'
        : claims.length === 1 ? 'The only claim so far.' : 'The latest ' + claims.length + ' claims, newest first.';
    }, function (e) {
      var st = $('feed-status');
      st.textContent = 'Could not load the latest claims: ' + IG.describeError(e) + '. Retrying…';
      st.classList.add('err');
    });
  }

  feed.addEventListener('animationend', function (ev) {
    if (ev.target.classList) ev.target.classList.remove('new');
  });

  var refreshFeed = IG.poll(loadFeed, 2000);
})();
