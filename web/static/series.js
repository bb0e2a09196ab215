// Columnar chart data (what uPlot.setData takes), grown in place: no per-point objects.

/** First index whose value is >= x in an ascending array. */
export function lowerBound(values, x) {
  let low = 0, high = values.length;
  while (low < high) {
    const mid = (low + high) >>> 1;
    if (values[mid] < x) low = mid + 1; else high = mid;
  }
  return low;
}

function combine(mode, old, count, value) {
  if (value === null || value === undefined || !Number.isFinite(value)) return old;
  if (old === null || old === undefined) return value;
  return mode === 'max' ? Math.max(old, value) : (old * count + value) / (count + 1);
}

class Columns {
  constructor(modes) {
    this.modes = modes;
    this.x = [];
    this.ys = modes.map(() => []);
    this.counts = [];
    this.version = 0;
  }

  get length() { return this.x.length; }

  data() { return [this.x, ...this.ys]; }

  merge(index, values) {
    const count = this.counts[index];
    this.modes.forEach((mode, k) => { this.ys[k][index] = combine(mode, this.ys[k][index], count, values[k]); });
    this.counts[index] = count + 1;
    this.version += 1;
  }

  insert(index, x, values) {
    const clean = values.map((v) => (Number.isFinite(v) ? v : null));
    if (index === this.x.length) {
      this.x.push(x);
      this.counts.push(1);
      clean.forEach((v, k) => this.ys[k].push(v));
    } else {
      this.x.splice(index, 0, x);
      this.counts.splice(index, 0, 1);
      clean.forEach((v, k) => this.ys[k].splice(index, 0, v));
    }
    this.version += 1;
  }
}

/** One point per x (a step, an epoch): what several pods report for the same x is combined. */
export class KeyedSeries extends Columns {
  add(x, values) {
    const last = this.x.length - 1;
    if (last < 0 || x > this.x[last]) { this.insert(last + 1, x, values); return; }
    const index = lowerBound(this.x, x);
    if (this.x[index] === x) this.merge(index, values); else this.insert(index, x, values);
  }
}

/** Points over time; reports of the same key (a step) from several pods, close in time, are
 * combined into one point. Reports arrive about in time order, so both searches stay short.
 * A pause much longer than the usual interval between points (no step committed) is cut by a
 * null point, so the chart shows a gap instead of a line across it. */
export class TimeSeries extends Columns {
  constructor(modes, { lookback = 512, window = 30, minGap = 2 } = {}) {
    super(modes);
    this.keys = [];
    this.lookback = lookback;
    this.window = window;
    this.minGap = minGap;
    this.interval = null; // moving average of the time between consecutive points
  }

  add(time, key, values) {
    const n = this.x.length;
    for (let i = n - 1; i >= Math.max(0, n - this.lookback); i -= 1) {
      if (this.keys[i] === key && Math.abs(this.x[i] - time) < this.window) {
        this.merge(i, values);
        return;
      }
    }
    if (n && time >= this.x[n - 1]) {
      const gap = time - this.x[n - 1];
      if (this.interval !== null && gap > Math.max(this.minGap, 8 * this.interval)) {
        this.keys.push(null);
        this.insert(n, this.x[n - 1] + this.interval, values.map(() => null));
      } else {
        this.interval = this.interval === null ? gap : 0.9 * this.interval + 0.1 * gap;
      }
    }
    let index = this.x.length;
    while (index > 0 && this.x[index - 1] > time) index -= 1;
    this.keys.splice(index, 0, key);
    this.insert(index, time, values);
  }

  /** The key of the last point at or before `time` (the step a moment belongs to), or null. */
  keyAt(time) {
    for (let index = lowerBound(this.x, time + 1e-9) - 1; index >= 0; index -= 1) {
      if (typeof this.keys[index] === 'number') return this.keys[index];
    }
    return null;
  }
}
