// The events timeline: what happened to the job, newest first, as plain text; the latest events
// first, older ones a page at a time when asked for.
import { EVENT, JOB_STATUS, KIND, POD_PHASE, STREAM } from './contract.js';
import { clock, duration, fill, h, number, percent, setText } from './dom.js';

const MAX_ROWS = 400; // rows kept as new events arrive, besides those the reader asked for
// Fields a row shows in columns of their own.
const SHOWN_APART = { time: true, kind: true, pod: true };
const BAD = [EVENT.failed, EVENT.sigterm, EVENT.migration_failed];
const GOOD = [EVENT.healed, EVENT.completed, EVENT.resumed, EVENT.joined, EVENT.migrated];
const MEMBERSHIP = [EVENT.scaled, EVENT.left, EVENT.joined, EVENT.migrated];

function podLabel(data) {
  if (data.pod) return String(data.pod);
  if (data.name) return String(data.name);
  return data.ordinal !== undefined ? `pod ${data.ordinal}` : '';
}

/** The ordinal at the end of a pod's name (`job-x-2` -> 2), or null. */
export function ordinalOf(podName) {
  const match = /-(\d+)$/.exec(String(podName ?? ''));
  return match ? Number(match[1]) : null;
}

/** The short label of a membership change (a chart marker, the start of its timeline row), or
 * null for any other event. */
export function membershipLabel(type, data) {
  const pod = `pod ${data.ordinal ?? ordinalOf(data.pod) ?? '?'}`;
  if (type === STREAM.pod) return data.action === 'migrate' ? `migrate ${data.ordinal}` : null;
  if (type !== STREAM.job) return null;
  if (data.type === EVENT.scaled) return `scale ${data.from}→${data.to}`;
  if (data.type === EVENT.left) return `${pod} left${data.reason ? ` (${data.reason})` : ''}`;
  if (data.type === EVENT.joined) return `${pod} joined`;
  if (data.type === EVENT.migrated) return `${pod} migrated in ${duration(data.seconds)}`;
  if (data.type === EVENT.migration_failed) return `${pod} not migrated`;
  return null;
}

/** Whether a `joined` pod came to a job already training: pods that start together all join
 * at step 1, their first committed step. */
export function joinedLate(data) {
  return data.step > 1;
}

/** Scalar fields of an event nobody taught the dashboard about, as "key=value" text. */
function generic(data) {
  return Object.entries(data)
    .filter(([key, value]) => !SHOWN_APART[key]
      && ['string', 'number', 'boolean'].includes(typeof value))
    .map(([key, value]) => `${key}=${value}`).join(' ');
}

/** What a membership change's timeline row says after its label. */
function membershipDetail(data) {
  if (data.type === EVENT.left) return data.step === undefined ? '' : ` after step ${data.step}`;
  const extra = [];
  if (data.type === EVENT.joined && data.participants !== undefined) extra.push(`${data.participants} participants`);
  if (data.type === EVENT.joined && data.heal_bytes) extra.push(`healed ${number(data.heal_bytes / 1e6, 1)} MB in ${duration(data.heal_seconds)}`);
  if (data.type === EVENT.migrated && data.steps_lost !== undefined) extra.push(`${data.steps_lost} step${data.steps_lost === 1 ? '' : 's'} lost`);
  return (data.step === undefined ? '' : ` at step ${data.step}`)
    + (extra.length ? ` (${extra.join(', ')})` : '');
}

