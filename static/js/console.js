// Shows whether the live updates are connected (the htmx ws extension reconnects on its own), and keeps
// what a person opened (a room, a rack's detail, a Release… panel) open when the socket swaps it again.
(function () {
  "use strict";
  function mark(state) {
    var el = document.getElementById("live-status");
    if (!el) { return; }
    el.dataset.state = state;
    el.textContent = state === "open" ? "live" : "live updates down: reconnecting…";
  }
  if (document.querySelector("[ws-connect]")) { mark("connecting"); }
  document.body.addEventListener("htmx:wsOpen", function () { mark("open"); });
  document.body.addEventListener("htmx:wsClose", function () { mark("closed"); });
  document.body.addEventListener("htmx:wsError", function () { mark("closed"); });

  var opened = {};
  document.body.addEventListener("toggle", function (e) {
    var d = e.target;
    if (d.matches && d.matches("details[data-keep][id]")) { opened[d.id] = d.open; }
  }, true);
  document.body.addEventListener("htmx:oobAfterSwap", function () {
    Object.keys(opened).forEach(function (id) {
      var d = document.getElementById(id);
      if (d && d.open !== opened[id]) { d.open = opened[id]; }
    });
  });
})();
