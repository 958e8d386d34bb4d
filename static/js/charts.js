// History charts, drawn with uPlot (vendored under static/vendor/uplot): a domain's or a node's power
// against its limit and, where readings are kept, its inlet air against the warm and hot thresholds.
// Each `.chart[data-src]` fetches its series as JSON (`?range=48h` or `30d`) and draws them with axes and
// the values under the cursor in the legend; its range buttons fetch again. Charts are drawn on load and
// whenever htmx puts one in the page (a rack's detail on the Facility page).
(function () {
  "use strict";
  if (!window.uPlot) { return; }

  function kw(v) { return v == null ? "—" : (v / 1000).toFixed(1) + " kW"; }
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  var MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
  // Every time on the 24-hour UTC clock, as the rest of the console and the server's logs give it: a
  // facility team across time zones reads one clock.
  function utcDay(d) { return d.getUTCDate() + " " + MONTHS[d.getUTCMonth()]; }
  function utcClock(d) { return pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()); }
  function utcText(t) { if (t == null) { return "—"; } var d = new Date(t * 1000); return utcDay(d) + " " + utcClock(d) + " UTC"; }
  // uPlot places its ticks on this clock's hours and days (its default is the browser's own zone).
  function tzDate(t) { return window.uPlot.tzDate(new Date(t * 1000), "Etc/UTC"); }
  // The time axis in 24-hour UTC time, with the date where the range spans days.
  function timeAxis() {
    return {
      label: "UTC",
      space: 110,  // a label as long as "1 Dec 16:00" between two ticks
      values: function (u, ticks) {
        var span = u.scales.x.max - u.scales.x.min;
        return ticks.map(function (t) {
          var d = new Date(t * 1000);
          return span > 3 * 86400 ? utcDay(d) : span > 86400 ? utcDay(d) + " " + utcClock(d) : utcClock(d);
        });
      },
    };
  }
  // The legend's time under the cursor, on the same clock.
  function timeSeries() { return {label: "time", value: function (u, t) { return utcText(t); }}; }
  function line(label, stroke, extra) {
    var s = {label: label, stroke: stroke, points: {show: false}};
    Object.keys(extra || {}).forEach(function (k) { s[k] = extra[k]; });
    return s;
  }
  function celsius(v) { return v == null ? "—" : v.toFixed(1) + " °C"; }
  function flat(n, value) { var out = new Array(n); for (var i = 0; i < n; i++) { out[i] = value; } return out; }

  function powerChart(el, data, width) {
    var n = data.t.length;
    var value = function (u, v) { return kw(v); };
    var series = [timeSeries(), line("use", "#2f5d8a", {width: 2, value: value}),
                  line("reserved", "#7d8799", {dash: [4, 3], value: value}),
                  line("measured peak", "#d98a00", {value: value})];
    var rows = [data.t, data.use, data.reserved, data.measured];
    if (data.limit != null) {
      series.push(line("limit", "#d93b30", {dash: [6, 4], width: 1.5, value: function () { return kw(data.limit); }}));
      rows.push(flat(n, data.limit));
    }
    if (data.cap != null) {
      series.push(line("cap", "#8a1c14", {dash: [2, 3], width: 1, value: function () { return kw(data.cap); }}));
      rows.push(flat(n, data.cap));
    }
    return new window.uPlot({
      width: width, height: 200, series: series, tzDate: tzDate,
      scales: {y: {range: function (u, lo, hi) { return [0, Math.max(hi, data.cap || 0, 1) * 1.05]; }}},
      axes: [timeAxis(), {label: "power", size: 64, values: function (u, vals) { return vals.map(kw); }}],
      cursor: {drag: {x: true, y: false}},
    }, rows, el);
  }

  function inletChart(el, data, width) {
    var n = data.t.length;
    return new window.uPlot({
      width: width, height: 160, tzDate: tzDate,
      series: [timeSeries(), line("inlet", "#6a3d9a", {width: 2, value: function (u, v) { return celsius(v); }}),
               line("warm above", "#b8860b", {dash: [6, 4], value: function () { return celsius(data.warm); }}),
               line("hot above", "#b22222", {dash: [6, 4], value: function () { return celsius(data.hot); }})],
      axes: [timeAxis(), {label: "inlet air", size: 64, values: function (u, vals) { return vals.map(function (v) { return v + " °C"; }); }}],
      cursor: {drag: {x: true, y: false}},
    }, [data.t, data.values, flat(n, data.warm), flat(n, data.hot)], el);
  }

  function draw(box) {
    var range = box.dataset.range || "48h";
    var plots = box.querySelector(".chart-plots");
    var note = box.querySelector(".chart-note");
    box.querySelectorAll("button[data-range]").forEach(function (b) {
      b.setAttribute("aria-pressed", b.dataset.range === range ? "true" : "false");
    });
    var sep = box.dataset.src.indexOf("?") < 0 ? "?" : "&";
    fetch(box.dataset.src + sep + "range=" + encodeURIComponent(range), {credentials: "same-origin"})
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
      .then(function (data) {
        (box._plots || []).forEach(function (p) { p.destroy(); });
        box._plots = [];
        plots.textContent = "";
        var width = Math.max(280, plots.clientWidth || box.clientWidth || 600);
        if (data.t.length < 2) {
          note.textContent = "No history yet: a point is kept every minute.";
          box.dataset.drawn = range + ":" + data.t.length;
          return;
        }
        note.textContent = data.text || "";
        box.dataset.drawn = range + ":" + data.t.length;  // what is drawn: its range and points
        var power = document.createElement("div");
        plots.appendChild(power);
        box._plots.push(powerChart(power, data, width));
        if (data.inlet && data.inlet.t.length > 1) {
          var inlet = document.createElement("div");
          plots.appendChild(inlet);
          box._plots.push(inletChart(inlet, data.inlet, width));
        }
      })
      .catch(function (e) { note.textContent = "History could not be read: " + e.message; });
  }

  function scan(root) {
    root = root || document;
    var boxes = Array.prototype.slice.call(root.querySelectorAll ? root.querySelectorAll(".chart[data-src]") : []);
    if (root.matches && root.matches(".chart[data-src]")) { boxes.push(root); }
    boxes.forEach(function (box) {
      if (box._drawn) { return; }
      box._drawn = true;
      draw(box);
    });
  }

  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest(".chart button[data-range]");
    if (!button) { return; }
    var box = button.closest(".chart");
    box.dataset.range = button.dataset.range;
    draw(box);
  });
  var resizing = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizing);
    resizing = setTimeout(function () {
      document.querySelectorAll(".chart[data-src]").forEach(function (box) {
        var plots = box.querySelector(".chart-plots");
        (box._plots || []).forEach(function (p) { p.setSize({width: Math.max(280, plots.clientWidth), height: p.height}); });
      });
    }, 200);
  });
  document.addEventListener("DOMContentLoaded", function () { scan(document); });
  if (document.readyState !== "loading") { scan(document); }
  document.addEventListener("htmx:load", function (e) { scan(e.target); });
})();
