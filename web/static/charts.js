// The job page's four uPlot charts. Data lives in series.js columns; a chart redraws at most once
// per animation frame, and only when its data or the failure markers changed.
import { h } from './dom.js';

let uPlotModule = null;

/** uPlot, served by the API from web/node_modules (npm ci); null when it is not installed. */
export async function loadUPlot() {
  if (!uPlotModule) {
    uPlotModule = import('/vendor/uplot/uPlot.esm.js').then((m) => m.default).catch(() => null);
  }
  return uPlotModule;
}

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

const MARKER_COLORS = {
  kill: '--bad', failure: '--bad', restart: '--warn', rejoin: '--good',
  scale: '--scale', join: '--good', leave: '--warn',
  migrate: '--move', migrated: '--move', migration_failed: '--bad',
};
// Dashed: a pod coming (back) or asked to move; solid: what happened to the job.
const DASHED = new Set(['rejoin', 'join', 'leave', 'migrate']);

/** Vertical lines at failures, rejoins and membership changes; `toX` maps a marker to this
 * chart's x. Labels that would overlap move down a row. The figure's `data-markers` names the
 * kinds drawn. */
function markersPlugin(markers, toX) {
  return {
    hooks: {
      draw: [(u) => {
        const { ctx, bbox } = u;
        const ratio = devicePixelRatio || 1;
        const placed = [];
        for (const marker of markers) {
          const value = toX(marker);
          if (value === null || value === undefined) continue;
          const x = Math.round(u.valToPos(value, 'x', true));
          if (x >= bbox.left && x <= bbox.left + bbox.width) placed.push({ marker, x });
        }
        placed.sort((a, b) => a.x - b.x);
        const figure = u.root.closest('figure');
        if (figure) figure.dataset.markers = placed.map((p) => p.marker.kind).join(' ');
        ctx.save();
        ctx.lineWidth = ratio;
        ctx.font = `${10 * ratio}px system-ui, sans-serif`;
        const rowEnds = [];
        for (const { marker, x } of placed) {
          ctx.strokeStyle = ctx.fillStyle = cssVar(MARKER_COLORS[marker.kind] ?? '--muted');
          ctx.setLineDash(DASHED.has(marker.kind) ? [4 * ratio, 3 * ratio] : []);
          ctx.beginPath();
          ctx.moveTo(x, bbox.top);
          ctx.lineTo(x, bbox.top + bbox.height);
          ctx.stroke();
          const left = x + 3 * ratio;
          let row = rowEnds.findIndex((end) => end <= left);
          if (row === -1) row = rowEnds.length;
          rowEnds[row] = left + ctx.measureText(marker.label).width + 4 * ratio;
          ctx.fillText(marker.label, left, bbox.top + (10 + 12 * row) * ratio);
        }
        ctx.restore();
      }],
    },
  };
}

// Whole-number ticks for steps and epochs.
const COUNTS = [1, 2, 5].flatMap((m) => [1, 10, 100, 1e3, 1e4, 1e5, 1e6].map((e) => m * e))
  .sort((a, b) => a - b);

const DEFINITIONS = [
  { key: 'loss', title: 'Training loss', x: 'step', label: 'loss', color: '--c1', digits: 4 },
  { key: 'speed', title: 'Throughput (samples/s)', x: 'time', label: 'samples/s', color: '--c2', digits: 1 },
  { key: 'accuracy', title: 'Validation accuracy', x: 'epoch', label: 'accuracy', color: '--c3', digits: 3, points: true, range: [0, 1], epochs: true },
  { key: 'participants', title: 'Participants', x: 'time', label: 'participants', color: '--c4', digits: 0, stepped: true, counts: true },
];

