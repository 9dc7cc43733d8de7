"use strict";
// Sorting, filtering and opening of rows that the page already holds. This script never turns
// text into markup (no innerHTML): the dialogues were escaped when the page was written.
(function () {
  function attr(row, key) { return row.getAttribute("data-" + key); }
  function number(v) { var x = parseFloat(v); return isNaN(x) ? null : x; }

  // A click (or Enter) on th[data-sort] orders the rows by their data-KEY attribute; numbers
  // when the header has data-type="num", rows without a number last.
  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("th[data-sort]").forEach(function (th) {
      th.tabIndex = 0;
      function sort() {
        var key = th.getAttribute("data-sort"), numeric = th.getAttribute("data-type") === "num";
        var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
        table.querySelectorAll("th[aria-sort]").forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = attr(a, key), y = attr(b, key);
          if (numeric) {
            x = number(x); y = number(y);
            if (x === null || y === null) { return (x === null) - (y === null); }
            return dir * (x - y);
          }
          return dir * String(x).localeCompare(String(y), undefined, {numeric: true});
        });
        rows.forEach(function (r) { body.appendChild(r); });
      }
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") { sort(); } });
    });
  });

  // Opening: a row with data-open=ID shows the element #ID in its viewer (one at a time) and
  // puts #ID in the address, so a link to page.html#ID opens that dialogue.
  var current = null;
  function open(row) {
    var target = document.getElementById(attr(row, "open"));
    if (!target) { return; }
    if (current) { current.target.hidden = true; current.row.classList.remove("selected"); }
    target.hidden = false;
    row.classList.add("selected");
    current = {row: row, target: target};
    var placeholder = target.parentNode.querySelector(".placeholder");
    if (placeholder) { placeholder.hidden = true; }
    if (history.replaceState) { history.replaceState(null, "", "#" + target.id); }
  }
  function visibleRows(table) {
    return Array.prototype.filter.call(table.tBodies[0].rows, function (r) { return !r.hidden; });
  }
  document.querySelectorAll("tr[data-open]").forEach(function (row) {
    row.tabIndex = 0;
    row.addEventListener("click", function () { open(row); });
    row.addEventListener("keydown", function (e) {
      var rows = visibleRows(row.closest("table")), i = rows.indexOf(row);
      if (e.key === "Enter") { open(row); }
      else if ((e.key === "ArrowDown" || e.key === "j") && i + 1 < rows.length) { rows[i + 1].focus(); open(rows[i + 1]); e.preventDefault(); }
      else if ((e.key === "ArrowUp" || e.key === "k") && i > 0) { rows[i - 1].focus(); open(rows[i - 1]); e.preventDefault(); }
    });
  });
  document.querySelectorAll("tr[data-href]").forEach(function (row) {
    row.addEventListener("click", function (e) {
      if (e.target.closest("a")) { return; }
      window.location.href = attr(row, "href");
    });
  });
  function openHash() {
    if (location.hash.length < 2) { return; }
    var wanted = decodeURIComponent(location.hash.slice(1));
    document.querySelectorAll("tr[data-open]").forEach(function (row) {
      if (attr(row, "open") === wanted) { open(row); row.scrollIntoView({block: "nearest", inline: "nearest"}); }
    });
  }
  openHash();
  window.addEventListener("hashchange", openHash);

  // Filters: form.filters[data-table=ID] holds select[data-attr=KEY] (equality, "" = all),
  // input[data-min=KEY] / input[data-max=KEY] (a numeric range) and input[data-text] (words
  // found in the row or in the dialogue it opens, case-insensitive).
  document.querySelectorAll("form.filters").forEach(function (form) {
    var table = document.getElementById(form.getAttribute("data-table"));
    var count = form.querySelector(".count");
    var meanKey = form.getAttribute("data-mean");
    var texts = new Map();
    function textOf(row) {
      if (!texts.has(row)) {
        var target = attr(row, "open") && document.getElementById(attr(row, "open"));
        texts.set(row, (row.textContent + " " + (target ? target.textContent : "")).toLowerCase());
      }
      return texts.get(row);
    }
    function apply() {
      var equal = [], ranges = [], words = [];
      form.querySelectorAll("select[data-attr]").forEach(function (s) {
        if (s.value !== "") { equal.push([s.getAttribute("data-attr"), s.value]); }
      });
      form.querySelectorAll("input[data-min], input[data-max]").forEach(function (input) {
        var v = number(input.value);
        if (v === null) { return; }
        if (input.hasAttribute("data-min")) { ranges.push([input.getAttribute("data-min"), v, Infinity]); }
        else { ranges.push([input.getAttribute("data-max"), -Infinity, v]); }
      });
      form.querySelectorAll("input[data-text]").forEach(function (input) {
        words = words.concat(input.value.toLowerCase().split(/\s+/).filter(Boolean));
      });
      var shown = 0, sum = 0, counted = 0, rows = table.tBodies[0].rows;
      Array.prototype.forEach.call(rows, function (row) {
        var ok = equal.every(function (f) { return attr(row, f[0]) === f[1]; }) &&
          ranges.every(function (f) { var v = number(attr(row, f[0])); return v !== null && v >= f[1] && v <= f[2]; }) &&
          words.every(function (w) { return textOf(row).indexOf(w) >= 0; });
        row.hidden = !ok;
        if (ok) {
          shown += 1;
          var m = meanKey ? number(attr(row, meanKey)) : null;
          if (m !== null) { sum += m; counted += 1; }
        }
      });
      if (count) {
        count.textContent = shown + " of " + rows.length + " shown" +
          (counted ? "; mean " + form.getAttribute("data-mean-label") + " " + (sum / counted).toFixed(1) : "");
      }
    }
    form.addEventListener("input", apply);
    form.addEventListener("change", apply);
    form.addEventListener("submit", function (e) { e.preventDefault(); });
    form.addEventListener("reset", function () { setTimeout(apply, 0); });
    apply();
  });

  // Buttons that open or fold every <details> of a kind (data-details=CLASS) in their dialogue.
  document.querySelectorAll("button[data-details]").forEach(function (button) {
    button.addEventListener("click", function () {
      var scope = button.closest("article") || document;
      var all = scope.querySelectorAll("details." + button.getAttribute("data-details"));
      var openAll = Array.prototype.some.call(all, function (d) { return !d.open; });
      all.forEach(function (d) { d.open = openAll; });
    });
  });
})();
