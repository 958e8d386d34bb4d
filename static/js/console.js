// Shows whether the live updates are connected (the htmx ws extension reconnects on its own), and keeps
// what a person opened (a room, a rack's detail, a Release… panel) open when the socket swaps it again.
(function () {
  "use strict";
  function mark(state) {
    var el = document.getElementById("live-status");
    if (!el) { return; }
    el.dataset.state = state;
    el.textContent = state === "open" ? "live"
      : state === "paused" ? "live updates paused: the server has too many pages open; retrying…"
      : "live updates down: reconnecting…";
  }
  if (document.querySelector("[ws-connect]")) { mark("connecting"); }
  document.body.addEventListener("htmx:wsOpen", function () { mark("open"); });
  document.body.addEventListener("htmx:wsClose", function (e) {
    // 1013: the server holds as many sockets as it may (LLMGW_MAX_SOCKETS); the extension tries again later.
    var code = e.detail && e.detail.event ? e.detail.event.code : 0;
    mark(code === 1013 ? "paused" : "closed");
  });
  document.body.addEventListener("htmx:wsError", function () { mark("closed"); });

  // Ages and durations count up live from the time the server rendered (`<time class="since" data-since>`,
  // seconds since the epoch; #server-now corrects the browser's clock): a figure never freezes between two
  // updates, and the server's HTML stays the same while time passes, so a live update sends only changes.
  var skew = 0;
  var now = document.getElementById("server-now");
  if (now) { skew = Number(now.dataset.now) - Date.now() / 1000; }
  function ago(seconds) {
    seconds = Math.max(0, Math.round(seconds));
    return seconds < 120 ? seconds + " s" : seconds < 7200 ? Math.floor(seconds / 60) + " min" : Math.floor(seconds / 3600) + " h";
  }
  function tick() {
    var t = Date.now() / 1000 + skew;
    document.querySelectorAll("time[data-since]").forEach(function (el) {
      var text = ago(t - Number(el.dataset.since));
      if (el.textContent !== text) { el.textContent = text; }
    });
  }
  tick();
  setInterval(tick, 1000);
  document.body.addEventListener("htmx:afterSettle", tick);
  document.body.addEventListener("htmx:oobAfterSwap", tick);

  var opened = {};
  document.body.addEventListener("toggle", function (e) {
    var d = e.target;
    if (d.matches && d.matches("details[data-keep][id]")) { opened[d.id] = d.open; }
  }, true);
  // A panel opened a moment before a swap: its toggle event is still queued (and would reach an element no
  // longer in the page), so the state is read off the page as the swap begins.
  document.body.addEventListener("htmx:oobBeforeSwap", function () {
    document.querySelectorAll("details[data-keep][id]").forEach(function (d) { opened[d.id] = d.open; });
  });
  document.body.addEventListener("htmx:oobAfterSwap", function () {
    Object.keys(opened).forEach(function (id) {
      var d = document.getElementById(id);
      if (d && d.open !== opened[id]) { d.open = opened[id]; }
    });
  });
})();

// Menus (`details.action`: Location…, Hold rack, Cordon, Release…): one open at a time; Escape closes the
// open one and gives the focus back to the button (its summary) that opened it.
(function () {
  "use strict";
  document.addEventListener("toggle", function (e) {
    var menu = e.target;
    if (!menu.matches || !menu.matches("details.action") || !menu.open) { return; }
    document.querySelectorAll("details.action[open]").forEach(function (other) {
      if (other !== menu) { other.open = false; }
    });
  }, true);
  document.addEventListener("keydown", function (e) {
    if (e.key !== "Escape" || e.defaultPrevented) { return; }
    var menu = (e.target.closest && e.target.closest("details.action[open]")) || document.querySelector("details.action[open]");
    if (!menu) { return; }
    menu.open = false;
    var button = menu.querySelector(":scope > summary");
    if (button) { button.focus(); }
    e.preventDefault();
  });
})();

// `hx-ext="ws,shown-only"`: a live update's rows whose element the page no longer shows are dropped, not
// swapped. The socket learns which rows a page shows only after the page swapped its table (a filter, a
// sort, a page), so a heartbeat in between sends rows of the old table: htmx would report each as
// htmx:oobErrorNoTarget.
htmx.defineExtension("shown-only", {
  transformResponse: function (text) {
    var holder = document.createElement("template");
    holder.innerHTML = text;
    var dropped = false;
    Array.prototype.slice.call(holder.content.children).forEach(function (el) {
      if (el.id && el.getAttribute("hx-swap-oob") === "true" && !document.getElementById(el.id)) {
        el.remove();
        dropped = true;
      }
    });
    return dropped ? holder.innerHTML : text;
  }
});

// Back and forward load the page afresh instead of htmx restoring its snapshot: a live page's snapshot
// is stale, and restoring one re-initialises its socket's element under the forms that tell the socket
// which page this is (htmx-ext-ws then meets a form with no socket). Registered before htmx sets its own
// handler (when the document is ready), so this one runs first and stops it.
window.addEventListener("popstate", function (e) {
  if (e.state && e.state.htmx) {
    e.stopImmediatePropagation();
    window.location.reload();
  }
});
