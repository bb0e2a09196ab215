// A job page's history: the charts from the job's series (a bounded number of points however
// long the history), then its other events, up to the series' last id; the stream goes on from it.
import { api } from './api.js';

// The series holds the metric points, and sample ids are for audits: neither is read here.
const HISTORY_TYPES = ['metric', 'checkpoint', 'job', 'pod', 'log'].map((t) => `&type=${t}`).join('');
const SERIES_POINTS = 2000;

/** The series' points into the charts, as the stream's metric points would have put them. */
function applySeries(view, series) {
  for (const [step, time, loss, rate, participants] of series.points) {
    view.series.loss.add(step, [loss]);
    view.series.speed.add(time, step, [rate]);
    view.series.participants.add(time, step, [participants]);
  }
  if (series.latest) view.latest = series.latest;
}

/** Read the history into `view`: the series, then the other events in pages of 1,000, each
 * queued with `push(id, type, data, historic)` while the next loads; `stopped()` ends it early.
 * Leaves `view.lastId` at the series' last id, where the stream starts. */
export async function loadHistory(view, push, stopped) {
  const job = encodeURIComponent(view.id);
  view.loadingHistory = true;
  try {
    const series = await api(`/api/v1/jobs/${job}/series?points=${SERIES_POINTS}`);
    if (stopped()) return;
    applySeries(view, series);
    let after = 0;
    for (;;) {
      const page = await api(`/api/v1/jobs/${job}/events?after=${after}&before=${series.last_id + 1}`
        + `&points=false&limit=1000${HISTORY_TYPES}`);
      if (stopped()) return;
      if (page.next_after === null) view.loadingHistory = false; // the last page: draw it
      for (const event of page.data) {
        push(event.id, event.type, { time: event.time, ...event.data }, true);
      }
      if (page.next_after === null) break;
      after = page.next_after;
    }
    view.lastId = Math.max(view.lastId, series.last_id);
  } finally {
    view.loadingHistory = false;
  }
}
