// Shows whether the live updates are connected (the htmx ws extension reconnects on its own).
(function () {
  "use strict";
  function mark(state) {
    var el = document.getElementById("live-status");
    if (el) { el.dataset.state = state; el.textContent = state === "open" ? "live" : "reconnecting…"; }
  }
  document.body.addEventListener("htmx:wsOpen", function () { mark("open"); });
  document.body.addEventListener("htmx:wsClose", function () { mark("closed"); });
  document.body.addEventListener("htmx:wsError", function () { mark("closed"); });
})();
