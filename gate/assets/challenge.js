// The challenge page: finds the proof of work in Web Workers (one per core, worker.js),
// shows progress in the page's status line, then posts the answer with the page's own form,
// so the browser follows the gate's redirect back to the page it asked for. It keeps no
// state between tabs and never reads or writes cookies: each tab solves its own challenge.
(function () {
  'use strict';
  const form = document.getElementById('pass');
  const status = document.getElementById('status');
  const button = document.getElementById('continue');
  if (!form || !status) return;
  const challenge = form.dataset.challenge;
  const difficulty = Number(form.dataset.difficulty);
  const workerUrl = form.getAttribute('action').replace(/\/pass$/, '/worker.js');
  const expected = Math.pow(2, difficulty);
  const say = (text) => { status.textContent = text; };

  if (typeof Worker === 'undefined') {
    say('This browser cannot run the check (no Web Workers). Please use another browser.');
    return;
  }
  const count = Math.max(1, Math.min(navigator.hardwareConcurrency || 2, 16));
  const workers = [];
  let tried = 0;
  let shown = 0;
  let done = false;

  function finish(counter) {
    if (done) return;
    done = true;
    workers.forEach((w) => w.terminate());
    form.elements.counter.value = String(counter);
    say('Done. Opening the page…');
    button.hidden = false; // if the automatic post is blocked, a person can press it
    form.submit();
  }

  function fail() {
    if (done) return;
    done = true;
    workers.forEach((w) => w.terminate());
    say('The check could not run in this browser. Reload the page to try again.');
  }

  for (let i = 0; i < count; i++) {
    const worker = new Worker(workerUrl);
    worker.onmessage = (event) => {
      if ('found' in event.data) {
        if (event.data.found >= 0) finish(event.data.found); else fail();
        return;
      }
      tried += event.data.progress;
      const now = Date.now();
      if (now - shown >= 500) {
        shown = now;
        const share = Math.min(99, Math.floor((100 * tried) / expected));
        say('Checking your browser… about ' + share + '% of the expected work done.');
      }
    };
    worker.onerror = fail;
    worker.postMessage({ challenge, difficulty, start: i, step: count });
    workers.push(worker);
  }
})();
