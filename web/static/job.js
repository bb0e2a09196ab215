// A job page: summary, pods, live charts, result, timeline, checkpoints. The stream's events are
// queued and applied once per animation frame, so a burst of thousands costs one redraw.
import { api, streamUrl } from './api.js';
import { EVENT, FAULT_TOLERANCE, FINISHED, JOB_STATUS, KIND, PARALLELISM, POD_PHASE, STREAM } from './contract.js';
import { Charts } from './charts.js';
import { ago, badge, confirmDialog, duration, fill, h, notice, number, percent, setBadge, setText } from './dom.js';
import { podsOf, progressOf } from './jobs.js';
import { Pods } from './pods.js';
import { applyEvaluation, loadHistory, loadOlder } from './history.js';
import { Checkpoints, Result } from './result.js';
import { KeyedSeries, TimeSeries } from './series.js';
import { state } from './state.js';
import { describe, joinedLate, membershipLabel, ordinalOf, Timeline } from './timeline.js';

const POLL_MS = 2000;
const RETRY_MS = 3000;
const MEMBERSHIP = [EVENT.scaled, EVENT.left, EVENT.joined, EVENT.migrated, EVENT.migration_failed];

/** How a pod rejoins: a live group heals it from a peer (a pod recreated there may first load a
 * checkpoint: not a rejoin yet); a restarted group resumes from the checkpoint. */
function rejoinType(job) {
  return job.spec.fault_tolerance === FAULT_TOLERANCE.restart ? EVENT.resumed : EVENT.healed;
}

function newView(id) {
  return {
    id,
    job: null,
    get finished() { return Boolean(this.job && FINISHED.includes(this.job.status)); },
    lastId: 0,
    queue: [],
    frame: 0,
    series: {
      loss: new KeyedSeries(['mean']),
      speed: new TimeSeries(['mean']),
      accuracy: new KeyedSeries(['mean']),
      participants: new TimeSeries(['max']),
    },
    markers: [],
    kills: new Map(), // ordinal -> {time, restarts}: restarts seen when it was killed
    restarts: new Map(), // ordinal -> restarts seen in the stream's pod events
    rejoins: new Map(), // ordinal -> {time, step}
    arriving: new Set(), // ordinals a scale-up added that have not joined yet
    migrating: new Set(), // ordinals whose migration was asked for and has not ended
    podSteps: new Map(), // pod name -> highest step it reported
    latest: null, // the newest metric point
    loadingHistory: false,
    chartsAt: 0, // when the charts were last redrawn
    flushes: 0,
  };
}

/** Chart markers of a membership change, and what the pods grid notes of it. */
function membership(view, data, time) {
  const label = membershipLabel(STREAM.job, data);
  if (data.type === EVENT.scaled) {
    for (let ordinal = data.from; ordinal < data.to; ordinal += 1) view.arriving.add(ordinal);
    for (const ordinal of view.arriving) if (ordinal >= data.to) view.arriving.delete(ordinal);
    view.markers.push({ time, kind: 'scale', label });
  } else if (data.type === EVENT.left) {
    view.markers.push({ time, kind: 'leave', label });
  } else if (data.type === EVENT.joined) {
    // Only a scale-up's newcomers: a migration's replacement has its `migrated` marker, a
    // comeback its rejoin, and the pods that start together join at step 1.
    if (view.arriving.delete(ordinalOf(data.pod)) && joinedLate(data)) {
      view.markers.push({ time, kind: 'join', label });
    }
  } else {
    view.migrating.delete(data.ordinal);
    view.markers.push({ time, kind: data.type, label }); // migrated or migration_failed
  }
}

