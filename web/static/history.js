// A job page's history: the charts from the job's series (a bounded number of points however
// long the history) and its evaluations, then the timeline's latest events, up to the series'
// last id; the stream goes on from it, and older events load a page at a time when asked for.
import { api } from './api.js';
import { KIND, SPLIT, STREAM } from './contract.js';

// The series holds the metric points, and sample ids are for audits: neither is read here.
const HISTORY_TYPES = Object.values(STREAM).filter((type) => type !== STREAM.samples)
  .map((type) => `&type=${type}`).join('');
const SERIES_POINTS = 2000;
const PAGE = 200; // timeline events a page: the latest at first, then each older page

/** The series' points into the charts, as the stream's metric points would have put them. */
function applySeries(view, series) {
  for (const [step, time, loss, rate, participants] of series.points) {
    view.series.loss.add(step, [loss]);
    view.series.speed.add(time, step, [rate]);
    view.series.participants.add(time, step, [participants]);
  }
  if (series.latest) view.latest = series.latest;
}

/** A validation result of a metric event into the accuracy chart; other metric events do nothing. */
export function applyEvaluation(view, data) {
  if (data.kind === KIND.eval && data.split === SPLIT.validation && data.epoch !== undefined) {
    view.series.accuracy.add(data.epoch, [data.accuracy]);
  }
}

/** Every evaluation before id `before` (metric events but the points: one per split and epoch). */
async function evaluations(job, before, stopped) {
  const found = [];
  let after = 0;
  while (after !== null && !stopped()) {
    const page = await api(`/api/v1/jobs/${job}/events?type=${STREAM.metric}&points=false`
      + `&after=${after}&before=${before}&limit=1000`);
    found.push(...page.data);
    after = page.next_after;
  }
  return found;
}

/** The timeline's page of events before id `before`, the newest `PAGE` of them, oldest first. */
function latestEvents(job, before) {
  return api(`/api/v1/jobs/${job}/events?before=${before}&newest=true&points=false`
    + `&limit=${PAGE}${HISTORY_TYPES}`);
}

/** Read the history into `view`: the series and the evaluations into the charts, then the
 * timeline's latest events, each queued with `push(id, type, data, historic)`; `stopped()` ends
 * it early. Leaves `view.lastId` at the series' last id, where the stream starts, and answers
 * where older events end (null: none is older). */
export async function loadHistory(view, push, stopped) {
  const job = encodeURIComponent(view.id);
  view.loadingHistory = true;
  try {
    const series = await api(`/api/v1/jobs/${job}/series?points=${SERIES_POINTS}`);
    if (stopped()) return null;
    applySeries(view, series);
    const before = series.last_id + 1;
    const [evaluated, latest] = await Promise.all([evaluations(job, before, stopped),
      latestEvents(job, before)]);
    if (stopped()) return null;
    for (const event of evaluated) applyEvaluation(view, event.data);
    view.loadingHistory = false; // the last of it: draw it
    for (const event of latest.data) push(event.id, event.type, { time: event.time, ...event.data }, true);
    view.lastId = Math.max(view.lastId, series.last_id);
    return latest.next_before;
  } finally {
    view.loadingHistory = false;
  }
}

/** The page of the timeline's events before id `before`: `{events, before}`, `before` then
 * where the next older page ends (null: none is older). */
export async function loadOlder(jobId, before) {
  const page = await latestEvents(encodeURIComponent(jobId), before);
  return { events: page.data, before: page.next_before };
}
