// Draws one line chart per <canvas data-series> of the metrics page, one line per replica.
(function () {
  const node = document.getElementById("observability-series");
  if (!node || typeof Chart === "undefined") return;
  const data = JSON.parse(node.textContent);
  if (!data) return;
  const colors = ["#2563eb", "#15803d", "#b45309", "#b91c1c", "#7c3aed", "#0891b2", "#be185d", "#4d7c0f"];
  const pad = (n) => String(n).padStart(2, "0");
  const clock = (ms) => { const d = new Date(ms); return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()); };
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
          x: { type: "linear", ticks: { callback: (v) => clock(v), maxTicksLimit: 8 } },
          y: { beginAtZero: true },
        },
        plugins: { tooltip: { callbacks: { title: (items) => items.length ? clock(items[0].parsed.x) : "" } } },
      },
    });
  });
  window.observabilityChartsReady = true;
})();
