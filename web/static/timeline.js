// The events timeline: what happened to the job, newest first, as plain text.
import { clock, duration, h, number, percent } from './dom.js';

const MAX_ROWS = 400;

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
  if (type === 'pod') return data.action === 'migrate' ? `migrate ${data.ordinal}` : null;
  if (type !== 'job') return null;
  if (data.type === 'scaled') return `scale ${data.from}→${data.to}`;
  if (data.type === 'left') return `${pod} left${data.reason ? ` (${data.reason})` : ''}`;
  if (data.type === 'joined') return `${pod} joined`;
  if (data.type === 'migrated') return `${pod} migrated in ${duration(data.seconds)}`;
  if (data.type === 'migration_failed') return `${pod} not migrated`;
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
    .filter(([key, value]) => !['time', 'kind', 'pod'].includes(key)
      && ['string', 'number', 'boolean'].includes(typeof value))
    .map(([key, value]) => `${key}=${value}`).join(' ');
}

/** What a membership change's timeline row says after its label. */
function membershipDetail(data) {
  if (data.type === 'left') return data.step === undefined ? '' : ` after step ${data.step}`;
  const extra = [];
  if (data.type === 'joined' && data.participants !== undefined) extra.push(`${data.participants} participants`);
  if (data.type === 'joined' && data.heal_bytes) extra.push(`healed ${number(data.heal_bytes / 1e6, 1)} MB in ${duration(data.heal_seconds)}`);
  if (data.type === 'migrated' && data.steps_lost !== undefined) extra.push(`${data.steps_lost} step${data.steps_lost === 1 ? '' : 's'} lost`);
  return (data.step === undefined ? '' : ` at step ${data.step}`)
    + (extra.length ? ` (${extra.join(', ')})` : '');
}

/** {tag, tone, text} for an event worth a timeline row, or null (metric points, samples). */
export function describe(type, data, context = {}) {
  if (type === 'metric') {
    if (data.kind !== 'eval') return null;
    return {
      tag: `${data.split ?? 'eval'} eval`, tone: 'info',
      text: `accuracy ${percent(data.accuracy)}, F1 ${number(data.f1)}, loss ${number(data.loss)}`
        + (data.epoch ? ` (epoch ${data.epoch})` : ''),
    };
  }
  if (type === 'samples') return null;
  if (type === 'checkpoint') {
    return {
      tag: 'checkpoint', tone: 'info',
      text: `step ${data.step}${data.epoch ? `, epoch ${data.epoch}` : ''}`
        + (data.epoch_end ? ' (end of epoch)' : ''),
    };
  }
  if (type === 'pod') {
    if (data.action === 'kill') return { tag: 'kill', tone: 'bad', text: data.message ?? `pod ${data.ordinal} killed` };
    if (data.action === 'migrate') return { tag: 'migrate', tone: 'info', text: data.message ?? membershipLabel(type, data) };
    if (data.phase === 'Removed') return { tag: 'removed', tone: 'info', text: data.message ?? generic(data) };
    const tone = data.phase === 'Failed' ? 'bad' : data.phase === 'Running' ? 'good' : 'info';
    return { tag: data.restarts ? 'restart' : 'pod', tone, text: data.message ?? generic(data) };
  }
  if (type === 'job') {
    if (data.type === undefined && data.status !== undefined) {
      const tone = ['failed', 'cancelled', 'degraded'].includes(data.status) ? 'bad'
        : data.status === 'succeeded' ? 'good' : 'info';
      return { tag: data.status, tone, text: data.message ?? '' };
    }
    const tag = data.type ?? 'job';
    if (tag === 'joined' && !joinedLate(data)) return null; // every pod at start-up
    let text = data.message ?? generic(data);
    if (tag === 'healed') {
      const extra = [];
      if (data.source && !text.includes(String(data.source))) extra.push(`from ${data.source}`);
      if (data.bytes !== undefined) extra.push(`${number(data.bytes / 1e6, 1)} MB`);
      if (data.seconds !== undefined) extra.push(`in ${duration(data.seconds)}`);
      if (context.afterKill !== undefined) extra.push(`${duration(context.afterKill)} after the kill`);
      if (data.step !== undefined) extra.push(`at step ${data.step}`);
      if (extra.length) text += ` (${extra.join(', ')})`;
    } else if (tag === 'quorum' && data.participants !== undefined) {
      text = `${data.participants} participant${data.participants === 1 ? '' : 's'}`
        + (data.step !== undefined ? ` at step ${data.step}` : '')
        + (Array.isArray(data.replica_ids) ? `: ${data.replica_ids.join(', ')}` : '');
    } else if (['scaled', 'left', 'joined', 'migrated'].includes(tag)) {
      text = membershipLabel(type, data) + membershipDetail(data);
    }
    const tone = ['failed', 'sigterm', 'migration_failed'].includes(tag) ? 'bad'
      : ['healed', 'completed', 'resumed', 'joined', 'migrated'].includes(tag) ? 'good' : 'info';
    return { tag, tone, text };
  }
  if (type === 'log') {
    return { tag: data.level ?? 'log', tone: data.level === 'error' ? 'bad' : 'info', text: data.message ?? '', lines: data.lines };
  }
  return { tag: type, tone: 'info', text: data.message ?? generic(data) };
}

export class Timeline {
  constructor(list) {
    this.list = list;
    this.hidden = 0;
  }

  /** Rows for one frame's events, in stream order; shown newest first. */
  add(entries) {
    if (!entries.length) return;
    const fragment = document.createDocumentFragment();
    for (let i = entries.length - 1; i >= 0; i -= 1) {
      const { id, time, data, item } = entries[i];
      const row = h('li', { dataset: { tag: item.tag, tone: item.tone, event: String(id) } },
        h('time', { datetime: new Date(time * 1000).toISOString() }, clock(time)),
        h('span.tag', {}, item.tag),
        h('span.pod', {}, podLabel(data)),
        h('span.text', {}, item.text));
      if (Array.isArray(item.lines) && item.lines.length) {
        row.append(h('details', {}, h('summary', {}, `${item.lines.length} log lines`),
          h('pre', {}, item.lines.join('\n'))));
      }
      fragment.append(row);
    }
    this.list.prepend(fragment);
    while (this.list.children.length > MAX_ROWS) {
      this.list.lastElementChild.remove();
      this.hidden += 1;
    }
  }
}
