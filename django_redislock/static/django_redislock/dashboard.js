// Live view of held locks. Every TTL and "held for" is what the server read at
// one instant of its own clock (the snapshot's server_time). "Held for" is
// shown as read: a busy lock changes hands many times between refreshes, so
// counting it up would invent a long hold. TTLs count down from the snapshot,
// never for longer than the refresh interval: past it, the numbers stop and
// the page is marked stale until a newer snapshot arrives. A countdown that
// reaches zero reads "due" (the holder's watchdog may well have renewed it),
// and a TTL is shown as expiring only when the server itself reported it short
// of its renewal point. "updated N s ago" is the age of the data shown. Names and holders
// are only ever set with textContent, so a lock name cannot inject markup.
// The hot-names panel is re-rendered by the server (escaped by Django's
// templates) and swapped in every HOT_EVERY refreshes. When Redis is
// unreachable the page shows the error and nothing else.
"use strict";
(function () {
  const table = document.getElementById("redislock-table");
  const status = document.getElementById("redislock-status");
  if (!table) {
    return;
  }
  const body = table.tBodies[0];
  const errorBox = document.getElementById("redislock-error");
  const paginator = document.getElementById("redislock-paginator");
  const refreshMs = parseInt(table.dataset.refreshMs, 10) || 3000;
  // a refresh takes a round trip: marked stale only once this much later
  const STALE_GRACE_MS = 1000;
  const FETCH_TIMEOUT_MS = 10000;
  const counters = table.dataset.counters === "1";
  const labels = table.dataset;
  const live = document.getElementById("redislock-live");
  const hotBody = document.getElementById("redislock-hot-body");
  const hotForm = document.getElementById("redislock-hot-form");
  // the hot names follow every third refresh; while the panel says nothing
  // was recorded, every refresh, so the current minute shows as it fills
  // (the rows' counters showed 41 acquisitions beside "Nothing recorded")
  const HOT_EVERY = 3;
  let refreshes = 0;
  let failed = false;
  // performance.now() at which the shown snapshot was read on the server
  // (estimated as the middle of its request's round trip)
  let anchor = initialAnchor();
  let ttls = new Map(); // cell -> seconds left at the snapshot

  function initialAnchor() {
    const nav = performance.getEntriesByType && performance.getEntriesByType("navigation")[0];
    if (nav && nav.responseStart > 0) {
      return (nav.requestStart + nav.responseStart) / 2;
    }
    return performance.now();
  }

  function seconds(value) {
    if (value === null || value === undefined || value === "" || isNaN(Number(value))) {
      return null;
    }
    return Number(value);
  }

  function formatSeconds(s) {
    return Math.max(0, s).toFixed(1) + "s";
  }

  // Expiring: the server read a TTL below the renewal point of its lease (a
  // watchdog renews a third of the way in) and below 5 s; never a guess.
  function expiring(ttl, lease) {
    return ttl !== null && ttl < 5 && (lease === null || ttl < lease / 3);
  }

  function trackTtl(cell, ttl, lease) {
    if (ttl === null) {
      cell.textContent = "–";
      return;
    }
    ttls.set(cell, ttl);
    cell.dataset.ttlAtSnapshot = String(ttl);
    cell.classList.toggle("expiring", expiring(ttl, lease));
    if (lease !== null) {
      cell.title = labels.labelLease + " " + lease + "s";
    }
  }

  function elapsed() {
    return Math.min(Math.max(0, performance.now() - anchor), refreshMs) / 1000;
  }

  function tick() {
    const age = Math.max(0, performance.now() - anchor);
    const stale = failed || age > refreshMs + STALE_GRACE_MS;
    const dt = elapsed();
    ttls.forEach(function (ttl, cell) {
      const left = ttl - dt;
      const due = left < 0.05; // "0.0s" would read as expired
      cell.textContent = due ? labels.labelDue : formatSeconds(left);
      cell.classList.toggle("due", due);
      cell.dataset.remainingMs = String(Math.max(0, Math.round(left * 1000)));
    });
    table.classList.toggle("stale", stale);
    if (status) {
      status.textContent =
        labels.labelAge.replace("%(age)s", String(Math.floor(age / 1000))) +
        (stale ? " · " + labels.labelStale : "");
      status.classList.toggle("stale", stale);
      status.dataset.stale = stale ? "1" : "0";
      status.dataset.ageMs = String(Math.round(age));
    }
  }

  function td(className, text) {
    const cell = document.createElement("td");
    cell.className = className;
    cell.textContent = text;
    return cell;
  }

  function span(className, text) {
    const node = document.createElement("span");
    node.className = className;
    node.textContent = text;
    return node;
  }

  function whoText(h) {
    return h.host ? h.host + " · " + table.dataset.labelPid + " " + h.pid + " · " + h.thread : "";
  }

  function holdersCell(row) {
    const cell = td("holders", "");
    row.holders.forEach(function (h) {
      const line = document.createElement("div");
      line.className = "holder";
      if (row.kind === "leadership") {  // as the page renders it: who leads the name
        line.appendChild(span("quiet leader", labels.labelLeader));
        line.appendChild(document.createTextNode(" "));
      }
      if (h.runs) {
        line.appendChild(span("runs", h.runs));
      }
      line.appendChild(span("who", whoText(h) + (h.mode ? " (" + h.mode + ")" : "")));
      if (h.handed_over) {
        line.appendChild(document.createTextNode(" "));
        const badge = span("redislock-badge handed-over", labels.labelHandedOver);
        badge.title = labels.labelHandedOverTitle;
        line.appendChild(badge);
      }
      if (h.detached_for !== null && h.detached_for !== undefined) {
        line.appendChild(document.createTextNode(" "));
        const detached = labels.labelDetached.replace("%(age)s", h.detached_for.toFixed(1));
        const badge = span("redislock-badge detached", detached);
        badge.title = labels.labelDetachedTitle;
        line.appendChild(badge);
      }
      cell.appendChild(line);
    });
    return cell;
  }

  function waitersCell(row) {
    const cell = td("waiters", "");
    cell.appendChild(span("count", String(row.waiters)));
    if (row.queue && row.queue.length) {
      const list = document.createElement("ol");
      list.className = "queue";
      row.queue.forEach(function (w) {
        const item = document.createElement("li");
        item.value = w.position;
        if (w.runs) {
          item.appendChild(span("runs", w.runs));
          item.appendChild(document.createTextNode(" "));
        }
        if (w.host) {
          item.title = whoText(w);
        }
        item.appendChild(span("who", (w.thread ? w.thread + " · " : "") + w.waited.toFixed(1) + "s"));
        list.appendChild(item);
      });
      cell.appendChild(list);
    }
    return cell;
  }

  function countersCell(row) {
    if (!row.counted) {
      const cell = td("counters not-counted", labels.labelNotCounted);
      cell.title = labels.labelNotCountedTitle;
      return cell;
    }
    const cell = td("counters", "");
    const c = row.counters || {};
    // not `labels`: that name is the page's labels above, which a kind
    // without counters reads in this function before this line
    const names = table.dataset.labelCounters.split(",");
    const values = [c.acquired || 0, c.contended || 0, c.lost || 0, (c.wait_ms || 0) + " ms"];
    const list = document.createElement("dl");
    names.forEach(function (label, i) {
      const dt = document.createElement("dt");
      dt.textContent = label;
      const dd = document.createElement("dd");
      dd.textContent = String(values[i]);
      list.appendChild(dt);
      list.appendChild(dd);
    });
    cell.appendChild(list);
    return cell;
  }

  function nameCell(row) {
    const cell = td("name", "");
    const link = document.createElement("a");
    link.href = row.detail_url;
    link.textContent = row.name;
    cell.appendChild(link);
    return cell;
  }

  function render(data, readAt) {
    ttls = new Map();
    const rows = document.createDocumentFragment();
    data.results.forEach(function (row) {
      const tr = document.createElement("tr");
      tr.dataset.name = row.name;
      tr.dataset.kind = row.kind;
      tr.appendChild(nameCell(row));
      const kind = td("kind", row.kind);
      if (row.limit !== null) {
        kind.appendChild(document.createTextNode(" "));
        kind.appendChild(span("quiet", row.holders.length + "/" + row.limit));
      }
      tr.appendChild(kind);
      tr.appendChild(holdersCell(row));
      tr.appendChild(td("held", row.held_for === null ? "–" : formatSeconds(row.held_for)));
      const ttl = td("ttl", "");
      tr.appendChild(ttl);
      trackTtl(ttl, row.ttl, row.lease);
      tr.appendChild(td("fence", row.fencing_token === null ? "–" : String(row.fencing_token)));
      tr.appendChild(waitersCell(row));
      if (counters) {
        tr.appendChild(countersCell(row));
      }
      if (data.can_release) {
        const actions = td("release", "");
        const link = document.createElement("a");
        link.className = "button";
        link.href = row.release_url;
        link.textContent = table.dataset.labelRelease;
        actions.appendChild(link);
        tr.appendChild(actions);
      }
      rows.appendChild(tr);
    });
    if (!data.results.length) {
      const tr = document.createElement("tr");
      tr.className = "empty";
      const cell = td("", table.dataset.labelEmpty);
      cell.colSpan = 9;
      tr.appendChild(cell);
      rows.appendChild(tr);
    }
    body.replaceChildren(rows);
    anchor = readAt;
    failed = false;
    table.dataset.count = String(data.count);
    table.dataset.serverTime = String(data.server_time);
    table.dataset.refreshed = String(Date.now());
    tick();
  }

  function hotEmpty() {
    return hotBody.querySelector("#redislock-hot-empty") !== null;
  }

  function refreshHot(signal) {
    const params = new URLSearchParams(new FormData(hotForm));
    return fetch(table.dataset.hotUrl + "?" + params.toString(), {
      credentials: "same-origin",
      cache: "no-store",
      signal: signal,
    })
      .then(function (response) {
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (html !== null) {
          hotBody.innerHTML = html; // rendered and escaped by the server's template
          hotBody.dataset.refreshed = String(Date.now());
        }
      });
  }

  function showError(message) {
    errorBox.hidden = false;
    errorBox.textContent = message;
    live.hidden = true;
    failed = true;
    tick();
  }

  function refresh() {
    const sent = performance.now();
    const params = new URLSearchParams({ page: table.dataset.page || "1" });
    if (table.dataset.query) {
      params.set("q", table.dataset.query);
    }
    // a request that hangs must not stop the refreshes: it fails (and the
    // page shows the error) after a few refresh intervals
    const abort = new AbortController();
    const timer = window.setTimeout(function () {
      abort.abort(new Error(labels.labelTimeout));
    }, Math.max(FETCH_TIMEOUT_MS, 3 * refreshMs));
    fetch(table.dataset.url + "?" + params.toString(), {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
      cache: "no-store",
      signal: abort.signal,
    })
      .then(function (response) {
        return response.json().then(function (data) {
          return { ok: response.ok, data: data };
        });
      })
      .then(function (result) {
        if (!result.ok) {
          throw new Error(result.data.error || "HTTP error");
        }
        errorBox.hidden = true;
        live.hidden = false;
        render(result.data, (sent + performance.now()) / 2);
        refreshes += 1;
        return hotBody && (refreshes % HOT_EVERY === 0 || hotEmpty())
          ? refreshHot(abort.signal)
          : null;
      })
      .catch(function (error) {
        showError(String(error.message || error));
      })
      .finally(function () {
        window.clearTimeout(timer);
        window.setTimeout(refresh, refreshMs);
      });
  }

  body.querySelectorAll("td.ttl").forEach(function (cell) {
    trackTtl(cell, seconds(cell.dataset.ttl), seconds(cell.dataset.lease));
  });
  tick();
  window.setInterval(tick, 100);
  window.setTimeout(refresh, refreshMs);
  if (paginator) {
    paginator.dataset.ready = "1";
  }
})();
