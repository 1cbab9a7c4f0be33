// The Hunch console's only script (docs/console.md). The pages are whole without it; it adds
// the decisions page's live tail and a confirmation before promote and roll back. Text from
// the server is only ever set with textContent, never parsed as HTML.
"use strict";

(function () {
  // Forms that change what the server serves ask first.
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.getAttribute("data-confirm"))) {
        event.preventDefault();
      }
    });
  });

  var table = document.getElementById("tail");
  if (!table) {
    return;
  }
  var body = table.tBodies[0];
  var state = document.getElementById("tail-state");
  var filters = document.getElementById("filters");
  var last = Number(table.getAttribute("data-last")) || 0;
  var MAX_ROWS = 200;
  var stopped = false;

  function cell(row, text, className) {
    var td = document.createElement("td");
    td.textContent = text;
    if (className) {
      td.className = className;
    }
    row.appendChild(td);
    return td;
  }

  // The same cells the server renders for a row (decisions.rs, row_html).
  function rowOf(r) {
    var tr = document.createElement("tr");
    tr.setAttribute("data-seq", String(r.seq));
    tr.className = "new";
    var link = document.createElement("a");
    link.href = "/console/decisions/" + encodeURIComponent(r.id);
    link.textContent = r.id.slice(0, 12);
    var first = document.createElement("td");
    first.appendChild(link);
    tr.appendChild(first);
    cell(tr, r.time);
    cell(tr, r.policy || r.route);
    cell(tr, r.model);
    cell(tr, r.status + " " + r.outcome, "outcome " + (r.outcome === "ok" ? "ok" : "bad"));
    cell(tr, r.ms.toFixed(1), "num");
    cell(tr, r.summary, "summary");
    return tr;
  }

  function query() {
    var params = new URLSearchParams();
    params.set("after", String(last));
    if (filters) {
      ["policy", "model", "outcome"].forEach(function (name) {
        var input = filters.elements.namedItem(name);
        if (input && input.value) {
          params.set(name, input.value);
        }
      });
    }
    return params.toString();
  }

  function poll() {
    if (stopped) {
      return;
    }
    fetch("/console/decisions/tail?" + query(), {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.json();
      })
      .then(function (tail) {
        // Rows come newest first: insert the oldest first so the newest ends on top.
        for (var i = tail.rows.length - 1; i >= 0; i--) {
          body.insertBefore(rowOf(tail.rows[i]), body.firstChild);
        }
        while (body.rows.length > MAX_ROWS) {
          body.deleteRow(body.rows.length - 1);
        }
        if (tail.rows.length > 0) {
          var empty = document.getElementById("tail-empty");
          if (empty) {
            empty.remove();
          }
        }
        last = Math.max(last, tail.last);
        table.setAttribute("data-last", String(last));
        if (state) {
          state.textContent = "live";
        }
        window.setTimeout(poll, 1000);
      })
      .catch(function (error) {
        // A lost session or a stopped server: say so and stop asking.
        stopped = true;
        if (state) {
          state.textContent = "stopped (" + error.message + "): reload the page";
        }
      });
  }

  window.setTimeout(poll, 1000);
})();
