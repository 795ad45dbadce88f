// Draws one line chart per <canvas data-series> of the metrics page, one line per replica.
// Every chart of the page spans the same range (the window chosen, up to now: data.range) and
// its x axis ticks at round times of the tenant's zone (every 2 min, 10 min, 1 h … so that at
// most MAX_TICKS fit), labelled in that zone, which the axis title names.
(function () {
  const node = document.getElementById("observability-series");
  if (!node || typeof Chart === "undefined") return;
  const data = JSON.parse(node.textContent);
  if (!data) return;
  const colors = ["#2563eb", "#15803d", "#b45309", "#b91c1c", "#7c3aed", "#0891b2", "#be185d", "#4d7c0f"];
  const MIN = 60000, HOUR = 60 * MIN;
  const STEPS = [MIN, 2 * MIN, 5 * MIN, 10 * MIN, 15 * MIN, 30 * MIN, HOUR, 2 * HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR, 24 * HOUR];
  const MAX_TICKS = 8;
  const range = data.range || {};
  const zone = range.zone || "UTC";
  const parts = new Intl.DateTimeFormat("en-GB", {
    timeZone: zone, hourCycle: "h23", year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit",
  });
  // The zone's offset from UTC at ``ms`` (ms), from the wall-clock time Intl gives for it.
  const offset = function (ms) {
    const p = Object.fromEntries(parts.formatToParts(new Date(ms)).map((x) => [x.type, x.value]));
    return Date.UTC(+p.year, +p.month - 1, +p.day, +p.hour, +p.minute, +p.second) - Math.floor(ms / 1000) * 1000;
  };
  const clock = function (ms, seconds) {
    const p = Object.fromEntries(parts.formatToParts(new Date(ms)).map((x) => [x.type, x.value]));
    return p.hour + ":" + p.minute + (seconds ? ":" + p.second : "");
  };
  const from = range.from_ms, to = range.to_ms;
  const step = STEPS.find((s) => (to - from) / s <= MAX_TICKS) || STEPS[STEPS.length - 1];
  const ticks = [];
  if (from !== undefined && to !== undefined) {
    const shift = offset(from);  // round in the zone's wall clock, not in UTC
    for (let t = Math.ceil((from + shift) / step) * step - shift; t <= to; t += step) ticks.push(t);
  }
  document.querySelectorAll("canvas[data-series]").forEach(function (canvas) {
    const key = canvas.dataset.series;
    const datasets = Object.entries(data.replicas).map(function ([replica, points], i) {
      return {
        label: replica,
        data: points.filter((p) => p[key] !== null && p[key] !== undefined).map((p) => ({ x: p.t, y: p[key] })),
        borderColor: colors[i % colors.length],
        backgroundColor: colors[i % colors.length],
        pointRadius: 2,
        tension: 0,
      };
    });
    canvas.chart = new Chart(canvas, {
      type: "line",
      data: { datasets: datasets },
      options: {
        animation: false,
        parsing: false,
        scales: {
          x: {
            type: "linear", min: from, max: to,
            title: { display: true, text: zone },
            afterBuildTicks: (axis) => { if (ticks.length) axis.ticks = ticks.map((value) => ({ value: value })); },
            ticks: { callback: (v) => clock(v, false), autoSkip: false, maxRotation: 0 },
          },
          y: { beginAtZero: true },
        },
        plugins: { tooltip: { callbacks: { title: (items) => items.length ? clock(items[0].parsed.x, true) : "" } } },
      },
    });
  });
  window.observabilityChartsReady = true;
})();
