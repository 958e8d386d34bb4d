// The Facility page: the rack map's colouring (power, condition or N−1 margin, kept across visits and
// filters), and a domain's "Hold…" that fills the hold form, whose Preview then shows what it would move.
(function () {
  "use strict";
  var KEY = "llmgw.facility.colour";
  function stored() { try { return localStorage.getItem(KEY) || "power"; } catch (e) { return "power"; } }
  function apply() {
    var card = document.getElementById("map-card");
    if (!card) { return; }
    var value = stored();
    card.dataset.colour = value;
    card.querySelectorAll("input[name=colour]").forEach(function (input) { input.checked = input.value === value; });
  }
  document.addEventListener("change", function (e) {
    if (e.target.matches && e.target.matches("#map-card input[name=colour]")) {
      try { localStorage.setItem(KEY, e.target.value); } catch (x) { /* private mode: this page only */ }
      document.getElementById("map-card").dataset.colour = e.target.value;
    }
  });
  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("button.fill-hold");
    var form = document.getElementById("hold-form");
    if (!button || !form) { return; }
    form.elements.domain.value = button.dataset.domain;
    form.scrollIntoView({block: "center"});
    form.elements.reason.focus();
  });
  document.addEventListener("htmx:afterSwap", apply);  // the body swapped for a filter or a page
  // The socket's first message brings every part as it is now (the page may be older than the socket):
  // from then on the page is in step with it (tests and benches wait for this).
  document.addEventListener("htmx:wsAfterMessage", function () {
    document.body.dataset.facilitySynced = "1";
    // What the page was rendered with is no longer what it shows: a reconnect asks for every part.
    var form = document.getElementById("socket-form");
    if (form) { form.querySelectorAll("input[name=parts], input[name=cards]").forEach(function (i) { i.value = ""; }); }
  });
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", apply); } else { apply(); }
})();
