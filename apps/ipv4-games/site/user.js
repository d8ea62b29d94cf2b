// One player's page: total, the /8s they hold (with counts) and their latest claims.
'use strict';

(function () {
  var $ = function (id) { return document.getElementById(id); };
  var el = IG.el;
  var name = (new URLSearchParams(location.search).get('name') || '').trim();
  var status = $('player-status');

  function showLookup() {
    $('lookup').hidden = false;
    $('lookup-name').value = name.length <= 40 ? name : '';
  }

  if (!name) {
    $('player-name').textContent = 'Find a player';
    status.textContent = 'Which player? Enter a name.';
    showLookup();
    return;
  }
  var problem = IG.nameProblem(name);
  if (problem) {
    $('player-name').textContent = 'No such player';
    status.textContent = 'That is not a valid name. ' + problem;
    status.classList.add('err');
    showLookup();
    return;
  }

  document.title = name + ' — IPv4 Games';
  $('player-name').textContent = name;
  var color = IG.colorFor(name);
  $('player-swatch').style.background = color.bg;
  var cells = IG.buildMap($('map'));
  var led = new Set();
  var lastKey = '';
  var lastPlayer = null;

  function load() {
    var player = IG.fetchJSON('/player/' + encodeURIComponent(name));
    // Which /8s this player leads (all time); the page works without it.
    var score = IG.fetchJSON('/score').then(function (s) {
      var set = new Set();
      (s.blocks || []).forEach(function (b) {
        if (b.leaders && b.leaders[0] && b.leaders[0].name === name) set.add(b.block);
      });
      return set;
    }, function () { return null; });
    return Promise.all([player, score]).then(function (r) {
      if (r[1]) led = r[1];
      render(r[0]);
    }, function (e) {
      status.textContent = 'Could not load this player: ' + IG.describeError(e) + '. Retrying…';
      status.classList.add('err');
      if (e instanceof IG.HttpError && e.status === 400) throw e; // stop polling a bad name
    });
  }

  function render(p) {
    lastPlayer = p;
    status.classList.remove('err');
    var total = p.total || 0;
    var blocks = p.blocks || [];
    var recent = p.recent || [];
    status.textContent = total === 0
      ? name + ' holds no addresses yet.'
      : name + ' holds ' + total.toLocaleString() + ' address' + (total === 1 ? '' : 'es') + ' in ' +
        blocks.length + ' /8' + (blocks.length === 1 ? '' : 's') + (led.size ? ', and leads ' + (led.size === blocks.length && led.size === 1 ? 'it' : led.size) : '') + '.';
    $('player-data').hidden = false;

    var key = JSON.stringify([p, Array.from(led)]);
    if (key === lastKey) { IG.refreshTimes($('recent')); return; }
    lastKey = key;

    var counts = new Array(256);
    blocks.forEach(function (b) {
      if (b.block >= 0 && b.block < 256) counts[b.block] = b.count;
    });
    for (var b = 0; b < 256; b++) {
      var prefix = b + '.0.0.0/8 — ';
      if (counts[b]) {
        var leads = led.has(b);
        IG.setCell(cells[b], {
          title: prefix + name + ' (' + counts[b] + ')' + (leads ? ', leading' : ''),
          bg: color.bg, fg: color.fg, name: name, mark: leads,
          label: (leads ? '★' : '') + counts[b]
        });
      } else {
        IG.setCell(cells[b], { title: prefix + 'none' });
      }
    }

    var frag = document.createDocumentFragment();
    recent.forEach(function (c) {
      frag.appendChild(el('li', null, el('span', { className: 'addr', text: c.ip }), ' ', IG.timeEl(c.time)));
    });
    $('recent').replaceChildren(frag);
    $('recent-empty').hidden = recent.length > 0;
  }

  IG.poll(function () {
    return load().catch(function () { return new Promise(function () {}); }); // 400: never again
  }, 5000);
  setInterval(function () { if (lastPlayer) IG.refreshTimes($('recent')); }, 10000);
})();
