// Live view of held locks: ticks each TTL down every 100 ms and refreshes the
// rows from the staff-only JSON endpoint every few seconds. Names and holders
// are only ever set with textContent, so a lock name cannot inject markup.
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
  let deadlines = new Map(); // cell -> performance.now() at which the TTL reaches 0

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

  function tick() {
    const now = performance.now();
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

  function holdersText(row) {
    const names = row.holders.map(function (h) {
      return h.holder + (h.mode ? " (" + h.mode + ")" : "");
    });
    const prefix = row.limit !== null ? row.holders.length + "/" + row.limit + ": " : "";
    return prefix + names.join(", ");
  }

  function render(data) {
    const fresh = new Map();
    const rows = document.createDocumentFragment();
    data.results.forEach(function (row) {
      const tr = document.createElement("tr");
      tr.dataset.name = row.name;
      tr.dataset.kind = row.kind;
      tr.appendChild(td("name", row.name));
      tr.appendChild(td("kind", row.kind));
      tr.appendChild(td("holders", holdersText(row)));
      const ttl = td("ttl", "");
      tr.appendChild(ttl);
      if (row.ttl !== null) {
        fresh.set(ttl, performance.now() + row.ttl * 1000);
      } else {
        ttl.textContent = "–";
      }
      tr.appendChild(td("fence", row.fencing_token === null ? "–" : String(row.fencing_token)));
      tr.appendChild(td("waiters", String(row.waiters)));
      if (counters) {
        const c = row.counters || {};
        tr.appendChild(td("counters", [c.acquired || 0, c.contended || 0, c.lost || 0].join(" / ")
          + " / " + (c.wait_ms || 0) + " ms"));
      }
      if (data.can_release) {
        const actions = td("actions", "");
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
      cell.colSpan = 8;
      tr.appendChild(cell);
      rows.appendChild(tr);
    }
    body.replaceChildren(rows);
    deadlines = fresh;
    tick();
    table.dataset.count = String(data.count);
    table.dataset.refreshed = String(Date.now());
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
        render(result.data);
        status.textContent = new Date().toLocaleTimeString();
      })
      .catch(function (error) {
        errorBox.hidden = false;
        errorBox.textContent = String(error.message || error);
      })
      .finally(function () {
        window.setTimeout(refresh, refreshMs);
      });
  }

  body.querySelectorAll("td.ttl").forEach(function (cell) {
    track(cell, cell.dataset.ttl);
  });
  tick();
  window.setInterval(tick, 100);
  window.setTimeout(refresh, refreshMs);
  if (paginator) {
    paginator.dataset.ready = "1";
  }
})();
