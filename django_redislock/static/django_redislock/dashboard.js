// Live view of held locks: ticks each TTL down (and each "held for" up) every
// 100 ms and refreshes the rows from the staff-only JSON endpoint every few
// seconds. Names and holders are only ever set with textContent, so a lock
// name cannot inject markup. The hot-names panel is re-rendered by the server
// (escaped by Django's templates) and swapped in every HOT_EVERY refreshes.
// When Redis is unreachable the page shows the error and nothing else.
"use strict";
(function () {
  const table = document.getElementById("redislock-table");
  if (!table) {
    return;
  }
  const body = table.tBodies[0];
  const status = document.getElementById("redislock-status");
  const errorBox = document.getElementById("redislock-error");
  const paginator = document.getElementById("redislock-paginator");
  const refreshMs = parseInt(table.dataset.refreshMs, 10) || 3000;
  const counters = table.dataset.counters === "1";
  const live = document.getElementById("redislock-live");
  const hotBody = document.getElementById("redislock-hot-body");
  const hotForm = document.getElementById("redislock-hot-form");
  const HOT_EVERY = 3;
  let refreshes = 0;
  let deadlines = new Map(); // cell -> performance.now() at which the TTL reaches 0
  let starts = new Map(); // cell -> performance.now() at which the hold began

  function formatTtl(ms) {
    return (Math.max(0, ms) / 1000).toFixed(1) + "s";
  }

  function track(cell, ttlSeconds) {
    if (ttlSeconds === null || ttlSeconds === "" || isNaN(Number(ttlSeconds))) {
      cell.textContent = "–";
      return;
    }
    deadlines.set(cell, performance.now() + Number(ttlSeconds) * 1000);
  }

  function trackHeld(cell, heldSeconds) {
    if (heldSeconds === null || heldSeconds === "" || isNaN(Number(heldSeconds))) {
      cell.textContent = "–";
      return;
    }
    starts.set(cell, performance.now() - Number(heldSeconds) * 1000);
  }

  function tick() {
    const now = performance.now();
    starts.forEach(function (start, cell) {
      cell.textContent = formatTtl(now - start);
    });
    deadlines.forEach(function (deadline, cell) {
      const left = deadline - now;
      cell.textContent = formatTtl(left);
      cell.dataset.remainingMs = String(Math.max(0, Math.round(left)));
      cell.classList.toggle("expiring", left < 5000);
    });
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
      if (h.runs) {
        line.appendChild(span("runs", h.runs));
      }
      line.appendChild(span("who", whoText(h) + (h.mode ? " (" + h.mode + ")" : "")));
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
    const cell = td("counters", "");
    const c = row.counters || {};
    const labels = table.dataset.labelCounters.split(",");
    const values = [c.acquired || 0, c.contended || 0, c.lost || 0, (c.wait_ms || 0) + " ms"];
    const list = document.createElement("dl");
    labels.forEach(function (label, i) {
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

  function render(data) {
    const fresh = new Map();
    const held = new Map();
    const rows = document.createDocumentFragment();
    data.results.forEach(function (row) {
      const tr = document.createElement("tr");
      tr.dataset.name = row.name;
      tr.dataset.kind = row.kind;
      tr.appendChild(td("name", row.name));
      const kind = td("kind", row.kind);
      if (row.limit !== null) {
        kind.appendChild(document.createTextNode(" "));
        kind.appendChild(span("quiet", row.holders.length + "/" + row.limit));
      }
      tr.appendChild(kind);
      tr.appendChild(holdersCell(row));
      const heldCell = td("held", "–");
      tr.appendChild(heldCell);
      if (row.held_for !== null) {
        held.set(heldCell, performance.now() - row.held_for * 1000);
      }
      const ttl = td("ttl", "");
      tr.appendChild(ttl);
      if (row.ttl !== null) {
        fresh.set(ttl, performance.now() + row.ttl * 1000);
      } else {
        ttl.textContent = "–";
      }
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
    deadlines = fresh;
    starts = held;
    tick();
    table.dataset.count = String(data.count);
    table.dataset.refreshed = String(Date.now());
  }

  function refreshHot() {
    const params = new URLSearchParams(new FormData(hotForm));
    return fetch(table.dataset.hotUrl + "?" + params.toString(), {
      credentials: "same-origin",
      cache: "no-store",
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
  }

  function refresh() {
    const params = new URLSearchParams({ page: table.dataset.page || "1" });
    if (table.dataset.query) {
      params.set("q", table.dataset.query);
    }
    fetch(table.dataset.url + "?" + params.toString(), {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
      cache: "no-store",
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
        render(result.data);
        status.textContent = new Date().toLocaleTimeString();
        refreshes += 1;
        return refreshes % HOT_EVERY === 0 && hotBody ? refreshHot() : null;
      })
      .catch(function (error) {
        showError(String(error.message || error));
      })
      .finally(function () {
        window.setTimeout(refresh, refreshMs);
      });
  }

  body.querySelectorAll("td.ttl").forEach(function (cell) {
    track(cell, cell.dataset.ttl);
  });
  body.querySelectorAll("td.held").forEach(function (cell) {
    trackHeld(cell, cell.dataset.held);
  });
  tick();
  window.setInterval(tick, 100);
  window.setTimeout(refresh, refreshMs);
  if (paginator) {
    paginator.dataset.ready = "1";
  }
})();
