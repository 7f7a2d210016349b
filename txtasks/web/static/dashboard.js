// Live refresh without reloading: every few seconds, fetch this page again and swap its
// <main>, unless the user is typing, has selected rows or has turned it off; what the user
// opened (a collapsed payload) stays open. The next refresh is due a few seconds after the
// last one ended: a server slower than that is never asked twice at once by one page.
(function () {
  "use strict";
  var main = document.getElementById("live");
  var toggle = document.getElementById("live-toggle");
  var seconds = main ? Number(main.dataset.refresh || 0) : 0;
  if (!main || !seconds) { return; }
  function busy() {
    var focused = document.activeElement;
    if (focused && /INPUT|SELECT|TEXTAREA/.test(focused.tagName)) { return true; }
    return main.querySelector("input[type=checkbox]:checked") !== null;
  }
  function later() { window.setTimeout(refresh, seconds * 1000); }
  function refresh() {
    if ((toggle && !toggle.checked) || busy() || document.hidden) { later(); return; }
    fetch(window.location.href, { headers: { "X-Live": "1" }, credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html === null || busy()) { return; }
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("live");
        if (!fresh) { return; }
        // what the user opened stays open (a long payload shown on a click)
        var open = Array.prototype.map.call(
          main.querySelectorAll("details[open][id]"), function (d) { return d.id; });
        main.innerHTML = fresh.innerHTML;
        open.forEach(function (id) {
          var again = document.getElementById(id);
          if (again) { again.open = true; }
        });
        main.dataset.updated = Date.now();
      })
      .catch(function () { /* the next tick tries again */ })
      .then(later);
  }
  later();
})();