function options(uPlot, definition, width, markers, toX, epochs) {
  const grid = { stroke: cssVar('--grid'), width: 1 };
  const axis = { stroke: cssVar('--muted'), grid, ticks: grid };
  const format = (u, value) => (value === null || value === undefined ? '–'
    : Number(value).toLocaleString([], { maximumFractionDigits: definition.digits }));
  return {
    width,
    height: 190,
    pxAlign: false,
    cursor: { drag: { x: true, y: false } },
    legend: { live: true },
    scales: {
      x: definition.epochs
        ? { time: false, range: (u, min, max) => [0.5, Math.max(max ?? 1, epochs() ?? 1) + 0.5] }
        : { time: definition.x === 'time' },
      y: definition.range ? { range: definition.range }
        : definition.counts ? { range: (u, min, max) => [0, Math.max(max ?? 1, 1) + 0.5] }
          : { auto: true },
    },
    axes: [
      {
        ...axis,
        label: definition.x === 'time' ? undefined : definition.x,
        labelSize: 16,
        incrs: definition.x === 'time' ? undefined : COUNTS,
      },
      {
        ...axis,
        size: 50,
        values: (u, ticks) => ticks.map((t) => format(u, t)),
        incrs: definition.counts ? COUNTS : undefined,
      },
    ],
    series: [
      { label: definition.x, value: definition.x === 'time' ? undefined : (u, v) => (v ?? '–') },
      {
        label: definition.label,
        stroke: cssVar(definition.color),
        width: 1.5,
        value: format,
        spanGaps: definition.x !== 'time', // time charts hold deliberate gaps (pauses)
        points: { show: Boolean(definition.points), size: 6 },
        paths: definition.stepped ? uPlot.paths.stepped({ align: 1 }) : undefined,
      },
    ],
    plugins: [markersPlugin(markers, toX)],
  };
}

export class Charts {
  /** `sources`: key -> series (series.js); `markers`: shared array; `stepAt(time)`: step;
   * `epochs()`: the job's epoch count (the accuracy chart's x range). */
  constructor(container, sources, markers, stepAt, epochs) {
    this.epochs = epochs;
    this.container = container;
    this.sources = sources;
    this.markers = markers;
    this.stepAt = stepAt;
    this.charts = new Map();
    this.drawn = new Map();
    this.markersDrawn = -1;
    this.boxes = new Map();
    for (const definition of DEFINITIONS) {
      const plot = h('div.plot');
      const box = h('figure.chart', { dataset: { chart: definition.key, points: '0' } },
        h('figcaption', {}, definition.title), plot);
      this.boxes.set(definition.key, { box, plot, definition });
      container.append(box);
    }
    this.resizeObserver = new ResizeObserver(() => this.resize());
    this.resizeObserver.observe(container);
    this.scheme = matchMedia('(prefers-color-scheme: dark)');
    this.onScheme = () => this.build();
    this.scheme.addEventListener('change', this.onScheme);
  }

  async start() {
    this.uPlot = await loadUPlot();
    if (this.destroyed) return; // the page was left while uPlot loaded
    if (!this.uPlot) {
      this.container.prepend(h('p.error', { role: 'alert' },
        'Charts unavailable: uPlot is not installed on the server (run make setup).'));
      return;
    }
    this.build();
  }

  toX(definition) {
    if (definition.x === 'time') return (marker) => marker.time;
    if (definition.x === 'step') return (marker) => this.stepAt(marker.time);
    return () => null;
  }

  build() {
    if (!this.uPlot) return;
    for (const chart of this.charts.values()) chart.destroy();
    this.charts.clear();
    this.drawn.clear();
    this.markersDrawn = -1;
    for (const [key, { plot, definition }] of this.boxes) {
      const width = Math.max(plot.clientWidth, 240);
      const chart = new this.uPlot(options(this.uPlot, definition, width, this.markers,
        this.toX(definition), this.epochs), this.sources[key].data(), plot);
      this.charts.set(key, chart);
    }
    this.render();
  }

  resize() {
    for (const [key, chart] of this.charts) {
      const width = Math.max(this.boxes.get(key).plot.clientWidth, 240);
      if (Math.abs(width - chart.width) > 1) chart.setSize({ width, height: chart.height });
    }
  }

  /** Redraw what changed since the last call; cheap when nothing did. */
  render() {
    const markersChanged = this.markersDrawn !== this.markers.length;
    for (const [key, chart] of this.charts) {
      const source = this.sources[key];
      if (this.drawn.get(key) !== source.version) {
        chart.batch(() => chart.setData(source.data()));
        this.drawn.set(key, source.version);
        this.boxes.get(key).box.dataset.points = String(source.length);
      } else if (markersChanged && this.boxes.get(key).definition.x !== 'epoch') {
        chart.redraw(false, false);
      }
    }
    this.markersDrawn = this.markers.length;
  }

  destroy() {
    this.destroyed = true;
    this.resizeObserver.disconnect();
    this.scheme.removeEventListener('change', this.onScheme);
    for (const chart of this.charts.values()) chart.destroy();
    this.charts.clear();
  }
}
