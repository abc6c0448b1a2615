/* The edit lease of an EditLeaseMixin change form (django_redislock/editing).
 *
 * While this page holds the lease: renew it every third of its length (and
 * at once when the tab comes back into view: hidden tabs' timers are slowed
 * down), keep the ticket each renewal hands back in the form, and give the
 * lease up when the page goes away (sendBeacon on pagehide) unless it is
 * being submitted (the save needs it). A renewal answered "lost" shows why
 * and disables the save buttons; the server refuses a stale save anyway.
 * A page opened while this user holds the lease in a tab that is just
 * reloading looks again a few times, and reloads once the lease is free.
 * No framework, nothing from the network.
 */
(function () {
  'use strict';
  var configNode = document.getElementById('redislock-edit-lease-config');
  var root = document.getElementById('redislock-edit-lease');
  if (!configNode || !root) { return; }
  var config = JSON.parse(configNode.textContent);
  var form = root.closest('form');
  var mark = 'redislock-edit-lease:' + config.name;

  function csrfToken() {
    var input = form && form.querySelector('input[name=csrfmiddlewaretoken]');
    return input ? input.value : '';
  }

  function body(ticket) {
    var data = new FormData();
    data.append('csrfmiddlewaretoken', csrfToken());
    if (ticket) { data.append(config.ticketField, ticket); }
    return data;
  }

  if (config.status === 'elsewhere' && sessionStorage.getItem(mark)) {
    // this tab held it a moment ago (a reload): its release may land after this page
    sessionStorage.removeItem(mark);
    var said = document.getElementById('redislock-edit-lease-banner');
    said.textContent = config.resuming;  // not "another tab": this one, a moment ago
    var delays = [300, 700, 1500, 3000];
    var look = function () {
      fetch(config.statusUrl, {credentials: 'same-origin'})
        .then(function (r) { return r.json(); })
        .then(function (state) {
          if (state.free) {
            window.location.reload();
          } else if (delays.length) {
            setTimeout(look, delays.shift());
          } else {
            window.location.reload();  // still held: show who has it (the banner's buttons with it)
          }
        })
        .catch(function () {});
    };
    setTimeout(look, delays.shift());
  }
  if (config.status !== 'held' || !form) { return; }
  sessionStorage.removeItem(mark);

  var ticketInput = form.querySelector('input[name="' + config.ticketField + '"]');
  var held = true;
  var submitting = false;
  var inFlight = null;
  var timer = null;
  var lastRenewal = Date.now();

  function lost(message) {
    held = false;
    clearTimeout(timer);
    var box = document.getElementById('redislock-edit-lease-lost');
    box.firstElementChild.textContent = message;
    box.hidden = false;
    document.getElementById('redislock-edit-lease-note').hidden = true;
    root.dataset.status = 'lost';
    form.querySelectorAll('.submit-row input[type=submit], .submit-row button').forEach(function (b) {
      b.disabled = true;
    });
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(renew, config.renewMs);
  }

  function renew() {
    if (!held || submitting || inFlight) { return inFlight; }
    inFlight = fetch(config.renewUrl, {method: 'POST', body: body(ticketInput.value), credentials: 'same-origin'})
      .then(function (response) {
        return response.json().then(function (answer) {
          if (answer.status === 'held') {
            ticketInput.value = answer.ticket;
            lastRenewal = Date.now();
          } else if (answer.status === 'lost') {
            lost(answer.message);
          }  // an error (Redis unreachable): the lease has two thirds left; try again
        });
      })
      .catch(function () {})
      .then(function () {
        inFlight = null;
        root.dataset.renewals = String(Number(root.dataset.renewals || 0) + 1);
        if (held && !submitting) { schedule(); }
      });
    return inFlight;
  }

  form.addEventListener('submit', function (event) {
    if (submitting) { return; }
    submitting = true;
    clearTimeout(timer);
    if (inFlight) {  // the save must carry the ticket the renewal brings back
      event.preventDefault();
      var submitter = event.submitter;
      inFlight.then(function () { form.requestSubmit(submitter); });
    }
  });

  document.addEventListener('visibilitychange', function () {
    if (document.visibilityState === 'visible' && Date.now() - lastRenewal > config.renewMs / 2) {
      renew();
    }
  });

  window.addEventListener('pagehide', function () {
    if (!held || submitting) { return; }
    held = false;
    clearTimeout(timer);
    navigator.sendBeacon(config.releaseUrl, body(ticketInput.value));
    sessionStorage.setItem(mark, '1');
  });

  window.addEventListener('pageshow', function (event) {
    if (event.persisted) { window.location.reload(); }  // back from the cache: its lease is gone
  });

  schedule();
}());