function layout(view) {
  const el = {
    title: h('h1'),
    status: badge('…'),
    connection: h('span.connection', { role: 'status', dataset: { state: 'connecting' } }, 'connecting'),
    finish: h('button.finish', { type: 'button', hidden: true }, 'Finish after this epoch'),
    cancel: h('button.danger', { type: 'button', hidden: true }, 'Cancel job'),
    notice: h('p.notice', { role: 'status' }),
    bar: h('progress', { max: 1, value: 0, 'aria-label': 'progress' }),
    stats: h('dl.stats'),
    reason: h('p.error', { hidden: true }),
    replicas: h('form.replicas', { hidden: true, novalidate: true, 'aria-label': 'Replicas' }),
    podsBody: h('tbody'),
    charts: h('div.charts'),
    result: h('section.card.result', { hidden: true, 'aria-label': 'Result' }),
    timeline: h('ol.timeline', { 'aria-label': 'Events, newest first' }),
    older: h('div.older'),
    checkpointsBody: h('tbody'),
    checkpointsEmpty: h('p.muted', {}, 'No checkpoint yet.'),
  };
  const section = (title, ...children) => h('section.card', { 'aria-label': title }, h('h2', {}, title), ...children);
  const content = [
    h('p.crumbs', {}, h('a', { href: '#/' }, 'Jobs'), ' / ', h('span.mono', {}, view.id)),
    h('div.title-row', {}, el.title, el.status, el.connection, h('span.spacer'), el.finish, el.cancel),
    el.notice,
    h('section.card.summary', { 'aria-label': 'Progress' }, el.bar, el.stats, el.reason),
    el.result,
    section('Pods', el.replicas, h('div.table-wrap', {}, h('table.pods', {},
      h('thead', {}, h('tr', {}, h('th.num', {}, '#'), h('th', {}, 'Pod'), h('th', {}, 'Phase'),
        h('th.num', {}, 'Restarts'), h('th', {}, 'Last heartbeat'), h('th.num', {}, 'Step'),
        h('th', {}, h('span.visually-hidden', {}, 'Actions')))),
      el.podsBody))),
    section('Training', el.charts),
    h('div.columns', {},
      section('Events', el.timeline, el.older),
      section('Checkpoints', el.checkpointsEmpty, h('div.table-wrap', {}, h('table.checkpoints', {},
        h('thead', {}, h('tr', {}, h('th', {}, 'Checkpoint'), h('th.num', {}, 'Epoch'),
          h('th.num', {}, 'Step'), h('th.num', {}, 'Val acc'), h('th.num', {}, 'Size'),
          h('th', {}, 'Saved'), h('th', {}, h('span.visually-hidden', {}, 'Download')))),
        el.checkpointsBody)))),
  ];
  return { el, content };
}

function stat(label, value) {
  return h('div', {}, h('dt', {}, label), h('dd', {}, value));
}