/** {tag, tone, text} for an event worth a timeline row, or null (metric points, samples). */
export function describe(type, data, context = {}) {
  if (type === STREAM.metric) {
    if (data.kind !== KIND.eval) return null;
    return {
      tag: `${data.split ?? KIND.eval} eval`, tone: 'info',
      text: `accuracy ${percent(data.accuracy)}, F1 ${number(data.f1)}, loss ${number(data.loss)}`
        + (data.epoch ? ` (epoch ${data.epoch})` : ''),
    };
  }
  if (type === STREAM.samples) return null;
  if (type === STREAM.checkpoint) {
    return {
      tag: STREAM.checkpoint, tone: 'info',
      text: `step ${data.step}${data.epoch ? `, epoch ${data.epoch}` : ''}`
        + (data.epoch_end ? ' (end of epoch)' : ''),
    };
  }
  if (type === STREAM.pod) {
    if (data.action === 'kill') return { tag: 'kill', tone: 'bad', text: data.message ?? `pod ${data.ordinal} killed` };
    if (data.action === 'migrate') return { tag: 'migrate', tone: 'info', text: data.message ?? membershipLabel(type, data) };
    if (data.phase === POD_PHASE.Removed) return { tag: 'removed', tone: 'info', text: data.message ?? generic(data) };
    const tone = data.phase === POD_PHASE.Failed ? 'bad' : data.phase === POD_PHASE.Running ? 'good' : 'info';
    return { tag: data.restarts ? 'restart' : STREAM.pod, tone, text: data.message ?? generic(data) };
  }
  if (type === STREAM.job) {
    if (data.type === undefined && data.status !== undefined) {
      const tone = [JOB_STATUS.failed, JOB_STATUS.cancelled, JOB_STATUS.degraded].includes(data.status) ? 'bad'
        : data.status === JOB_STATUS.succeeded ? 'good' : 'info';
      return { tag: data.status, tone, text: data.message ?? '' };
    }
    const tag = data.type ?? STREAM.job;
    if (tag === EVENT.joined && !joinedLate(data)) return null; // every pod at start-up
    let text = data.message ?? generic(data);
    if (tag === EVENT.healed) {
      const extra = [];
      if (data.source && !text.includes(String(data.source))) extra.push(`from ${data.source}`);
      if (data.bytes !== undefined) extra.push(`${number(data.bytes / 1e6, 1)} MB`);
      if (data.seconds !== undefined) extra.push(`in ${duration(data.seconds)}`);
      if (context.afterKill !== undefined) extra.push(`${duration(context.afterKill)} after the kill`);
      if (data.step !== undefined) extra.push(`at step ${data.step}`);
      if (extra.length) text += ` (${extra.join(', ')})`;
    } else if (tag === EVENT.quorum && data.participants !== undefined) {
      text = `${data.participants} participant${data.participants === 1 ? '' : 's'}`
        + (data.step !== undefined ? ` at step ${data.step}` : '')
        + (Array.isArray(data.replica_ids) ? `: ${data.replica_ids.join(', ')}` : '');
    } else if (MEMBERSHIP.includes(tag)) {
      text = membershipLabel(type, data) + membershipDetail(data);
    }
    const tone = BAD.includes(tag) ? 'bad' : GOOD.includes(tag) ? 'good' : 'info';
    return { tag, tone, text };
  }
  if (type === STREAM.log) {
    return { tag: data.level ?? STREAM.log, tone: data.level === 'error' ? 'bad' : 'info', text: data.message ?? '', lines: data.lines };
  }
  return { tag: type, tone: 'info', text: data.message ?? generic(data) };
}

/** The row of an event worth one: `{id, time, data, item}`, the item from describe(). */
function row({ id, time, data, item }) {
  const li = h('li', { dataset: { tag: item.tag, tone: item.tone, event: String(id) } },
    h('time', { datetime: new Date(time * 1000).toISOString() }, clock(time)),
    h('span.tag', {}, item.tag),
    h('span.pod', {}, podLabel(data)),
    h('span.text', {}, item.text));
  if (Array.isArray(item.lines) && item.lines.length) {
    li.append(h('details', {}, h('summary', {}, `${item.lines.length} log lines`),
      h('pre', {}, item.lines.join('\n'))));
  }
  return li;
}

/** The list, newest first, and below it a button that loads the page of events before the
 * oldest one shown; `fetchOlder(before)` answers `{events, before}` (oldest first; the next
 * page's `before`, null when none is older). */
export class Timeline {
  constructor(list, footer, fetchOlder) {
    this.list = list;
    this.limit = MAX_ROWS;
    this.before = null;
    this.loading = false;
    this.fetchOlder = fetchOlder;
    this.button = h('button.small', { type: 'button', hidden: true, on: { click: () => this.showOlder() } },
      'Show older events');
    this.status = h('p.muted', { role: 'status', tabindex: '-1' });
    fill(footer, this.button, this.status);
  }

  /** Older events end before id `before` (null: there are none). */
  olderFrom(before) {
    this.before = before;
    this.button.hidden = before === null;
  }

  /** Rows for one frame's entries (`{id, time, data, item}`), in stream order. */
  add(entries) {
    if (!entries.length) return;
    const rows = entries.map(row).reverse();
    this.list.prepend(...rows);
    // Not while a page of older rows is on its way: they go below the oldest row.
    if (this.loading || this.list.children.length <= this.limit) return;
    while (this.list.children.length > this.limit) this.list.lastElementChild.remove();
    this.olderFrom(Number(this.list.lastElementChild.dataset.event));
  }

  /** The button's work: the page before the oldest row (and the next, while a page shows none). */
  async showOlder() {
    if (this.loading || this.before === null) return;
    this.loading = true;
    this.button.setAttribute('aria-busy', 'true');
    setText(this.status, 'Loading older events…');
    let rows = [];
    try {
      while (!rows.length && this.before !== null) {
        const page = await this.fetchOlder(this.before);
        rows = page.events.map(({ id, type, time, data: fields }) => {
          const data = { time, ...fields };
          return { id, time, data, item: describe(type, data) };
        })
          .filter((entry) => entry.item).map(row).reverse();
        this.before = page.before;
      }
      this.list.append(...rows);
      this.limit += rows.length;
      const none = this.before === null ? ' No older events.' : '';
      setText(this.status, `${rows.length} older event${rows.length === 1 ? '' : 's'} loaded.${none}`);
    } catch (error) {
      setText(this.status, `Could not load older events: ${error.message}`);
    } finally {
      this.loading = false;
      this.button.removeAttribute('aria-busy');
    }
    if (this.before === null) {
      this.button.hidden = true;
      this.status.focus(); // the button it was on is gone
    }
  }
}