export function showJob(main, id) {
  const view = newView(id);
  state.job = view;
  const { el, content } = layout(view);
  fill(main, ...content);
  const pods = new Pods(el.podsBody, el.notice, view, el.replicas, (job) => {
    view.job = job; // the scaled job, as the PATCH answered it
    pods.render();
    renderSummary();
  });
  const timeline = new Timeline(el.timeline, el.older, (before) => loadOlder(id, before));
  const checkpoints = new Checkpoints(el.checkpointsBody, el.checkpointsEmpty);
  const result = new Result(el.result);
  const charts = new Charts(el.charts, view.series, view.markers,
    (time) => view.series.speed.keyAt(time), () => view.job?.spec.epochs);
  charts.start();
  let stopped = false;
  let source = null;
  let pollTimer = null;
  let retryTimer = null;

  function renderSummary() {
    const { job, latest } = view;
    if (!job) return;
    setText(el.title, job.name || job.id);
    document.title = `${job.name || job.id} · Live Migrator`;
    setBadge(el.status, job.status);
    el.bar.value = progressOf(job);
    const { progress } = job;
    const items = [
      stat('Epoch', `${progress.epoch}/${progress.epochs}`),
      stat('Step', String(Math.max(progress.step, latest?.step ?? 0))),
      stat('Samples', `${number(progress.samples_seen, 0)}${progress.total_samples ? ` / ${number(progress.total_samples, 0)}` : ''}`),
      stat('Loss', number(latest?.loss ?? job.metrics.loss, 4)),
      stat('Samples/s', number(latest?.samples_per_second ?? job.metrics.samples_per_second, 1)),
      stat('Participants', String(latest?.participants ?? job.metrics.participants ?? '–')),
      stat('Global batch', globalBatch(job.spec)),
      stat('Val accuracy', percent(job.metrics.val_accuracy)),
      stat(view.finished ? 'Finished' : 'ETA', view.finished ? ago(job.finished_at) : duration(progress.eta_seconds)),
      stat('Mode', job.spec.parallelism === PARALLELISM.pipeline
        ? `${job.spec.fault_tolerance}, ${job.spec.replicas} x ${job.spec.pipeline_stages} pods`
        : `${job.spec.fault_tolerance}, ${job.spec.replicas} pods`),
    ];
    const { trainable_parameters: trainable, parameters } = job.metrics;
    if (trainable !== undefined && parameters) {
      items.push(stat('Trainable', `${number(trainable / 1e6, 2)}M of ${number(parameters / 1e6, 1)}M (${percent(trainable / parameters)})`));
    }
    fill(el.stats, items);
    el.reason.hidden = !job.reason || job.status === JOB_STATUS.succeeded;
    setText(el.reason, job.reason ?? '');
    el.cancel.hidden = view.finished;
    // Asked already (its epochs are fewer than the spec's), or a live job on an elastic batch,
    // whose pods cannot agree on when (the API would answer 409).
    el.finish.hidden = view.finished || progress.epochs < job.spec.epochs
      || (job.spec.fault_tolerance === FAULT_TOLERANCE.live && job.spec.elastic_batch);
  }

  // --- applying stream events (called once per frame with everything that arrived) --------

  function apply(event) {
    const { type, data } = event;
    const time = data.time;
    if (type === STREAM.metric && data.kind === KIND.metric) {
      const step = data.step;
      view.series.loss.add(step, [data.loss]);
      view.series.speed.add(time, step, [data.samples_per_second]);
      view.series.participants.add(time, step, [data.participants]);
      if (data.pod && step > (view.podSteps.get(data.pod) ?? 0)) view.podSteps.set(data.pod, step);
      if (!view.latest || step >= view.latest.step) view.latest = data;
      return null;
    }
    // The history's evaluations are in the chart already (loadHistory reads them all).
    if (type === STREAM.metric && !event.historic) applyEvaluation(view, data);
    let context = {};
    if (type === STREAM.pod && data.action === 'kill') {
      view.kills.set(data.ordinal, { time, restarts: view.restarts.get(data.ordinal) ?? 0 });
      view.markers.push({ time, kind: 'kill', label: `kill ${data.ordinal}` });
    } else if (type === STREAM.pod && data.action === 'migrate') {
      view.migrating.add(data.ordinal);
      view.markers.push({ time, kind: 'migrate', label: membershipLabel(type, data) });
    } else if (type === STREAM.pod && data.ordinal !== undefined) {
      const before = view.restarts.get(data.ordinal) ?? 0;
      if ((data.restarts ?? 0) > before) {
        view.restarts.set(data.ordinal, data.restarts);
        view.markers.push({ time, kind: 'restart', label: `restart ${data.ordinal}` });
      }
      const kill = view.kills.get(data.ordinal);
      if (data.phase === POD_PHASE.Failed && !(kill && time - kill.time < 30)) {
        view.markers.push({ time, kind: 'failure', label: `failed ${data.ordinal}` });
      }
      if (data.phase === POD_PHASE.Removed) {
        view.arriving.delete(data.ordinal);
        view.migrating.delete(data.ordinal);
      }
      const pod = view.job?.pods.find((p) => p.ordinal === data.ordinal);
      if (pod && data.phase) {
        pod.phase = data.phase;
        pod.restarts = Math.max(pod.restarts, data.restarts ?? 0);
      }
    } else if (type === STREAM.job && data.type === rejoinType(view.job)) {
      const ordinal = ordinalOf(data.pod);
      const kill = view.kills.get(ordinal);
      // A heal at step 0 is a pod joining at start-up, not a comeback; nor is the heal of a pod
      // a scale-up or a migration brings in (their own markers say so).
      const arrival = view.arriving.has(ordinal) || view.migrating.has(ordinal);
      if (!arrival && ((data.type === EVENT.healed && data.step !== 0) || kill)) {
        view.rejoins.set(ordinal, { time, step: data.step });
        view.markers.push({ time, kind: 'rejoin', label: `rejoin ${ordinal ?? ''}` });
        if (kill && time >= kill.time) context = { afterKill: time - kill.time };
      }
    } else if (type === STREAM.job && MEMBERSHIP.includes(data.type)) {
      membership(view, data, time);
    } else if (type === STREAM.job && data.type === EVENT.quorum && Number.isFinite(data.participants)) {
      view.series.participants.add(time, `q${event.id}`, [data.participants]);
    } else if (type === STREAM.job && data.status && !data.type && !event.historic) {
      view.job.status = data.status; // history is older than the polled job: only live moves
    } else if (type === STREAM.checkpoint) {
      checkpoints.refreshSoon(view.id);
    }
    const item = describe(type, data, context);
    return item ? { id: event.id, time, data, item } : null;
  }

  function flush() {
    view.frame = 0;
    if (!view.job) return; // events wait for the job (its spec and pods); poll() flushes them
    const start = performance.now();
    const batch = view.queue;
    view.queue = [];
    const entries = [];
    for (const event of batch) {
      const entry = apply(event);
      if (entry) entries.push(entry);
    }
    timeline.add(entries);
    // While the history pours in, redraw the charts a few times a second, not after each page:
    // every redraw of a growing history competes with reading the rest of it.
    if (!view.loadingHistory || start - view.chartsAt > 250) {
      charts.render();
      view.chartsAt = start;
    }
    pods.render();
    renderSummary();
    // The job just ended: fetch it now for its model and final pod states.
    if (entries.some((e) => e.item.tag && FINISHED.includes(e.data.status))) poll();
    view.flushes += 1;
    performance.measure('dashboard:frame', { start, end: performance.now() });
    if (view.flushes % 500 === 0) performance.clearMeasures('dashboard:frame');
  }

  function push(id, type, data, historic = false) {
    if (id && id <= view.lastId) return; // a replayed duplicate
    if (id) view.lastId = id;
    view.queue.push({ id, type, data, historic });
    if (!view.frame) view.frame = requestAnimationFrame(flush);
  }

  function enqueue(message) {
    if (!stopped) push(Number(message.lastEventId), message.type, JSON.parse(message.data));
  }

  function reconnect() {
    setConnection('reconnecting');
    retryTimer = setTimeout(connect, RETRY_MS);
  }

  /** Open the stream from the last event we hold, with a fresh signed link each time. */
  async function connect() {
    setConnection('connecting');
    let url;
    try {
      url = await streamUrl(id, { after: String(view.lastId) });
    } catch (error) {
      // A refused token shows the login prompt, a deleted job its notice (poll); anything else
      // (the API is down) is retried.
      if (!stopped && !error.unauthorized && error.status !== 404) reconnect();
      return;
    }
    if (stopped) return;
    source = new EventSource(url);
    for (const type of Object.values(STREAM)) source.addEventListener(type, enqueue);
    source.addEventListener('message', enqueue);
    source.onopen = () => setConnection('live');
    source.onerror = () => {
      if (stopped) return;
      // Not the browser's own retry: it would reuse this link, which has expired by the time a
      // long-open stream breaks.
      source.close();
      reconnect();
    };
  }

  function setConnection(status) {
    el.connection.dataset.state = status;
    setText(el.connection, status);
  }

  async function poll() {
    clearTimeout(pollTimer);
    try {
      const job = await api(`/api/v1/jobs/${encodeURIComponent(id)}`);
      if (stopped) return;
      view.job = job;
      if (view.queue.length && !view.frame) view.frame = requestAnimationFrame(flush);
      pods.render();
      renderSummary();
      result.show(job);
      if (view.finished) checkpoints.refreshSoon(id, 0);
    } catch (error) {
      if (stopped || error.unauthorized) return;
      if (error.status === 404) {
        fill(main, h('p.error', { role: 'alert' }, `Job ${id} was not found. `), h('a', { href: '#/' }, 'All jobs'));
        stop();
        return;
      }
      notice(el.notice, `Could not refresh the job: ${error.message}`, 'error');
    }
    if (!stopped && !view.finished) pollTimer = setTimeout(poll, POLL_MS);
  }

  el.finish.addEventListener('click', async () => {
    const ok = await confirmDialog('Finish after this epoch?', `The pods of ${id} end the job `
      + 'after the epoch under way, then evaluate it on test and export the model, as at the end '
      + 'of a whole run.', 'Finish');
    if (!ok) return;
    try {
      const answer = await api(`/api/v1/jobs/${encodeURIComponent(id)}/finish`, { method: 'POST' });
      notice(el.notice, `Finishing: ${answer.detail}`);
      poll();
    } catch (error) {
      if (!error.unauthorized) notice(el.notice, `Not finishing: ${error.message}`, 'error');
    }
  });

  el.cancel.addEventListener('click', async () => {
    const ok = await confirmDialog('Cancel this job?', `Every pod of ${id} is stopped and its `
      + 'workload deleted; checkpoints are kept.', 'Cancel job');
    if (!ok) return;
    try {
      await api(`/api/v1/jobs/${encodeURIComponent(id)}/cancel`, { method: 'POST' });
      poll();
    } catch (error) {
      if (!error.unauthorized) notice(el.notice, `Not cancelled: ${error.message}`, 'error');
    }
  });

  // Relative times (heartbeats, ETA) move even when no event arrives.
  const ticker = setInterval(() => { pods.render(); renderSummary(); }, 1000);

  function stop() {
    stopped = true;
    source?.close();
    clearTimeout(pollTimer);
    clearTimeout(retryTimer);
    clearInterval(ticker);
    if (view.frame) cancelAnimationFrame(view.frame);
    checkpoints.stop();
    charts.destroy();
    if (state.job === view) state.job = null;
  }

  // The job and its history at once, then live; a failed history read still goes live from
  // the start (the stream replays everything too, only slower).
  poll();
  loadHistory(view, push, () => stopped).then((before) => {
    if (stopped) return;
    timeline.olderFrom(before);
    if (!view.frame) view.frame = requestAnimationFrame(flush); // the charts, if nothing was queued
  }, () => {}).then(() => { if (!stopped) connect(); });
  checkpoints.refresh(id);
  return stop;
}

/** A step's samples, whoever takes part (its shards), or an elastic batch's per-pod size. */
function globalBatch(spec) {
  if (!spec.global_batch_size) return `${spec.batch_size} per pod`;
  const shards = spec.global_batch_size / spec.batch_size;
  return `${spec.global_batch_size} (${shards} shard${shards === 1 ? '' : 's'})`;
}
